# leaderless-log broker image.
#
# Build from the repository root:   docker build -t leaderless-log .
# All configuration comes from LLOG_* environment variables (see app/settings.py);
# the image contains no configuration files.

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Build and install the package from a source directory that is not on the
# runtime import path.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY clients/python/ ./clients/python/
COPY app/ ./app/
COPY jobs/ ./jobs/
# One command: the broker depends on llog-client (the llog command), built from the tree.
# Its producer's modules stay interpreted here (LLOG_CLIENT_COMPILE=0: the image has no C
# compiler; the broker does not produce through them, and `llog produce` in the image
# works the same, with more CPU per record: docs/client.md, The compiled core).
RUN LLOG_CLIENT_COMPILE=0 pip install ./clients/python . \
    && rm -rf /src/build /src/*.egg-info /src/clients/python/build /src/clients/python/src/*.egg-info

RUN groupadd --system --gid 10001 llog \
    && useradd --system --uid 10001 --gid llog --home-dir /home/llog --create-home \
       --shell /usr/sbin/nologin llog

USER llog
WORKDIR /home/llog

# Access control is on: the container listens on every address. Mount the auth file
# (principals, API key hashes, rights: docs/operations.md, Security) at this path, for
# example from a Kubernetes Secret; the broker does not start without it. A deployment
# that is open on purpose (a private development network) sets LLOG_AUTH=off.
ENV LLOG_AUTH=on \
    LLOG_AUTH_FILE=/etc/llog/auth/auth.toml

EXPOSE 8080

# Ready, not merely alive: /health/ready answers 503 while the broker starts or drains.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health/ready', timeout=3)"]

CMD ["llog", "serve", "--host", "0.0.0.0", "--port", "8080"]
