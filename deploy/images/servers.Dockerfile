# syntax=docker/dockerfile:1
#
# Oxia and MinIO, built from the modules pinned in deploy/servers/ by `llog servers build`
# itself (so the image gets the same binaries as `llog dev` and the tests, with the Oxia
# source fix app/localstack/binaries.py applies), then copied into slim runtime images
# that run as a non-root user.
#
# Build from the repository root:
#   docker build -f deploy/images/servers.Dockerfile --target oxia  -t llog-oxia  .
#   docker build -f deploy/images/servers.Dockerfile --target minio -t llog-minio .

ARG GO_IMAGE=golang:1.26-bookworm
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${GO_IMAGE} AS go

# -- build: Python (to run llog) plus the Go toolchain ----------------------------------
FROM ${PYTHON_IMAGE} AS build
COPY --from=go /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LLOG_BIN_CACHE_DIR=/build/bin
WORKDIR /src
COPY pyproject.toml README.md ./
COPY clients/python/ ./clients/python/
COPY app/ ./app/
COPY jobs/ ./jobs/
# Editable, so that llog finds deploy/servers/ beside its app package; the broker depends
# on llog-client (the llog command), installed from the tree in the same command.
RUN pip install -e clients/python -e .
COPY deploy/servers/ ./deploy/servers/
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    llog servers build \
    && mkdir -p /dist \
    && cp /build/bin/oxia-* /dist/oxia \
    && cp /build/bin/minio-* /dist/minio

# -- runtime: the binaries alone (static Go builds), a non-root user, /data -------------
# Python stays in the image for the health checks (and shares its base layers with the
# broker image).
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 llog \
    && useradd --system --uid 10001 --gid llog --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin llog \
    && mkdir -p /data && chown llog:llog /data
USER llog
WORKDIR /data
VOLUME /data

FROM runtime AS oxia
COPY --from=build /dist/oxia /usr/local/bin/oxia
EXPOSE 6648 8080
# The metrics listener (8080) starts after the RPC server (6648).
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=20 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/metrics', timeout=2)"]
ENTRYPOINT ["oxia"]
CMD ["standalone", "--data-dir", "/data/db", "--wal-dir", "/data/wal", "--shards", "1"]

FROM runtime AS minio
COPY --from=build /dist/minio /usr/local/bin/minio
ENV MINIO_UPDATE=off
EXPOSE 9000 9001
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=20 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9000/minio/health/live', timeout=2)"]
ENTRYPOINT ["minio"]
CMD ["server", "/data", "--console-address", ":9001"]
