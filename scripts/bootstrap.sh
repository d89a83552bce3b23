#!/usr/bin/env bash
# Installs what a command needs, and fails saying what to install when it cannot:
#   scripts/bootstrap.sh python   the .venv with the project and its dev extras
#   scripts/bootstrap.sh dev      that, and the Go toolchain the local stack is built with
#                                 (`llog dev` builds Oxia and MinIO, and Caddy only for
#                                 --brokers N, on first use)
#   scripts/bootstrap.sh test     everything the whole suite runs: Java for Spark, HAProxy
#                                 and nginx for the load-balancer tests, every Go-built
#                                 server and tool (kustomize and the load generator too),
#                                 the client generators and Node.js for the
#                                 generated-client tests, Chromium for the console's
#                                 browser tests (the default)
# Each step is a no-op when it is done already (the venv is stamped by the hash of
# pyproject.toml and the client's, clients/python/pyproject.toml and setup.py; binaries are cached by
# the hash of their pinned modules).
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-test}
case "$want" in python|dev|test) ;; *) echo "usage: $0 [python|dev|test]" >&2; exit 2 ;; esac

fail() { echo "bootstrap: $*" >&2; exit 1; }
step() { echo "bootstrap: $*" >&2; }

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || fail "needs Python 3.11+ ($PYTHON is not on PATH)"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  fail "needs Python 3.11 or newer ($PYTHON is $("$PYTHON" --version 2>&1))"
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || \
    fail "$PYTHON cannot create a virtual environment: install its venv module (Debian/Ubuntu: apt-get install python3-venv)"
  step "creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.llog-installed
hash=$(cat pyproject.toml clients/python/pyproject.toml clients/python/setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
  # uv installs the ~140 packages in seconds where pip takes most of a minute, and pip
  # stays in the venv for whoever adds an extra by hand (`.venv/bin/pip install ...`).
  step "installing uv into .venv (pip), then the project, its client (clients/python) and its dev extras (uv)"
  .venv/bin/python -m pip install --quiet "uv>=0.13,<0.14"
  # pyspark is published only as a source distribution. uv rebuilds it (20 s) whenever
  # the index answers a revalidation as modified, so pip (whose wheel cache is keyed by
  # the file's address) puts its wheel in a directory of our own, offered to uv.
  wheels=${XDG_CACHE_HOME:-$HOME/.cache}/llog/wheels
  mkdir -p "$wheels"
  pyspark=$(.venv/bin/python - <<'PY'
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(next(r for r in extras["spark"] if r.startswith("pyspark")))
PY
)
  # From pip's own wheel cache after the first time: about a second.
  .venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir "$wheels" "$pyspark"
  # One command: the broker depends on llog-client, found here rather than on an index.
  # Compiled to bytecode now, as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing
  # would ever be cached, and every broker, CLI and Spark worker the suite starts would
  # compile its imports again (a second of CPU each).
  .venv/bin/uv pip install --quiet --python .venv/bin/python --find-links "$wheels" \
    --compile-bytecode -e clients/python -e ".[dev,spark]"
  # In a venv installed before the client was a distribution of its own, the old
  # broker's llog script was removed after llog-client wrote its own there: write it again.
  [ -x .venv/bin/llog ] || \
    .venv/bin/uv pip install --quiet --python .venv/bin/python --reinstall --no-deps \
      -e clients/python
  echo "$hash" > "$stamp"
fi
# The client's per-record modules are compiled to C in place by its editable install
# (clients/python/setup.py), and Python imports a compiled module before its source: one
# older than an edit of its source is built again, or the edit would not run.
# (Read from its file, not imported: the package imports the compiled modules.)
compiled=clients/python/src/llog_client/_compiled.py
if [ "${LLOG_CLIENT_COMPILE:-1}" != 0 ] && [ -f "$compiled" ] && [ -n "$(.venv/bin/python -c \
    "import runpy; print(*runpy.run_path('$compiled')['stale']())")" ]; then
  step "building the client's compiled modules again (their source changed)"
  .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps \
    --reinstall-package llog-client -e clients/python
elif [ "${LLOG_CLIENT_COMPILE:-1}" = 0 ]; then  # asked for interpreted: none left over
  rm -f clients/python/src/llog_client/*.so clients/python/src/llog_client__mypyc*.so
fi
# The project's own modules too (editable: never compiled by an install). Python checks
# each against its source, so an edit is never run stale; this only saves compiling.
.venv/bin/python -m compileall -q -j 0 app jobs clients/python/src >/dev/null || true
[ "$want" = python ] && exit 0

command -v go >/dev/null 2>&1 || \
  fail "the Go toolchain builds Oxia, MinIO and Caddy from their pinned modules: install Go 1.26+ (https://go.dev/dl/) and retry"
[ "$want" = dev ] && exit 0

# --- the whole suite: system packages --------------------------------------------------
# Daemons live in sbin, which a non-root PATH often leaves out (LLOG_SBIN_DIRS: where).
has() {
  command -v "$1" >/dev/null 2>&1 && return 0
  local dir
  for dir in ${LLOG_SBIN_DIRS-/usr/sbin /sbin}; do [ -x "$dir/$1" ] && return 0; done
  return 1
}
java_ok() {
  has java || return 1
  local major
  major=$(java -version 2>&1 | sed -nE '1s/.*version "([0-9]+).*/\1/p')
  [ -n "$major" ] && [ "$major" -ge 17 ]
}
# The console's browser tests drive Chromium (Playwright, never its own download): Debian's
# package, /usr/bin/chromium, or the binary LLOG_CHROMIUM names (then nothing is installed).
if [ -n "${LLOG_CHROMIUM:-}" ] && [ ! -x "$LLOG_CHROMIUM" ]; then
  fail "LLOG_CHROMIUM=$LLOG_CHROMIUM is not an executable: point it at a Chromium binary, or unset it to use Debian's (apt-get install chromium)"
fi
chromium_ok() { [ -n "${LLOG_CHROMIUM:-}" ] || has chromium; }
missing=()
java_ok || missing+=(default-jre-headless)   # the Spark jobs: Java 17+
has haproxy || missing+=(haproxy)            # the reference load-balancer configurations
has nginx || missing+=(nginx)
has node || missing+=(nodejs)                # a generated TypeScript client runs on it
has npm || missing+=(npm)                    # and is compiled by TypeScript from npm
chromium_ok || missing+=(chromium)           # the console's browser tests
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && sudo=(sudo -n); }
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
    step "installing ${missing[*]} (apt-get)"
    "${sudo[@]}" apt-get update -qq || \
      fail "apt-get update failed, so ${missing[*]} cannot be installed: fix the package sources (or the network) and retry, or install them by hand"
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || \
      fail "apt-get install ${missing[*]} failed: install them by hand and retry"
  fi
  java_ok || fail "the Spark tests need Java 17+ on PATH: install a JRE (Debian/Ubuntu: apt-get install default-jre-headless) and retry"
  has haproxy || fail "the load-balancer tests need HAProxy: install it (Debian/Ubuntu: apt-get install haproxy) and retry"
  has nginx || fail "the load-balancer tests need nginx: install it (Debian/Ubuntu: apt-get install nginx) and retry"
  { has node && has npm; } || fail "the generated-client tests need Node.js 18+ and npm: install them (Debian/Ubuntu: apt-get install nodejs npm) and retry"
  chromium_ok || fail "the console's browser tests need Chromium: install it (Debian: apt-get install chromium) and retry, or set LLOG_CHROMIUM to a Chromium binary"
fi

# --- the whole suite: what it builds and fetches, cached under .llog/bin ---------------
# Every Go-built server and tool (Oxia, MinIO, Caddy, promtool, oapi-codegen, kustomize,
# the load generator) one build after another, and beside them the client generators'
# downloads (openapi-generator from Maven Central, TypeScript from npm), pinned.
.venv/bin/python -m tests.helpers.prebuild >&2 || \
  fail "building or fetching the tests' servers and tools failed (see above): check the network to the Go module proxy, Maven Central and npm, and retry"
