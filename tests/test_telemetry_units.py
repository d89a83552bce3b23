"""Pure logic of app/telemetry: statistics snapshots as metrics, the registry's views,
and the shared metrics directory of a server with several workers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.telemetry.registry import Families, ServiceRegistry
from app.telemetry.snapshots import Figure, SnapshotMetrics
from app.telemetry.workers import DIR_PREFIX, _host_tag, create_shared_dir


@dataclass
class Stats:
    state: str
    queued: int
    hits: int


FIGURES = (Figure("queued", "Queued things"), Figure("hits", "Hits", "counter"))


def test_snapshot_figures_are_gauges_and_counters_refreshed_on_collect() -> None:
    current: list[Stats | None] = [None]
    registry = ServiceRegistry()
    registry.register(SnapshotMetrics("t", lambda: current[0], FIGURES))
    assert registry.get_sample_value("t_queued") is None  # not running: nothing exported
    current[0] = Stats("open", 3, 5)
    assert registry.get_sample_value("t_queued") == 3
    assert registry.get_sample_value("t_hits_total") == 5
    current[0] = Stats("open", 1, 8)
    assert (registry.get_sample_value("t_queued"), registry.get_sample_value("t_hits_total")
            ) == (1, 8)
    current[0] = Stats("open", 1, 2)  # the component counted again from zero
    assert registry.get_sample_value("t_hits_total") == 10  # never goes back
    current[0] = None  # stopped: the last values stay
    assert registry.get_sample_value("t_queued") == 1


def test_the_registry_tells_views_from_value_backed_metrics() -> None:
    class View(Collector):
        def collect(self) -> Iterator[Metric]:
            yield GaugeMetricFamily("t_view", "A view", value=1)

    registry = ServiceRegistry()
    counter = Counter("t_requests", "Requests", registry=registry)
    snapshots = SnapshotMetrics("t", lambda: Stats("open", 0, 0), FIGURES)
    view = View()
    for collector in (snapshots, view):
        registry.register(collector)
    assert registry.snapshots == [snapshots] and registry.views == [view]
    counter.inc()
    text = generate_latest(Families(registry.collect())).decode()
    assert "t_requests_total 1.0" in text and "t_view 1.0" in text
    registry.unregister(view)
    assert registry.views == []


def test_a_fresh_directory_per_server_and_none_left_behind(tmp_path: Path) -> None:
    host = _host_tag()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f"{DIR_PREFIX}{host}-{gone}-abc"
    running = tmp_path / f"{DIR_PREFIX}{host}-{os.getppid()}-def"
    other_host = tmp_path / f"{DIR_PREFIX}elsewhere-{gone}-ghi"
    for path in (left, running, other_host):
        path.mkdir()
        (path / "counter_1.db").write_bytes(b"x")
    fresh = create_shared_dir(tmp_path)
    assert fresh.is_dir() and list(fresh.iterdir()) == []
    assert fresh.name.startswith(f"{DIR_PREFIX}{host}-{os.getpid()}-")
    assert not left.exists() and running.exists() and other_host.exists()


@pytest.mark.parametrize("parent", [None, "nested/deeper"])
def test_the_directory_parent_is_created(tmp_path: Path, parent: str | None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    made = create_shared_dir(tmp_path / parent if parent else None)
    assert made.parent == (tmp_path / parent if parent else tmp_path)
