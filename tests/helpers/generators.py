"""The client generators the generated-client tests run, each pinned, fetched once and
cached beside the built servers (``.llog/bin``, or ``LLOG_BIN_CACHE_DIR``):

- openapi-generator, the jar from Maven Central, checked against its SHA-256;
- the TypeScript compiler, from npm by ``tests/generated/typescript/package-lock.json``;
- oapi-codegen, built from its pinned Go module like the servers
  (``deploy/servers/oapi-codegen``, ``llog servers build``).

``scripts/bootstrap.sh test`` fetches them (``python -m tests.helpers.generators``); a
test that finds one missing fetches it, and fails, never skips, when it cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from app.localstack.binaries import OAPI_CODEGEN, REPO_ROOT, cache_dir, ensure_binary

OPENAPI_GENERATOR_VERSION = "7.25.0"
OPENAPI_GENERATOR_SHA256 = "41ce4f6b07f196676439d710759fa1ced7a08066d06ff1bf314681470289efae"
OPENAPI_GENERATOR_URL = (
    "https://repo1.maven.org/maven2/org/openapitools/openapi-generator-cli/"
    f"{OPENAPI_GENERATOR_VERSION}/openapi-generator-cli-{OPENAPI_GENERATOR_VERSION}.jar")
CHECKS = REPO_ROOT / "tests" / "generated"
TYPESCRIPT = CHECKS / "typescript"
GO = CHECKS / "go"
DOWNLOAD_TIMEOUT_S = 300


class ToolError(RuntimeError):
    """A generator or its toolchain is missing and could not be fetched."""


def need(command: str, why: str) -> str:
    found = shutil.which(command)
    if found is None:
        raise ToolError(f"`{command}` is not on PATH; {why}")
    return found


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def openapi_generator_jar() -> Path:
    """The pinned openapi-generator-cli jar, downloaded and checked on first use."""
    target = cache_dir() / f"openapi-generator-cli-{OPENAPI_GENERATOR_VERSION}.jar"
    if target.exists():
        return target
    with _locked("openapi-generator"):
        if target.exists():
            return target
        tmp = target.with_name(target.name + ".tmp")
        try:
            with urllib.request.urlopen(OPENAPI_GENERATOR_URL,
                                        timeout=DOWNLOAD_TIMEOUT_S) as answer, \
                    tmp.open("wb") as out:
                shutil.copyfileobj(answer, out)
        except OSError as exc:
            raise ToolError(f"cannot download {OPENAPI_GENERATOR_URL}: {exc}") from exc
        digest = _sha256(tmp)
        if digest != OPENAPI_GENERATOR_SHA256:
            tmp.unlink()
            raise ToolError(f"{OPENAPI_GENERATOR_URL} has SHA-256 {digest}, not the pinned "
                            f"{OPENAPI_GENERATOR_SHA256}")
        os.replace(tmp, target)
    return target


def openapi_generator(generator: str, document: Path, output: Path) -> str:
    """``openapi-generator generate`` with the generator's default options; its log."""
    java = need("java", "openapi-generator runs on Java 11+ (scripts/bootstrap.sh test)")
    done = subprocess.run(
        # A short run: the client compiler alone and one GC thread start and finish it
        # on less CPU than the JVM's defaults (as the tests' Spark JVM).
        [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-jar",
         str(openapi_generator_jar()), "generate", "-g", generator,
         "-i", str(document), "-o", str(output)],
        capture_output=True, text=True, timeout=300, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"openapi-generator -g {generator} failed:\n{log[-5000:]}")
    return log


def typescript_compiler() -> Path:
    """``tsc`` of the pinned TypeScript (npm ci into the cache, keyed by the lock file)."""
    lock = (TYPESCRIPT / "package-lock.json").read_bytes()
    digest = hashlib.sha256((TYPESCRIPT / "package.json").read_bytes() + lock).hexdigest()
    home = cache_dir() / f"typescript-{digest[:12]}"
    tsc = home / "node_modules" / "typescript" / "bin" / "tsc"
    if tsc.exists():
        return tsc
    npm = need("npm", "the TypeScript compiler comes from npm (Node.js 18+)")
    with _locked("typescript"):
        if tsc.exists():
            return tsc
        tmp = home.with_name(home.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(TYPESCRIPT / name, tmp / name)
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                              cwd=tmp, capture_output=True, text=True, timeout=300,
                              check=False)
        if done.returncode != 0:
            raise ToolError(f"npm ci of {TYPESCRIPT / 'package-lock.json'} failed:\n"
                            f"{(done.stdout + done.stderr)[-3000:]}")
        shutil.rmtree(home, ignore_errors=True)
        os.replace(tmp, home)
    return tsc


def oapi_codegen() -> Path:
    return ensure_binary(OAPI_CODEGEN)


def main() -> None:
    """Fetch every generator now (``scripts/bootstrap.sh test``)."""
    print(f"openapi-generator {OPENAPI_GENERATOR_VERSION}: {openapi_generator_jar()}")
    print(f"tsc: {typescript_compiler()}")
    print(f"oapi-codegen: {oapi_codegen()}")


if __name__ == "__main__":
    main()
