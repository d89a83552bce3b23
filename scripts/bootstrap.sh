#!/usr/bin/env bash
# Creates .venv and installs the project with its dev extras; a no-op when nothing
# changed since the last install (stamped by the hash of pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "leaderless-log needs Python 3.11 or newer ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if ! command -v go >/dev/null 2>&1; then
  echo "the Go toolchain is needed to build Oxia, MinIO and Caddy: install Go 1.26+ and retry" >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  # Spark jobs need a JVM (17+). Install Debian's when we can; otherwise say what to do.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing a Java runtime for the Spark jobs (apt-get)" >&2
    apt-get update -qq && apt-get install -y -qq default-jre-headless >/dev/null
  else
    echo "the Spark jobs need Java 17+ on PATH: install a JRE (e.g. default-jre-headless)" >&2
    exit 1
  fi
fi
# HAProxy and nginx: the load-balancer tests run the reference configurations through
# them where they can be installed (skipped with a reason otherwise; Caddy always runs).
if { ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; } || \
   { ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing HAProxy and nginx for the load-balancer tests (apt-get)" >&2
    { apt-get update -qq && apt-get install -y -qq haproxy nginx >/dev/null; } || \
      echo "could not install HAProxy/nginx: their load-balancer tests will be skipped" >&2
  fi
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.llog-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev,spark]"
  echo "$want" > "$stamp"
fi
# Build (or find cached) Oxia and MinIO binaries under .llog/bin.
.venv/bin/llog servers build
