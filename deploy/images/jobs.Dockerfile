# The Spark jobs image: the broker image's package with the `spark` extra (pyspark,
# pyarrow, deltalake, pyiceberg) and a Java 17 runtime, for `llog spark audit|vacuum|backfill|export` in local
# mode (the audit CronJob of deploy/k8s/). Runs as the same non-root user as the broker.
#
# Build from the repository root:
#   docker build -f deploy/images/jobs.Dockerfile -t leaderless-log-jobs .

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Spark 4 needs Java 17 or 21 (docs/spark-jobs.md, Installing).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY clients/python/ ./clients/python/
COPY app/ ./app/
COPY jobs/ ./jobs/
# One command: the broker depends on llog-client (the llog command), built from the tree.
RUN pip install ./clients/python ".[spark]" \
    && rm -rf /src/build /src/*.egg-info /src/clients/python/build /src/clients/python/src/*.egg-info

RUN groupadd --system --gid 10001 llog \
    && useradd --system --uid 10001 --gid llog --home-dir /home/llog --create-home \
       --shell /usr/sbin/nologin llog

USER llog
WORKDIR /home/llog

# A batch image: each run is judged by its exit code (0 clean, 1 findings, 2 could not
# run), not by a health check.
HEALTHCHECK NONE

CMD ["llog", "spark", "--help"]
