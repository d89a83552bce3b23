"""The producer's per-record path compiled to C with mypyc (docs/client.md, The compiled
core); everything else is in pyproject.toml.

``send``, a future's ``add_done_callback`` and the accumulator run once per record on
the program's thread, where interpreted Python costs most of the client's CPU; the same
modules compiled take about a fifth less per record (docs/performance.md). They stay
plain Python too: without a C compiler, or with ``LLOG_CLIENT_COMPILE=0``, the build
leaves them interpreted, which behaves the same, more slowly
(``llog_client.compiled()`` says which runs).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup

# Modules of plain computation only, none running threads or an event loop of its own.
# Compiled, they call their own functions and each other's directly, past any patch of
# them (a test's patch reaches only interpreted callers), and check the types their
# annotations name: what a user's call passes in is typed Any and checked by hand
# (_producer_core.py).
COMPILED = [
    "src/llog_client/_accumulator.py",
    "src/llog_client/_codec.py",
    "src/llog_client/_producer_core.py",
]


def compiled_modules() -> list[Extension]:
    if os.environ.get("LLOG_CLIENT_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # a build without its build requirements: plain Python
        print("llog-client: mypyc is not installed; the modules stay interpreted",
              file=sys.stderr)
        return []
    # The httpx and anyio this build may lack are typed Any: the compiled code calls
    # them as Python does.
    extensions = mypycify(["--config-file=", "--ignore-missing-imports", *COMPILED],
                          group_name="llog_client", opt_level="3")
    for extension in extensions:
        extension.optional = True  # no C compiler: installed interpreted, not failed
    return extensions


setup(ext_modules=compiled_modules())
