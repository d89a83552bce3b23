"""Which tests need servers, which are slow, and which skips a run may contain.

Tests are sorted by what they use, not by hand: a test whose fixtures (however deep)
include the session ``stack``, or a fixture marked with :func:`starts_servers`, gets
the ``stack`` mark; a fixture marked ``slow`` (clusters, Spark, proxies) makes every
test that uses it ``slow``. ``scripts/test`` leaves the slow tests out;
``scripts/test --all`` (what CI runs) runs everything.

A skipped test is a feature nobody checked, so a run fails when a test skips, or a
module skips as it is collected, for a reason that is not in :data:`ALLOWED_SKIPS`
(the gate: :mod:`tests.helpers.gate`).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., Any])

_SERVERS = "_llog_starts_servers"
_SLOW = "_llog_slow"
_GROUP = "_llog_group"
# The pytest-xdist group of the tests whose fixtures run servers of their own and fail them.
OWN_SERVERS_GROUP = "own-servers"
SPARK_GROUP = "spark"

# The session's real Oxia and MinIO: any test that reaches it is a stack test.
STACK_FIXTURE = "stack"

# The modules CI runs a second time on clustered servers (an Oxia cluster of three data
# servers with replication factor 3, MinIO erasure coded over four drives): every step of
# the protocol (appends, commits, reads, compaction, groups, topics, the HTTP surface).
TOPOLOGY_MODULES = frozenset({
    "test_binary_api.py", "test_broker_http.py", "test_claims.py", "test_client.py",
    "test_compaction.py", "test_engine.py", "test_groups.py", "test_offsets.py",
    "test_oxia_group_commit.py", "test_routes.py", "test_topics.py", "test_writer_safety.py",
})

# Skips a green run may contain, each with why it is acceptable. Everything else fails the
# run: CI installs what every test needs (scripts/bootstrap.sh), so a skip there means a
# feature went unchecked.
ALLOWED_SKIPS: tuple[tuple[str, str], ...] = ()


def starts_servers(*, slow: bool = False, group: str = OWN_SERVERS_GROUP
                   ) -> Callable[[F], F]:
    """Mark a fixture that starts real servers of its own (and, with ``slow``, one whose
    tests belong to the slow set: clusters, Spark, proxies); ``group`` is the
    pytest-xdist group its tests run in, one at a time. Put it under ``@pytest.fixture``."""
    def mark(func: F) -> F:
        setattr(func, _SERVERS, True)
        setattr(func, _GROUP, group)
        if slow:
            setattr(func, _SLOW, True)
        return func
    return mark


def slow_fixture(func: F) -> F:
    """Mark a fixture whose tests are slow though it starts no servers (Spark)."""
    setattr(func, _SLOW, True)
    return func


def _flag(fixturedefs: Any, flag: str) -> bool:
    return any(getattr(inspect.unwrap(d.func), flag, False) for d in fixturedefs or ())


def mark_by_fixture(items: list[pytest.Item]) -> None:
    """Add ``stack`` and ``slow`` marks from each test's fixture closure."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        names = info.names_closure
        defs = info.name2fixturedefs
        own = any(_flag(defs.get(n), _SERVERS) for n in names)
        if own:
            item.add_marker(pytest.mark.own_servers)
        # A module that starts servers itself (`llog dev`, a load test) says own_servers.
        if own or STACK_FIXTURE in names or item.get_closest_marker("own_servers"):
            item.add_marker(pytest.mark.stack)
        # A Spark test is slow whether its JVM comes from the fixture or from a job it runs.
        if any(_flag(defs.get(n), _SLOW) for n in names) or item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.slow)
        if item.path.name in TOPOLOGY_MODULES:
            item.add_marker(pytest.mark.topology)
        group = _group(item, [d for n in names for d in defs.get(n, ())])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _group(item: pytest.Item, fixturedefs: list[Any]) -> str | None:
    """Which tests one pytest-xdist process runs together (``--dist loadgroup``; None:
    any process). The tests whose fixtures run servers of their own and fail them share
    one process (so do the tests marked ``own_servers`` by their module), so only one
    cluster at a time competes with the others for the machine;
    the Spark tests share one process and its JVM; a module's tests that share a
    module-scoped fixture (a broker, a proxy, a stack) stay together, so it starts once;
    the rest spread one by one."""
    for d in fixturedefs:
        group = getattr(inspect.unwrap(d.func), _GROUP, None)
        if group is not None:
            return str(group)
    # A module that starts servers itself says so with `pytestmark`, not with a fixture.
    if item.get_closest_marker("own_servers") is not None:
        return OWN_SERVERS_GROUP
    if "spark" in getattr(item, "fixturenames", ()) or item.get_closest_marker("spark"):
        return SPARK_GROUP  # one JVM for all of them, not one per process
    if any(d.scope in ("module", "class") for d in fixturedefs):
        return item.nodeid.split("::", 1)[0]
    return None


def heavy_groups_first(items: list[pytest.Item]) -> None:
    """The two long groups first: pytest-xdist hands groups out in collection order, so
    each starts at once on a process of its own while the other tests fill the gaps
    (last, they made the tail of the run)."""
    first = {OWN_SERVERS_GROUP: 0, SPARK_GROUP: 1}

    def rank(item: pytest.Item) -> int:
        mark = item.get_closest_marker("xdist_group")
        return first.get(str(mark.args[0]), 2) if mark is not None else 2
    items.sort(key=rank)


# The ports the parallel processes share out: below the kernel's ephemeral range (32768 and
# up on Linux), where no outgoing connection and no port-0 bind takes one.
WORKER_PORTS = (12000, 32000)


def worker_port_range(workerid: str, workercount: int) -> str:
    """The ``LOW-HIGH`` range of pytest-xdist process ``workerid`` (``gw0``, ``gw1``, ...)
    among ``workercount``: equal slices of :data:`WORKER_PORTS`, one per process."""
    index = int(workerid.removeprefix("gw"))
    if not 0 <= index < workercount:
        raise ValueError(f"worker {workerid!r} is not one of {workercount}")
    lo, hi = WORKER_PORTS
    size = (hi - lo) // workercount
    return f"{lo + index * size}-{lo + (index + 1) * size - 1}"


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a test or a module gave for skipping: both kinds of report carry a skip
    as (path, line, "Skipped: reason")."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def unexpected(skips: list[Skip]) -> list[Skip]:
    """The skips whose reason matches no pattern of :data:`ALLOWED_SKIPS`."""
    return [s for s in skips
            if not any(re.search(pattern, s.reason) for pattern, _ in ALLOWED_SKIPS)]
