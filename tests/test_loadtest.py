"""Load-test tooling without servers: scenarios, routing, reconciliation, report, hammer."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.loadtest import hammer, rundir
from app.loadtest.collector import Collector, aggregate, broker_totals, tree_usage
from app.loadtest.hammer import HAMMER_SRC, LATENCY_SRC, build_hammer, source_digest
from app.loadtest.report import line_chart, render_report
from app.loadtest.routing import build_manifest, owner_set
from app.loadtest.rundir import RunDir
from app.loadtest.scenario import (
    SCENARIO_DIR,
    ScenarioError,
    from_resolved,
    load_scenario,
    parse_override,
    parse_scenario,
    resolved,
)
from app.loadtest.summary import build_summary, delta, headline_table
from app.loadtest.verify import Findings, fnv1a64
from app.storage.idempotency import IDEMPOTENCY_WINDOW

SCENARIOS = sorted(p.stem for p in SCENARIO_DIR.iterdir() if p.suffix in (".toml", ".json"))


# -- scenarios -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_shipped_scenario_is_valid_and_round_trips(name: str) -> None:
    scenario = load_scenario(name)
    doc = resolved(scenario)
    again = from_resolved(json.loads(json.dumps(doc)))
    assert resolved(again) == doc
    assert again.routing_seed == scenario.routing_seed
    assert [b["id"] for b in doc["broker_layout"]] == scenario.broker_ids()
    info = scenario.metrics_info("run-1")
    assert all(isinstance(v, str | int | float) for v in info.values())


def test_shipped_scenarios_include_smoke_and_benchmarks() -> None:
    assert "smoke" in SCENARIOS
    assert any(name.startswith("bench") for name in SCENARIOS)
    smoke = load_scenario("smoke")
    assert smoke.workload.duration_s <= 5 and smoke.hammer.record_acks
    assert smoke.brokers.count > smoke.routing.owner_set_size  # remaps are observable
    retries = load_scenario("retries")
    assert retries.hammer.record_acks and retries.workload.idempotency_keys
    assert retries.workload.max_retries > 0 and retries.workload.entries_per_request > 1
    killed = {f.kill_broker for f in retries.faults}
    assert 0 < len(killed) < retries.routing.owner_set_size  # an owner survives the kills


def test_retry_settings_reach_the_hammer(tmp_path: Path) -> None:
    scenario = load_scenario("retries", dict([parse_override("workload.max_retries=5")]))
    w = scenario.workload
    assert w.longest_request_s == w.request_timeout_s * 6 + w.retry_backoff_max_ms * 5 / 1000
    run = RunDir(tmp_path)
    manifest = build_manifest(scenario)
    config = hammer.hammer_config(run, scenario, {"brokers": []}, manifest)
    assert config["max_retries"] == 5 and config["idempotency_keys"] is True
    assert (config["retry_backoff_ms"], config["retry_backoff_max_ms"]) == (
        w.retry_backoff_ms, w.retry_backoff_max_ms)
    assert config["entries_per_request"] == w.entries_per_request
    assert config["key_window"] == IDEMPOTENCY_WINDOW == 64  # what the brokers remember
    assert config["out"]["retry_events"] == rundir.RETRY_EVENTS
    with pytest.raises(ScenarioError, match="retry_backoff_max_ms"):
        parse_scenario({"name": "x", "workload": {"retry_backoff_ms": 100,
                                                  "retry_backoff_max_ms": 10}})


def test_overrides_and_errors() -> None:
    scenario = load_scenario("smoke", dict([parse_override("workload.duration_s=1.5"),
                                            parse_override("routing.policy=least_inflight")]))
    assert scenario.workload.duration_s == 1.5
    assert scenario.routing.policy == "least_inflight"
    with pytest.raises(ScenarioError, match="owner_set_size"):
        parse_scenario({"name": "x", "brokers": {"count": 2}, "routing": {"owner_set_size": 3}})
    with pytest.raises(ScenarioError, match="workload.bogus"):
        parse_scenario({"name": "x", "workload": {"bogus": 1}})
    with pytest.raises(ScenarioError, match="rate"):
        parse_scenario({"name": "x", "workload": {"mode": "open"}})
    with pytest.raises(ScenarioError, match="kill_broker|no broker"):
        parse_scenario({"name": "x", "faults": [{"at_s": 1, "kill_broker": "b9"}]})
    with pytest.raises(ScenarioError, match="no scenario"):
        load_scenario("does-not-exist")


# -- routing -------------------------------------------------------------------------


def test_routing_manifest_is_deterministic_for_a_seed() -> None:
    data = {"name": "r", "seed": 11, "brokers": {"count": 5},
            "topics": [{"name": "a", "partitions": 40}, {"name": "b", "partitions": 8}],
            "routing": {"owner_set_size": 2}}
    first = build_manifest(parse_scenario(data))
    again = build_manifest(parse_scenario(json.loads(json.dumps(data))))
    assert first == again
    other = build_manifest(parse_scenario({**data, "seed": 12}))
    assert [p["owners"] for p in first["partitions"]] != [p["owners"] for p in other["partitions"]]
    assert len(first["partitions"]) == 48
    for p in first["partitions"]:
        assert len(p["owners"]) == 2 == len(set(p["owners"]))
        assert set(p["owners"]) <= set(first["writers"])
    # Every broker owns some partitions: rendezvous spreads the load.
    assert all(v["owned"] > 0 for v in first["load"].values())


def test_rendezvous_changes_only_sets_that_held_a_removed_broker() -> None:
    brokers = [f"b{i}" for i in range(1, 7)]
    for p in range(200):
        full = owner_set(5, "t", p, brokers, 3)
        without = owner_set(5, "t", p, [b for b in brokers if b != "b4"], 3)
        if "b4" not in full:
            assert without == full
        else:
            assert [b for b in full if b != "b4"] == without[:2]


def test_behind_a_proxy_the_hammer_sends_everything_to_it(tmp_path: Path) -> None:
    scenario = parse_scenario({"name": "lb", "brokers": {"count": 3},
                               "stack": {"proxy": "haproxy"}})
    assert scenario.metrics_info("r")["proxy"] == "haproxy"
    manifest = build_manifest(scenario)
    assert manifest["proxy"] == "haproxy"
    stack = {"brokers": [{"id": b, "url": f"http://b/{b}", "roles": ["write", "read"]}
                         for b in scenario.broker_ids()],
             "proxy": {"kind": "haproxy", "url": "http://lb"}}
    config = hammer.hammer_config(RunDir(tmp_path), scenario, stack, manifest)
    assert config["brokers"] == [{"id": "proxy", "url": "http://lb", "write": True,
                                  "read": True}]
    assert len(config["partitions"]) == len(manifest["partitions"])
    assert all(p["owners"] == p["readers"] == ["proxy"] for p in config["partitions"])
    # Without one, owner sets as before.
    config = hammer.hammer_config(RunDir(tmp_path), scenario, {**stack, "proxy": None},
                                  manifest)
    assert [b["id"] for b in config["brokers"]] == ["b1", "b2", "b3"]
    assert config["partitions"] == manifest["partitions"]
    with pytest.raises(ScenarioError, match="b3 need"):
        parse_scenario({"name": "lb", "brokers": {"count": 3, "roles_by_broker": {
            "b3": ["read"]}}, "stack": {"proxy": "caddy"}})
    with pytest.raises(ScenarioError, match="stack.proxy"):
        parse_scenario({"name": "lb", "stack": {"proxy": "traefik"}})


def test_routing_respects_roles() -> None:
    scenario = parse_scenario({"name": "roles", "brokers": {
        "count": 3, "roles_by_broker": {"b3": ["read"]}}, "routing": {"owner_set_size": 2}})
    manifest = build_manifest(scenario)
    assert manifest["writers"] == ["b1", "b2"]
    assert all("b3" not in p["owners"] for p in manifest["partitions"])


# -- collector, reconciliation, report -------------------------------------------------


def _metrics(records: float, flushes: float, puts: float) -> dict[str, Any]:
    return {"broker_id": "b", "metrics": {
        "llog_produce_records_total": {"": records},
        "llog_produce_bytes_total": {"": records * 10},
        "llog_produce_requests_total": {"status=200": records / 5},
        "llog_batcher_flushes_total": {"": flushes},
        "llog_s3_requests_total": {"op=put,outcome=ok": puts, "op=list,outcome=ok": 1.0},
        "llog_oxia_requests_total": {"op=write_batch,outcome=ok": 3 * flushes},
        "llog_s3_stored_bytes": {"": 1000.0},
        "llog_s3_estimated_request_cost_usd_total": {"": 0.01},
    }}


def test_broker_totals_and_aggregate() -> None:
    a = broker_totals(_metrics(100, 10, 10))
    b = broker_totals(_metrics(50, 5, 5))
    assert a["produce_records"] == 100 and a["s3_put_ok"] == 10
    assert a["oxia_requests"] == {"write_batch:ok": 30}
    total = aggregate({"b1": a, "b2": b})
    assert total["produce_records"] == 150
    assert total["s3_requests"]["put:ok"] == 15
    assert total["s3_stored_bytes"] == 1000  # bucket-wide: max, not sum
    assert delta(total, aggregate({"b1": broker_totals(_metrics(20, 2, 2))}))[
        "produce_records"] == 130


@pytest.fixture
def sleepers() -> Iterator[subprocess.Popen[str]]:
    """A shell leading its own process group with two sleeping children."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo ready; wait"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_process_refs_tell_a_live_process_from_a_recycled_pid(
        sleepers: subprocess.Popen[str]) -> None:
    ref = rundir.process_ref(sleepers.pid)
    assert rundir.ref_alive(ref)
    assert rundir.ref_alive({"pid": sleepers.pid})  # no creation time recorded: pid only
    assert not rundir.ref_alive({**ref, "create_time": ref["create_time"] - 1})
    assert rundir.kill_ref(ref, signal.SIGKILL)  # the whole group
    assert sleepers.wait(10) == -signal.SIGKILL
    assert not rundir.ref_alive(ref)
    assert not rundir.kill_ref(ref)
    assert rundir.wait_gone([ref], 1)


def test_tree_usage_counts_the_descendants(sleepers: subprocess.Popen[str]) -> None:
    count, cpu, rss = tree_usage(sleepers.pid)
    assert count == 3 and cpu >= 0 and rss > 0
    alone = tree_usage(sleepers.pid, tree=False)
    assert alone[0] == 1 and 0 < alone[2] < rss
    os.killpg(sleepers.pid, signal.SIGKILL)
    sleepers.wait(10)
    assert tree_usage(sleepers.pid) == (0, 0.0, 0)


def test_collector_samples_processes_and_host(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    rundir.write_json(run / rundir.STACK, {"brokers": []})
    me = rundir.process_ref(os.getpid())
    collector = Collector(run, 30.0, extra_processes=lambda: {"me": me})
    first = collector.sample()
    cpu_at_first = psutil.Process().cpu_times()
    while sum(psutil.Process().cpu_times()[:2]) - sum(cpu_at_first[:2]) < 0.05:
        sum(range(10_000))  # burn some CPU for the rates to show
    second = collector.sample(final=True)
    proc = second["processes"]["me"]
    assert proc["alive"] and proc["processes"] >= 1 and proc["rss_bytes"] > 0
    assert proc["cpu_s"] > first["processes"]["me"]["cpu_s"]
    assert proc["cpu_pct"] > 0
    host = second["host"]
    assert host["cpu_total_s"] >= host["cpu_idle_s"] + host["cpu_iowait_s"] > 0
    assert 0 < host["memavailable_bytes"] <= host["memtotal_bytes"]
    assert 0 <= host["cpu_pct"] <= 100 and host["lo_rx_bytes_per_s"] >= 0
    assert [s["final"] for s in rundir.read_jsonl(run / rundir.METRICS)] == [False, True]


def _fake_run(tmp_path: Path, acked: int, accepted: int, puts: int) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.logs.mkdir(parents=True)
    (run.logs / "x.log").write_text("x")
    scenario = load_scenario("smoke")
    rundir.write_json(run / rundir.RESOLVED, resolved(scenario))
    rundir.write_json(run / rundir.STACK, {"brokers": []})
    rundir.write_json(run / rundir.CLIENT_SUMMARY, {
        "duration_s": 3.0, "produce": {"acked_records": acked, "acked_bytes": acked * 10,
                                       "requests": acked // 5, "statuses": {"200": acked // 5},
                                       "errors": {}, "records_per_s": acked / 3,
                                       "latency_ms": {"p50": 1.0, "p99": 2.0}}})
    samples = []
    for i, (records, flushes) in enumerate(((0, 0), (accepted, 10))):
        totals = broker_totals(_metrics(records, flushes, puts if i else 0))
        samples.append({"ts": 100.0 + i, "brokers": {"b1": {"up": True, "totals": totals}},
                        "aggregate": aggregate({"b1": totals}), "processes": {}, "host": {}})
    with (run / rundir.METRICS).open("w") as out:
        for s in samples:
            out.write(json.dumps(s) + "\n")
    return run


def test_summary_reconciles_and_warns(tmp_path: Path) -> None:
    scenario = load_scenario("smoke")
    good = _fake_run(tmp_path / "good", 500, 500, 10)
    summary = build_summary(good, scenario, rundir.read_jsonl(good / rundir.METRICS))
    assert summary["reconciliation"]["ok"], summary["warnings"]
    assert summary["warnings"] == []
    assert summary["headline"]["acked_records"] == 500
    assert summary["headline"]["duplicates"] is None  # no read-back
    assert summary["headline"]["records_per_flush"] == 50
    bad = _fake_run(tmp_path / "bad", 500, 480, 9)
    summary = build_summary(bad, scenario, rundir.read_jsonl(bad / rundir.METRICS))
    assert not summary["reconciliation"]["ok"]
    assert summary["reconciliation"]["records_diff"] == -20
    text = " ".join(summary["warnings"])
    assert "records" in text and "S3 PUTs" in text
    assert "| acked_records | 500 |" in headline_table([summary["headline"]])


def test_summary_warns_of_every_discrepancy_in_order(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, 500, 480, 12)
    client = rundir.read_json(run / rundir.CLIENT_SUMMARY)
    client["produce"]["errors"] = {"timeout": 2}
    rundir.write_json(run / rundir.CLIENT_SUMMARY, client)
    samples = rundir.read_jsonl(run / rundir.METRICS)
    samples[0]["brokers"]["b2"] = {"up": True, "totals": {"produce_records": 1.0}}
    samples[-1]["brokers"]["b2"] = {"up": False, "error": "refused"}
    scenario = load_scenario("smoke", dict([parse_override("brokers.workers=2")]))
    verify = {"ok": False, "missing": 1, "mismatched": 2, "losses": 3, "duplicates": 4,
              "log_holes": 3}
    summary = build_summary(run, scenario, samples, {"verify": verify, "note": "kept"})
    assert summary["warnings"] == [
        "broker b2 was not reachable at the final sample; its totals are from its last "
        "successful scrape and may miss its last writes",
        "a broker was down at the end",
        "records: client acknowledged 500, brokers accepted 480 (diff -20)",
        "bytes: client acknowledged 5000, brokers accepted 4800 (diff -200)",
        "200 responses: client saw 100, brokers sent 96",
        "S3 PUTs (12 ok, 12 total) do not match batcher flushes (10) plus compaction "
        "candidates (0); each flush writes one shared WAL blob, each compaction one blob",
        "produce errors: {'timeout': 2}",
        "read-back: 1 acknowledged records missing, 2 different, 4 stored more than once, "
        "3 offsets absent from the log",
    ]
    assert (summary["headline"]["duplicates"], summary["headline"]["losses"]) == (4, 3)
    rec = summary["reconciliation"]
    assert list(rec) == [
        "client_acked_records", "broker_accepted_records", "records_diff",
        "client_acked_bytes", "broker_accepted_bytes", "bytes_diff", "client_200_responses",
        "broker_200_responses", "batcher_flushes", "s3_puts_ok", "s3_puts_total",
        "s3_puts_per_flush", "compaction_candidates", "exact", "records_match",
        "bytes_match", "puts_match_flushes", "ok"]
    assert (rec["exact"], rec["ok"], rec["s3_puts_per_flush"]) == (False, False, 1.2)
    assert summary["brokers"]["b2"] == {"up_at_end": False, "last_scraped_at": 100.0,
                                        "totals": {"produce_records": 1.0}}
    assert summary["verify"] == verify and summary["note"] == "kept"
    missing = RunDir(tmp_path / "empty")
    missing.path.mkdir()
    assert build_summary(missing, scenario, [])["warnings"][0].startswith(
        "client-summary.json is missing")


def test_report_is_self_contained(tmp_path: Path) -> None:
    run = _fake_run(tmp_path, 500, 500, 10)
    summary = build_summary(run, load_scenario("smoke"), rundir.read_jsonl(run / rundir.METRICS))
    page = render_report(run, summary, run.resolved())
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    for external in ("<script src", "<link", "http://", "https://", "@import"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "no data" in line_chart("empty", [("a", [])], "x")


def _hashes(*values: bytes) -> dict[int, int]:
    return {i + 1: fnv1a64(v) for i, v in enumerate(values)}


def _acked(stored: dict[int, int], *offsets: int) -> dict[int, tuple[str, str]]:
    return {o: (f"{stored[o]:016x}", "b1") for o in offsets}


def test_read_back_finds_duplicates_losses_and_holes() -> None:
    stored = _hashes(b"a", b"b", b"c", b"a", b"d")  # "a" at offsets 1 and 4
    clean = Findings()
    clean.check("t", 0, _acked(stored, 2, 3, 5), stored)
    assert clean.counts == {"missing": 0, "mismatched": 0, "duplicates": 0, "log_holes": 0}
    assert (clean.checked, clean.unacked) == (3, 2)  # "a" twice, never acknowledged

    found = Findings()
    acked = {**_acked(stored, 1, 2), 3: (f"{fnv1a64(b'x'):016x}", "b2"),
             7: (f"{fnv1a64(b'e'):016x}", "b3")}
    found.check("t", 0, acked, {o: v for o, v in stored.items() if o != 5})
    assert found.counts == {"missing": 1, "mismatched": 1, "duplicates": 1, "log_holes": 3}
    assert found.examples["duplicates"] == [
        {"topic": "t", "partition": 0, "offsets": [1, 4], "copies": 2}]
    assert found.examples["missing"] == [
        {"topic": "t", "partition": 0, "offset": 7, "acked_by": "b3"}]
    assert found.examples["mismatched"][0]["offset"] == 3
    assert found.examples["log_holes"] == [
        {"topic": "t", "partition": 0, "first": 5, "count": 3}]


def test_fnv1a64_matches_the_hammer() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


# -- the Go load generators ------------------------------------------------------------

GO_MODULES = [HAMMER_SRC, LATENCY_SRC, Path(__file__).resolve().parents[1] / "bench" / "httpload"]


@pytest.mark.slow  # Go builds
@pytest.mark.parametrize("module", GO_MODULES, ids=lambda m: m.name)
def test_go_tests_and_vet(module: Path) -> None:
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    for step in (["go", "vet", "./..."], ["go", "test", "./..."]):
        result = subprocess.run(step, cwd=module, capture_output=True, text=True, env=env,
                                check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # Go builds
def test_hammer_builds_into_the_binary_cache(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    go = shutil.which("go")
    assert go is not None
    monkeypatch.setenv("LLOG_BIN_CACHE_DIR", str(tmp_path))
    binary = build_hammer()
    assert binary.parent == tmp_path and binary.name == f"hammer-{source_digest(go)}"
    usage = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30,
                           check=False)
    assert usage.returncode == 2 and "usage: hammer" in usage.stderr
    # An edit of the shared latency module makes another binary.
    edited = tmp_path / "latency"
    shutil.copytree(LATENCY_SRC, edited)
    with (edited / "latency.go").open("a") as f:
        f.write("\n// edited\n")
    monkeypatch.setattr(hammer, "LATENCY_SRC", edited)
    assert source_digest(go) != binary.name.removeprefix("hammer-")
