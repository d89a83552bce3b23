"""Everything the whole suite builds or downloads, made ahead of the run
(``scripts/bootstrap.sh test``), so that no test spends its time on a Go build:

- the servers and tools of ``llog servers build`` (Oxia, MinIO, Caddy, promtool,
  oapi-codegen), then kustomize and the load generator, one Go build after another (each
  uses every core);
- beside them, the client generators' downloads (openapi-generator's jar and TypeScript,
  network-bound), which a Go build does not slow.

Each is cached under ``.llog/bin`` (or ``LLOG_BIN_CACHE_DIR``) and found at once later; a
test that finds one missing still builds or fetches it, and fails, never skips, when it
cannot. A server or tool built (first run only) says so in a line; exits non-zero naming
what failed.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from app.loadtest.hammer import build_hammer
from app.localstack import binaries
from tests.helpers import generators
from tests.helpers.kustomize import ensure_kustomize


def _go_builds() -> list[tuple[str, Callable[[], Path]]]:
    builds: list[tuple[str, Callable[[], Path]]] = [
        (m.name, functools.partial(binaries.ensure_binary, m))
        for m in (*binaries.SERVERS, *binaries.TOOLS)]
    return [*builds, ("kustomize", ensure_kustomize), ("hammer", build_hammer)]


def _downloads() -> list[tuple[str, Callable[[], Path]]]:
    return [("openapi-generator", generators.openapi_generator_jar),
            ("tsc", generators.typescript_compiler)]


def _run_all(steps: list[tuple[str, Callable[[], Path]]], failures: list[str]) -> None:
    for name, make in steps:
        try:
            make()
        except Exception as exc:  # every failure is reported, and the rest still built
            failures.append(f"{name}: {exc}")


def main() -> int:
    failures: list[str] = []
    downloads = threading.Thread(target=_run_all, args=(_downloads(), failures),
                                 name="downloads")
    downloads.start()
    _run_all(_go_builds(), failures)
    downloads.join()
    for failure in failures:
        print(f"prebuild: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
