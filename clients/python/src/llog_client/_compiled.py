"""Which of the client's modules run compiled to C (clients/python/setup.py; docs/client.md,
The compiled core), and, in a source checkout, which compiled ones are older than their
source: Python imports a compiled module before the ``.py`` beside it, so an edit to
the source would otherwise not run until the next build."""

from __future__ import annotations

import importlib
import importlib.machinery
from pathlib import Path

# The modules setup.py compiles (its COMPILED, as module names).
MODULES = ("llog_client._accumulator", "llog_client._codec", "llog_client._producer_core")

_HERE = Path(__file__).resolve().parent


def compiled() -> bool:
    """Whether the producer's per-record modules run compiled (the build's choice:
    without a C compiler, or with ``LLOG_CLIENT_COMPILE=0``, they run interpreted)."""
    return all(_is_extension(importlib.import_module(name).__file__) for name in MODULES)


def stale(package: Path = _HERE) -> list[str]:
    """The compiled modules in ``package`` (this one) older than their ``.py`` (only a
    source checkout edits them): their edits do not run until they are built again."""
    out = []
    for name in MODULES:
        stem = name.rsplit(".", 1)[1]
        source = package / f"{stem}.py"
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            built = package / f"{stem}{suffix}"
            if built.exists() and source.exists() and \
                    built.stat().st_mtime < source.stat().st_mtime:
                out.append(name)
    return out


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
