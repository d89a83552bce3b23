"""Builds Oxia, MinIO and Caddy (and promtool, which checks the alert rules, and
oapi-codegen, which the generated-client tests run) from their pinned Go modules and
caches the binaries.

Each server has a tiny Go module of ours under ``deploy/servers/<name>/`` whose ``go.mod``
and ``go.sum`` pin the upstream release. The binary is cached as
``<cache>/<name>-<digest of go.mod+go.sum>`` so a later run starts at once and a version
bump rebuilds. Builds are serialised with a file lock so parallel test runs or two
``llog dev`` invocations never race on the same output.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVERS_DIR = REPO_ROOT / "deploy" / "servers"
DEFAULT_CACHE_DIR = REPO_ROOT / ".llog" / "bin"


class BuildError(RuntimeError):
    """A server binary could not be built; the message says what failed and how to retry."""


@dataclass(frozen=True)
class ServerModule:
    name: str
    main_package: str
    upstream_module: str
    # A build-time source fix, applied to a scratch copy of the upstream module.
    patch: Callable[[Path], None] | None = None
    patch_version: str = ""

    @property
    def module_dir(self) -> Path:
        return SERVERS_DIR / self.name


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise BuildError(f"cannot apply the Oxia build fix ({what}): the source differs from "
                         "the pinned release; update app/localstack/binaries.py")
    return text.replace(old, new)


def _oxia_serialised_wal_append(src: Path) -> None:
    """Oxia v0.14.0 assigns a WAL offset under the leader's lock but appends after
    releasing it, so two concurrent writes to one shard can reach the WAL out of order
    and wedge the shard ("N can not immediately follow M"). Upstream fixed this in
    v0.14.2 by holding the lock until the append is queued; the Go module proxy here
    serves v0.14.0 only, so the same fix is applied at build time through an overlay
    (to a scratch copy: the module cache itself is never modified)."""
    path = src / "server" / "leader_controller.go"
    text = path.read_text()
    text = _replace_once(
        text, "\tterm := lc.term\n\tlc.Unlock()\n", "\tterm := lc.term\n", "keep the lock"
    )
    text = _replace_once(
        text,
        "\tvalue, err := logEntryValue.MarshalVT()\n\tif err != nil {\n",
        "\tvalue, err := logEntryValue.MarshalVT()\n\tif err != nil {\n\t\tlc.Unlock()\n",
        "unlock on marshal error",
    )
    text = _replace_once(
        text,
        "\t})\n}\n\n//nolint:revive\nfunc (lc *leaderController) GetNotifications(",
        "\t})\n\tlc.Unlock()\n}\n\n//nolint:revive\n"
        "func (lc *leaderController) GetNotifications(",
        "unlock after the append is queued",
    )
    path.write_text(text)


OXIA = ServerModule(
    "oxia", "github.com/oxia-db/oxia/cmd", "github.com/oxia-db/oxia",
    patch=_oxia_serialised_wal_append, patch_version="serialised-wal-append-1",
)
MINIO = ServerModule("minio", "github.com/minio/minio", "github.com/minio/minio")
# The load balancer of `llog dev --brokers N` and the load-balancer tests: built like the
# servers, so a fresh machine needs no root (no OS package) to run it.
CADDY = ServerModule("caddy", "github.com/caddyserver/caddy/v2/cmd/caddy",
                     "github.com/caddyserver/caddy/v2")
SERVERS = (OXIA, MINIO, CADDY)
# What a local stack runs (Caddy only in front of several brokers, built when asked for).
STACK = (OXIA, MINIO)
# Prometheus's rule checker, for the tests of deploy/prometheus/alerts.yml.
PROMTOOL = ServerModule("promtool", "github.com/prometheus/prometheus/cmd/promtool",
                        "github.com/prometheus/prometheus")
# The Go client generator whose output the generated-client tests compile and run.
OAPI_CODEGEN = ServerModule("oapi-codegen",
                            "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen",
                            "github.com/oapi-codegen/oapi-codegen/v2")
TOOLS = (PROMTOOL, OAPI_CODEGEN)


def cache_dir() -> Path:
    override = os.environ.get("LLOG_BIN_CACHE_DIR")
    return Path(override) if override else DEFAULT_CACHE_DIR


def _digest(module: ServerModule) -> str:
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((module.module_dir / name).read_bytes())
    h.update(module.patch_version.encode())
    return h.hexdigest()[:12]


def binary_path(module: ServerModule) -> Path:
    return cache_dir() / f"{module.name}-{_digest(module)}"


def ensure_binary(module: ServerModule, *, log: bool = True) -> Path:
    """Return the cached binary for ``module``, building it first if needed."""
    target = binary_path(module)
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"cannot build {module.name}: the Go toolchain ('go') is not on PATH. "
            "Install Go 1.24 or newer, then rerun (or run `llog servers build`)."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{module.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # built by whoever held the lock before us
            return target
        if log:
            print(f"llog: building {module.name} from {module.module_dir / 'go.mod'} "
                  f"(first run only; a few minutes) -> {target}", flush=True)
        started = time.monotonic()
        tmp = target.with_name(target.name + ".tmp")
        env = dict(os.environ)
        # -mod=mod lets our one-line go.mod resolve the release's own requirements,
        # checked against the committed go.sum.
        env["GOFLAGS"] = "-mod=mod -buildvcs=false"
        env.setdefault("CGO_ENABLED", "0")
        build_dir = module.module_dir
        if module.patch is not None:
            build_dir = _patched_build_dir(go, module, env, target.parent)
        _go([go, "build", "-trimpath", "-o", str(tmp), module.main_package],
            module, env, build_dir)
        os.replace(tmp, target)
        if log:
            print(f"llog: built {module.name} in {time.monotonic() - started:.0f} s", flush=True)
    return target


def _go(argv: list[str], module: ServerModule, env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise BuildError(
            f"building {module.name} ({module.main_package}) failed: `{' '.join(argv[:3])}` "
            f"exited with {proc.returncode}:\n{tail}\n"
            f"Retry with `llog servers build`; the Go module cache is reused, so a "
            f"network hiccup only costs the missing downloads."
        )
    return proc.stdout


def _patched_build_dir(go: str, module: ServerModule, env: dict[str, str], base: Path) -> Path:
    """A build module whose go.mod is ours plus a replace onto a patched source copy."""
    assert module.patch is not None
    upstream = module.upstream_module
    _go([go, "mod", "download", upstream], module, env, module.module_dir)
    src = Path(_go([go, "list", "-m", "-f", "{{.Dir}}", upstream], module, env,
                   module.module_dir).strip())
    scratch = base / f".{module.name}-build"
    shutil.rmtree(scratch, ignore_errors=True)
    patched = scratch / "src"
    shutil.copytree(src, patched, copy_function=shutil.copyfile)  # drop read-only modes
    module.patch(patched)
    build = scratch / "build"
    build.mkdir()
    shutil.copyfile(module.module_dir / "go.sum", build / "go.sum")
    go_mod = (module.module_dir / "go.mod").read_text()
    (build / "go.mod").write_text(f"{go_mod}\nreplace {upstream} => {patched}\n")
    return build


def ensure_all(*, log: bool = True, tools: bool = False) -> dict[str, Path]:
    """The servers' binaries, and with ``tools`` promtool's too (``llog servers build``)."""
    return ensure((*SERVERS, *(TOOLS if tools else ())), log=log)


def ensure(modules: tuple[ServerModule, ...], *, log: bool = True) -> dict[str, Path]:
    """The binaries of ``modules``, building the missing ones one after the other."""
    return {m.name: ensure_binary(m, log=log) for m in modules}


def by_name(names: list[str]) -> tuple[ServerModule, ...]:
    """The modules called ``names`` (every server and tool when empty)."""
    known = {m.name: m for m in (*SERVERS, *TOOLS)}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise BuildError(f"no such server or tool: {', '.join(unknown)} "
                         f"(known: {', '.join(known)})")
    return tuple(known[n] for n in names) if names else tuple(known.values())


def main() -> int:
    """``python3 -m app.localstack.binaries``: build every server and tool, as ``llog
    servers build`` does. This module needs nothing but the standard library, so CI starts
    the builds (minutes on a fresh clone) before the virtual environment exists."""
    try:
        ensure(by_name([]))
    except BuildError as exc:
        print(f"llog servers build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
