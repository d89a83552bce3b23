"""summary.json: broker totals, client summary, artifacts, reconciliation, headline."""

from __future__ import annotations

import time
from typing import Any

from app.loadtest import rundir
from app.loadtest.rundir import RunDir, read_json, read_jsonl
from app.loadtest.scenario import Scenario


def delta(final: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """``final - baseline`` of aggregated totals (what this run's load added)."""
    out: dict[str, Any] = {}
    for key, value in final.items():
        base = baseline.get(key)
        if isinstance(value, dict):
            base = base if isinstance(base, dict) else {}
            out[key] = {k: v - base.get(k, 0.0) for k, v in value.items()}
        elif isinstance(value, int | float):
            out[key] = value - (base if isinstance(base, int | float) else 0.0)
    return out


def _cpu(samples: list[dict[str, Any]], prefix: str) -> float | None:
    """Average CPU % over the run of the processes whose name starts with ``prefix``."""
    total = 0.0
    found = False
    names = {n for s in samples for n in s.get("processes", {}) if n.startswith(prefix)}
    for name in names:
        alive = [s for s in samples if s["processes"].get(name, {}).get("alive")]
        if len(alive) < 2:
            continue
        first, last = alive[0], alive[-1]
        dt = last["ts"] - first["ts"]
        if dt > 0:
            found = True
            total += 100 * (last["processes"][name]["cpu_s"]
                            - first["processes"][name]["cpu_s"]) / dt
    return round(total, 1) if found else None


def _host_cpu(samples: list[dict[str, Any]]) -> float | None:
    values = [s["host"]["cpu_pct"] for s in samples[1:] if "cpu_pct" in s.get("host", {})]
    return round(sum(values) / len(values), 1) if values else None


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def build_summary(run: RunDir, scenario: Scenario, samples: list[dict[str, Any]],
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything an auditor needs, from the run's artifacts (``samples``: the collector's
    samples of this run, the first one taken before the hammer started)."""
    extra = extra or {}
    warnings: list[str] = []
    client = _client_summary(run, warnings)
    baseline = samples[0]["aggregate"] if samples else {}
    final_sample = samples[-1] if samples else {"brokers": {}, "aggregate": {}}
    d = delta(final_sample.get("aggregate", {}), baseline)
    brokers = _brokers_at_end(samples, final_sample, warnings)
    reconciliation = _reconcile(scenario, client.get("produce", {}), d, brokers, warnings)
    verify = extra.get("verify")
    warnings.extend(_failures(client.get("produce", {}), verify))
    remaps = read_jsonl(run / rundir.REMAP_EVENTS)
    retries = read_jsonl(run / rundir.RETRY_EVENTS)
    return {
        "version": 1,
        "run_id": run.run_id,
        "scenario": scenario.name,
        "description": scenario.description,
        "generated_at": time.time(),
        "headline": _headline(scenario, client, d, samples, reconciliation, verify),
        "client": client,
        "brokers": brokers,
        "broker_totals_delta": d,
        "reconciliation": reconciliation,
        "verify": verify,
        "remap_events": {"count": len(remaps),
                         "remaps": sum(1 for e in remaps if e.get("event") == "remap")},
        "retry_events": {"count": len(retries),
                         "maybe_written_entries": sum(
                             1 for e in retries for x in e.get("entries", [])
                             if x.get("maybe_written"))},
        "faults": read_jsonl(run / rundir.FAULTS),
        "collector_samples": len(samples),
        "warnings": warnings,
        **{k: v for k, v in extra.items() if k != "verify"},
    }


def _client_summary(run: RunDir, warnings: list[str]) -> dict[str, Any]:
    """The hammer's client-summary.json, or {} (with a warning) if it did not finish."""
    if (run / rundir.CLIENT_SUMMARY).is_file():
        doc: dict[str, Any] = read_json(run / rundir.CLIENT_SUMMARY)
        return doc
    warnings.append("client-summary.json is missing: the hammer did not finish")
    return {}


def _brokers_at_end(samples: list[dict[str, Any]], final_sample: dict[str, Any],
                    warnings: list[str]) -> dict[str, Any]:
    """Per-broker totals at the end: those of each broker's last successful scrape."""
    brokers: dict[str, Any] = {}
    for bid, entry in final_sample.get("brokers", {}).items():
        last_good = next((s for s in reversed(samples)
                          if s["brokers"].get(bid, {}).get("up")), None)
        brokers[bid] = {
            "up_at_end": bool(entry.get("up")),
            "last_scraped_at": last_good["ts"] if last_good else None,
            "totals": last_good["brokers"][bid]["totals"] if last_good else None,
        }
        if not entry.get("up"):
            warnings.append(f"broker {bid} was not reachable at the final sample; its totals "
                            "are from its last successful scrape and may miss its last writes")
    return brokers


def _reconcile(scenario: Scenario, produce: dict[str, Any], d: dict[str, Any],
               brokers: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """What the client acknowledged against what the brokers accepted, and S3 PUTs
    against batcher flushes; every discrepancy becomes a warning."""
    rec = _reconciliation_figures(produce, d)
    inexact = _why_not_exact(scenario, brokers)
    rec["exact"] = not inexact
    warnings.extend(inexact)
    warnings.extend(_mismatches(rec))
    rec["records_match"] = rec["client_acked_records"] == rec["broker_accepted_records"]
    rec["bytes_match"] = rec["client_acked_bytes"] == rec["broker_accepted_bytes"]
    rec["puts_match_flushes"] = _puts_match_flushes(rec)
    rec["ok"] = bool(rec["records_match"] and rec["bytes_match"] and rec["puts_match_flushes"])
    return rec


def _reconciliation_figures(produce: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    acked_records = int(produce.get("acked_records", 0))
    acked_bytes = int(produce.get("acked_bytes", 0))
    accepted_records = int(d.get("produce_records", 0))
    accepted_bytes = int(d.get("produce_bytes", 0))
    flushes = int(d.get("batcher_flushes", 0))
    puts_ok = int(d.get("s3_put_ok", 0))
    return {
        "client_acked_records": acked_records,
        "broker_accepted_records": accepted_records,
        "records_diff": accepted_records - acked_records,
        "client_acked_bytes": acked_bytes,
        "broker_accepted_bytes": accepted_bytes,
        "bytes_diff": accepted_bytes - acked_bytes,
        "client_200_responses": int(produce.get("statuses", {}).get("200", 0)),
        "broker_200_responses": int(d.get("produce_requests_by_status", {}).get("200", 0)),
        "batcher_flushes": flushes,
        "s3_puts_ok": puts_ok,
        "s3_puts_total": int(d.get("s3_put_total", 0)),
        "s3_puts_per_flush": _r(puts_ok / flushes, 3) if flushes else None,
        # A compaction run that selected a candidate writes one compacted blob (one PUT).
        "compaction_candidates": int(d.get("compaction", {}).get(
            "compaction_candidates_total", 0)),
        "exact": True,
    }


def _puts_match_flushes(rec: dict[str, Any]) -> bool:
    flushes = rec["batcher_flushes"]
    return bool(flushes <= rec["s3_puts_ok"] <= flushes + rec["compaction_candidates"])


def _why_not_exact(scenario: Scenario, brokers: dict[str, Any]) -> list[str]:
    """Why the brokers' totals cannot match the client's exactly (empty: they can)."""
    # A broker with several workers answers its totals over all of them: no reason.
    reasons = []
    if any(not b["up_at_end"] for b in brokers.values()):
        reasons.append("a broker was down at the end")
    return reasons


def _mismatches(rec: dict[str, Any]) -> list[str]:
    out = []
    for what, client, broker in (("records", "client_acked_records", "broker_accepted_records"),
                                 ("bytes", "client_acked_bytes", "broker_accepted_bytes")):
        if rec[client] != rec[broker]:
            out.append(f"{what}: client acknowledged {rec[client]}, brokers accepted "
                       f"{rec[broker]} (diff {rec[broker] - rec[client]:+d})")
    if rec["client_200_responses"] != rec["broker_200_responses"]:
        out.append(f"200 responses: client saw {rec['client_200_responses']}, brokers sent "
                   f"{rec['broker_200_responses']}")
    if not _puts_match_flushes(rec):
        out.append(f"S3 PUTs ({rec['s3_puts_ok']} ok, {rec['s3_puts_total']} total) do not "
                   f"match batcher flushes ({rec['batcher_flushes']}) plus compaction "
                   f"candidates ({rec['compaction_candidates']}); each flush writes one shared "
                   "WAL blob, each compaction one blob")
    return out


def _failures(produce: dict[str, Any], verify: dict[str, Any] | None) -> list[str]:
    """Warnings for failed produce requests and a failed read-back."""
    out = []
    errors = produce.get("errors", {})
    if errors:
        out.append(f"produce errors: {errors}")
    if verify is not None and not verify.get("ok"):
        out.append(f"read-back: {verify.get('missing')} acknowledged records missing, "
                   f"{verify.get('mismatched')} different, "
                   f"{verify.get('duplicates')} stored more than once, "
                   f"{verify.get('log_holes')} offsets absent from the log")
    return out


def _headline(scenario: Scenario, client: dict[str, Any], d: dict[str, Any],
              samples: list[dict[str, Any]], rec: dict[str, Any],
              verify: dict[str, Any] | None) -> dict[str, Any]:
    w = scenario.workload
    produce = client.get("produce", {})
    lat = produce.get("latency_ms", {})
    e2e = client.get("consume", {}).get("e2e_latency_ms", {})
    secs = float(client.get("duration_s") or w.duration_s)
    acked = int(produce.get("acked_records", 0))
    flushes = float(d.get("batcher_flushes", 0))
    entries = int(produce.get("entries", 0))
    failed = sum(int(v) for v in produce.get("errors", {}).values())
    cost = float(d.get("s3_estimated_request_cost_usd", 0.0))
    return {
        "scenario": scenario.name,
        "mode": w.mode if w.mode == "closed" else f"open {w.rate:g} req/s",
        "brokers": f"{scenario.brokers.count}x{scenario.brokers.workers}",
        "partitions": scenario.partition_count,
        "record_bytes": w.record_bytes,
        "records_per_request": w.records_per_request,
        "connections": w.connections,
        "batch": f"{scenario.batch.max_bytes}B/{scenario.batch.max_delay_ms}ms",
        "routing": (f"{scenario.routing.policy} k={scenario.routing.owner_set_size}"
                    if scenario.stack.proxy == "none" else f"via {scenario.stack.proxy}"),
        "duration_s": _r(secs, 1),
        "acked_records": acked,
        "acked_records_per_s": _r(produce.get("records_per_s"), 1),
        "acked_mib_per_s": _r(produce.get("mib_per_s"), 3),
        "produce_p50_ms": lat.get("p50"),
        "produce_p99_ms": lat.get("p99"),
        "produce_p999_ms": lat.get("p999"),
        "produce_max_ms": lat.get("max"),
        "e2e_p50_ms": e2e.get("p50"),
        "e2e_p99_ms": e2e.get("p99"),
        "failed_entries": failed,
        "error_rate": _r(failed / entries, 5) if entries else None,
        "retries": produce.get("retries"),
        "duplicate_acks": produce.get("duplicate_acks"),
        # From the read-back (None without one): acknowledged records stored more than
        # once, and acknowledged records missing or different.
        "duplicates": verify.get("duplicates") if verify else None,
        "losses": verify.get("losses") if verify else None,
        "flushes_per_s": _r(flushes / secs, 1) if secs else None,
        "records_per_flush": _r(acked / flushes, 1) if flushes else None,
        "s3_puts_per_s": _r(d.get("s3_put_total", 0) / secs, 1) if secs else None,
        "oxia_requests_per_s": _r(d.get("oxia_requests_total", 0) / secs, 1) if secs else None,
        "s3_request_cost_usd": _r(cost, 6),
        "s3_cost_per_million_records_usd": _r(cost / acked * 1e6, 4) if acked else None,
        "broker_cpu_pct": _cpu(samples, "broker:"),
        "oxia_cpu_pct": _cpu(samples, "oxia"),
        "minio_cpu_pct": _cpu(samples, "minio"),
        "hammer_cpu_pct": _cpu(samples, "hammer"),
        "proxy_cpu_pct": _cpu(samples, "proxy"),
        "host_cpu_pct": _host_cpu(samples),
        "reconciled": rec.get("ok"),
    }


def artifact_presence(run: RunDir, scenario: Scenario) -> dict[str, bool]:
    names = [rundir.RESOLVED, rundir.STACK, rundir.MANIFEST, rundir.GIT, rundir.ENVIRONMENT,
             rundir.HAMMER_CONFIG, rundir.CLIENT_INTERVALS, rundir.CLIENT_SUMMARY,
             rundir.REMAP_EVENTS, rundir.RETRY_EVENTS, rundir.METRICS, rundir.METRICS_FINAL,
             rundir.FILE_SD, rundir.PROMETHEUS, rundir.REPORT, rundir.SUMMARY]
    stack = run.stack()
    if stack.get("precreated"):
        names.append(rundir.PRECREATE)
    if scenario.hammer.record_acks:
        names += [rundir.ACKED, rundir.VERIFY]
    if scenario.faults:
        names.append(rundir.FAULTS)
    out = {name: (run / name).is_file() for name in names}
    out["logs/"] = run.logs.is_dir() and any(run.logs.iterdir())
    return out


def headline_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of headline dicts (one column per run)."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| | " + " | ".join(str(r.get("scenario")) for r in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for key in keys:
        if key == "scenario":
            continue
        lines.append(f"| {key} | " + " | ".join(_fmt(r.get(key)) for r in rows) + " |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
