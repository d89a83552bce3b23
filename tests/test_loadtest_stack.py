"""Load tests end to end on real Oxia, MinIO and brokers started by the orchestrator, and
the Grafana dashboard checked against a real broker's metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from app.loadtest import rundir
from app.loadtest.cli import main
from app.loadtest.hammer import build_hammer, hammer_config, start_hammer
from app.loadtest.orchestrator import down, run_scenario
from app.loadtest.routing import owners_by_partition
from app.loadtest.rundir import RunDir, latest_run_dir, read_json, read_jsonl, ref_alive
from app.loadtest.scenario import load_scenario, parse_scenario
from app.loadtest.verify import read_acked, verify_acked
from tests.helpers.faults import truncating_proxy
from tests.helpers.stack import BrokerFactory

pytestmark = [pytest.mark.slow, pytest.mark.own_servers]  # stacks of its own, brokers killed

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "llog.json"


@pytest.fixture
def results(tmp_path: Path) -> Iterator[Path]:
    """A results directory; whatever run is left in it is stopped at the end."""
    path = tmp_path / "results"
    yield path
    if path.is_dir():
        for child in path.iterdir():
            if (child / rundir.STACK).is_file():
                down(RunDir(child))


def _all_refs(stack: dict[str, Any]) -> list[dict[str, Any]]:
    return [stack["supervisor"], stack["oxia"], stack["minio"], *stack["brokers"]]


def _check_acks_inside_owner_sets(run: RunDir, *, contiguous: bool
                                  ) -> dict[tuple[str, int], dict[int, Any]]:
    """Every acknowledgement came from an owner of its partition. Without faults the
    acknowledged offsets are exactly 1..N; a killed broker may have committed records
    it never acknowledged, so then they are only distinct and positive (the read-back
    checks that the log itself has no hole)."""
    owners = owners_by_partition(read_json(run / rundir.MANIFEST))
    acked = read_acked(run / rundir.ACKED)
    assert acked
    for tp, offsets in acked.items():
        brokers = {broker for _, broker in offsets.values()}
        assert brokers <= set(owners[tp]), (tp, brokers, owners[tp])
        if contiguous:
            assert sorted(offsets) == list(range(1, len(offsets) + 1))
        else:
            assert min(offsets) >= 1
    return acked


def test_smoke_up_precreate_run_down(results: Path) -> None:
    args = ["--scenario", "smoke", "--results", str(results)]
    assert main(["up", *args]) == 0
    run = latest_run_dir(results, "smoke")
    assert run is not None
    stack = run.stack()
    assert stack["status"] == "up"
    assert all(ref_alive(ref) for ref in _all_refs(stack))
    assert main(["status", *args]) == 0

    assert main(["precreate", *args]) == 0
    assert read_json(run / rundir.PRECREATE)["partitions"] == 4

    assert main(["run", *args]) == 0
    assert run.stack()["status"] == "up"  # `run` keeps a stack that `up` started
    summary = read_json(run / rundir.SUMMARY)
    rec = summary["reconciliation"]
    assert rec["ok"] and rec["exact"], summary["warnings"]
    assert rec["client_acked_records"] == rec["broker_accepted_records"] > 0
    assert rec["client_acked_bytes"] == rec["broker_accepted_bytes"]
    assert summary["warnings"] == []
    assert all(summary["artifacts"].values()), summary["artifacts"]
    assert summary["verify"]["ok"]
    assert summary["verify"]["acked_records"] == rec["client_acked_records"]
    assert summary["remap_events"]["count"] == 0
    client = read_json(run / rundir.CLIENT_SUMMARY)
    assert client["produce"]["latency_ms"]["p99"] > 0
    assert client["consume"]["records"] >= client["produce"]["acked_records"]
    assert client["consume"]["e2e_latency_ms"]["count"] > 0
    assert len(read_jsonl(run / rundir.CLIENT_INTERVALS)) >= 2
    assert len(read_jsonl(run / rundir.METRICS)) >= 3
    assert "<svg" in (run / rundir.REPORT).read_text()
    targets = read_json(run / rundir.FILE_SD)
    assert {t["labels"]["broker_id"] for t in targets} == {"b1", "b2", "b3"}
    _check_acks_inside_owner_sets(run, contiguous=True)
    assert summary["verify"]["log_holes"] == summary["verify"]["committed_unacked"] == 0

    assert main(["down", *args]) == 0
    stack = run.stack()
    assert stack["status"] == "down"
    assert not any(ref_alive(ref) for ref in _all_refs(stack))
    assert not (results / "file_sd" / f"{run.run_id}.json").exists()
    assert main(["status", *args]) == 3


def test_killed_broker_remaps_inside_owner_set_and_loses_no_ack(results: Path) -> None:
    victim = "b2"
    scenario = load_scenario("smoke", {
        "faults": [{"at_s": 1.5, "kill_broker": victim}],
        "workload.duration_s": 4, "stack.precreate": True, "consumer.enabled": False,
    })
    run, summary = run_scenario(scenario, results=results)
    try:
        faults = read_jsonl(run / rundir.FAULTS)
        assert [f["broker"] for f in faults] == [victim] and faults[0]["delivered"]
        owners = owners_by_partition(read_json(run / rundir.MANIFEST))
        remaps = [e for e in read_jsonl(run / rundir.REMAP_EVENTS) if e["event"] == "remap"]
        assert remaps, "killing a broker of some owner sets must remap their partitions"
        for event in remaps:
            tp = (event["topic"], event["partition"])
            assert event["owner_set"] == owners[tp]
            assert event["from"] == victim and event["to"] in owners[tp]
            assert event["to"] != victim
        remapped = {(e["topic"], e["partition"]) for e in remaps}
        assert remapped <= {tp for tp, o in owners.items() if victim in o}
        assert summary["client"]["produce"]["acked_records"] > 0

        # `run` read every acknowledged record back through a surviving broker.
        acked = _check_acks_inside_owner_sets(run, contiguous=False)
        result = summary["verify"]
        victim_url = next(b["url"] for b in run.stack()["brokers"] if b["id"] == victim)
        assert result["broker_url"] != victim_url
        assert result["ok"], result
        assert result["missing"] == result["mismatched"] == result["log_holes"] == 0
        assert result["acked_records"] == sum(len(v) for v in acked.values())
        assert result["acked_records"] == summary["client"]["produce"]["acked_records"]
        assert not summary["reconciliation"]["exact"]  # the victim's last writes are unseen
        assert run.stack()["status"] == "down"  # `run` stopped the stack it started
    finally:
        down(run)


def test_brokers_killed_under_retrying_producers_lose_and_duplicate_nothing(
        results: Path) -> None:
    scenario = load_scenario("retries")
    assert scenario.workload.idempotency_keys and len(scenario.faults) == 2
    run, summary = run_scenario(scenario, results=results)
    try:
        faults = read_jsonl(run / rundir.FAULTS)
        assert [f["broker"] for f in faults] == ["b1", "b2"]
        assert all(f["delivered"] for f in faults)
        produce = summary["client"]["produce"]
        verify = summary["verify"]
        assert verify["acked_records"] == produce["acked_records"] > 0
        assert verify["duplicates"] == 0 and verify["losses"] == 0, verify["examples"]
        assert verify["log_holes"] == 0 and verify["ok"]
        assert summary["headline"]["duplicates"] == 0 == summary["headline"]["losses"]

        # Producers retried after the kills, and a retry away from a killed broker went
        # to another owner.
        killed_at = {f["broker"]: f["ts"] for f in faults}
        retries = read_jsonl(run / rundir.RETRY_EVENTS)
        after_kill = [e for e in retries if e["ts"] >= faults[0]["ts"]]
        assert after_kill, "no retry after a broker was killed"
        assert produce["retries"] == len(retries) == summary["headline"]["retries"]
        for event in after_kill:
            if event["ts"] >= killed_at.get(event["from"], float("inf")):
                assert event["to"] != event["from"], event
        assert produce["acked_entries"] + sum(produce["errors"].values()) == produce["entries"]
    finally:
        down(run)


def _cut_run(tmp: Path, topic: str, proxy_url: str, direct_url: str, *, keys: bool
             ) -> tuple[RunDir, dict[str, Any]]:
    """The hammer against one partition owned by two brokers, the first reached through
    a proxy that cuts every answer after its headers (the broker has committed by
    then); returns the run directory and the client summary."""
    scenario = parse_scenario({
        "name": "cut", "brokers": {"count": 2}, "topics": [{"name": topic, "partitions": 1}],
        # Long enough for several requests through the cutting proxy on a loaded machine
        # (a run of 1.5 s once sent only one request, to the other broker).
        "workload": {"connections": 1, "duration_s": 6, "record_bytes": 64,
                     "records_per_request": 4, "retry_backoff_ms": 5,
                     "idempotency_keys": keys},
        "hammer": {"record_acks": True, "down_backoff_ms": 50}})
    run = RunDir(tmp)
    run.logs.mkdir(parents=True)
    roles = ["write", "read"]
    stack = {"brokers": [{"id": "b1", "url": proxy_url, "roles": roles},
                         {"id": "b2", "url": direct_url, "roles": roles}]}
    manifest = {"partitions": [{"topic": topic, "partition": 0, "owners": ["b1", "b2"],
                                "readers": ["b2"]}]}
    proc = start_hammer(build_hammer(), run, hammer_config(run, scenario, stack, manifest))
    assert proc.wait(timeout=60) == 0, (run.logs / "hammer.log").read_text()
    return run, read_json(run / rundir.CLIENT_SUMMARY)


async def test_an_answer_cut_after_commit_is_retried_by_key_and_stored_once(
        brokers: BrokerFactory, tmp_path: Path) -> None:
    first, second = brokers.start(), brokers.start()
    host, port = first.url.removeprefix("http://").rsplit(":", 1)
    async with truncating_proxy(host, int(port), body_bytes=0) as proxy_port:
        proxy = f"http://127.0.0.1:{proxy_port}"
        runs = {}
        for keys in (True, False):
            topic = f"cut-{'keyed' if keys else 'unkeyed'}-{proxy_port}"
            runs[keys] = await anyio.to_thread.run_sync(
                lambda k=keys, t=topic: _cut_run(tmp_path / t, t, proxy, second.url, keys=k))
    for keys, (run, client) in runs.items():
        produce = client["produce"]
        cut = produce["retry_reasons"].get("transport_error", 0)
        assert cut >= 1 and produce["errors"] == {}, produce
        result = verify_acked(run / rundir.ACKED, second.url)
        assert result["losses"] == result["log_holes"] == 0
        assert result["acked_records"] == produce["acked_records"]
        if keys:
            # Each cut attempt was committed; its retry was answered with those offsets.
            assert produce["duplicate_acks"] == cut
            assert result["duplicates"] == 0 and result["committed_unacked"] == 0, result
        else:
            # Without a key the retry writes the entry again: the read-back sees it.
            assert produce["duplicate_acks"] == 0
            assert result["duplicates"] == cut * 4 == result["committed_unacked"], result


# -- the Grafana dashboard -------------------------------------------------------------


def _exported_names(exposition: str) -> set[str]:
    """Sample names, plus the series names every declared metric would have."""
    names: set[str] = set()
    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["_sum", "_count", ""], "gauge": [""], "info": ["_info"],
                "untyped": [""]}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "counter":
                name = name.removesuffix("_total")
            names.update(name + s for s in suffixes.get(kind, [""]))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _dashboard_queries(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                out.append(value)
            else:
                out.extend(_dashboard_queries(value))
    elif isinstance(node, list):
        for item in node:
            out.extend(_dashboard_queries(item))
    return out


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_dashboard_queries_only_exported_metrics(brokers: BrokerFactory, topic: str) -> None:
    scenario = load_scenario("smoke")
    # With affinity, so the coordination row's membership and forwarding series exist.
    broker = brokers.start(loadtest_scenario=json.dumps(scenario.metrics_info("dash")),
                           affinity="forward", forward_host="127.0.0.1")
    produced = _post(f"{broker.url}/produce", {"topic_partitions": [
        {"topic": topic, "partition": 0, "records": ["a", "b"]}]})
    assert produced["success_count"] == 1
    consumed = _post(f"{broker.url}/consume", {"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 0}], "max_wait_ms": 0})
    assert len(consumed["results"][0]["records"]) == 2
    with urllib.request.urlopen(f"{broker.url}/metrics/prometheus", timeout=30) as resp:
        exported = _exported_names(resp.read().decode())

    dashboard = json.loads(DASHBOARD.read_text())
    queries = _dashboard_queries(dashboard)
    assert len(queries) > 30
    used = {name for q in queries for name in re.findall(r"\bllog_[A-Za-z0-9_]+", q)}
    assert used, "the dashboard queries no llog metric"
    if not any(name.startswith("llog_compaction_") for name in exported):
        # Until the broker runs the compactor, confirm the compaction panels against the
        # compaction package's own metric definitions.
        from prometheus_client import CollectorRegistry, generate_latest

        from app.compaction.metrics import CompactionMetrics

        registry = CollectorRegistry()
        CompactionMetrics(registry)
        exported |= {n for n in _exported_names(generate_latest(registry).decode())
                     if n.startswith("llog_compaction_")}
    missing = sorted(used - exported)
    assert not missing, f"dashboard queries metrics the broker does not export: {missing}"
    # Panels cover the areas the dashboard promises.
    for family in ("llog_produce_", "llog_consume_", "llog_batcher_", "llog_oxia_",
                   "llog_s3_", "llog_s3_estimated_request_cost_usd", "llog_loadtest_scenario_",
                   "llog_compaction_lag_"):
        assert any(name.startswith(family) for name in used), family
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "prometheus"
