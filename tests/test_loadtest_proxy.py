"""A load-test run through a load balancer (``stack.proxy``): the supervisor puts the
proxy in front of every broker and stops it after them, and the hammer sends every
request to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.loadtest import rundir
from app.loadtest.orchestrator import down, run_scenario
from app.loadtest.rundir import RunDir, read_json, read_jsonl, ref_alive
from app.loadtest.scenario import parse_scenario

pytestmark = [pytest.mark.slow, pytest.mark.own_servers]  # a stack of its own behind Caddy


@pytest.fixture
def results(tmp_path: Path) -> Iterator[Path]:
    """A results directory; whatever run is left in it is stopped at the end."""
    path = tmp_path / "results"
    yield path
    if path.is_dir():
        for child in path.iterdir():
            if (child / rundir.STACK).is_file():
                down(RunDir(child))


def test_a_run_through_caddy_loses_and_duplicates_nothing(results: Path) -> None:
    scenario = parse_scenario({
        "name": "via-caddy", "seed": 7,
        # A short drain keeps `down` quick; the proxy still sees each broker leave.
        "brokers": {"count": 2, "env": {"LLOG_DRAIN_S": "1"}},
        "topics": [{"name": "via-caddy", "partitions": 4}],
        "workload": {"connections": 4, "duration_s": 3, "record_bytes": 128,
                     "records_per_request": 5},
        "consumer": {"enabled": True, "max_wait_ms": 250, "drain_timeout_s": 3},
        "stack": {"proxy": "caddy", "ttl_s": 900},
        "collector": {"interval_s": 1},
        "hammer": {"interval_s": 1, "record_acks": True}})
    run, summary = run_scenario(scenario, results=results, keep=True)
    try:
        stack = run.stack()
        proxy = stack["proxy"]
        assert proxy["kind"] == "caddy" and proxy["status"] == "up", proxy
        assert ref_alive(proxy) and Path(proxy["log"]).is_file()
        assert proxy["url"] == f"http://127.0.0.1:{stack['ports']['proxy']}"
        config = read_json(run / rundir.HAMMER_CONFIG)
        assert config["brokers"] == [{"id": "proxy", "url": proxy["url"], "write": True,
                                      "read": True}]

        produce = summary["client"]["produce"]
        verify = summary["verify"]
        assert produce["errors"] == {} and produce["acked_records"] > 0, produce
        assert verify["ok"] and verify["acked_records"] == produce["acked_records"], verify
        assert verify["duplicates"] == verify["losses"] == verify["log_holes"] == 0
        assert summary["client"]["consume"]["records"] >= produce["acked_records"]
        rec = summary["reconciliation"]
        assert rec["ok"] and rec["exact"], summary["warnings"]
        # The proxy spread the load over both brokers; the collector tracked it.
        assert all(b["totals"]["produce_records"] > 0 for b in summary["brokers"].values())
        assert read_jsonl(run / rundir.METRICS)[-1]["processes"]["proxy"]["alive"]
        assert summary["headline"]["routing"] == "via caddy"
    finally:
        result = down(run)
    assert result["still_running"] == []
    stack = run.stack()
    assert stack["proxy"]["status"] == "stopped" and not ref_alive(stack["proxy"])
    assert not any(ref_alive(b) for b in stack["brokers"])
