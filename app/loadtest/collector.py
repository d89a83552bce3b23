"""The metrics collector: broker ``/metrics``, tracked processes and host counters.

Every ``collector.interval_s`` (and once more at the end) it scrapes each broker's JSON
``/metrics``, reads CPU time and RSS of every tracked process tree and host counters
(CPU, memory, load, loopback traffic) through psutil, and appends one line to
``metrics-30s.jsonl``. A broker that cannot be scraped keeps its last totals (marked
stale), so the run's totals survive a broker that was killed mid-run.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import psutil

from app.loadtest import rundir
from app.loadtest.rundir import RunDir, ref_alive

# Scalar totals: key -> metric name (summed over all label sets).
_SCALARS = {
    "produce_records": "llog_produce_records_total",
    "produce_bytes": "llog_produce_bytes_total",
    "produce_seconds_sum": "llog_produce_seconds_sum",
    "produce_seconds_count": "llog_produce_seconds_count",
    "appended_records": "llog_appended_records_total",
    "appended_bytes": "llog_appended_bytes_total",
    "consume_requests": "llog_consume_requests_total",
    "consume_records": "llog_consume_records_total",
    "consume_bytes": "llog_consume_bytes_total",
    "batcher_flushes": "llog_batcher_flushes_total",
    "batcher_flush_seconds_sum": "llog_batcher_flush_seconds_sum",
    "batcher_flush_bytes_sum": "llog_batcher_flush_bytes_sum",
    "batcher_flush_requests_sum": "llog_batcher_flush_requests_sum",
    "batcher_rejected": "llog_batcher_rejected_total",
    "batcher_buffered_bytes": "llog_batcher_buffered_bytes",
    "commit_cas_conflicts": "llog_commit_cas_conflicts_total",
    "shared_blob_bytes_sum": "llog_shared_blob_bytes_sum",
    "shared_blob_count": "llog_shared_blob_bytes_count",
    "oxia_request_seconds_sum": "llog_oxia_request_seconds_sum",
    "oxia_request_seconds_count": "llog_oxia_request_seconds_count",
    "s3_request_seconds_sum": "llog_s3_request_seconds_sum",
    "s3_request_seconds_count": "llog_s3_request_seconds_count",
    "s3_estimated_request_cost_usd": "llog_s3_estimated_request_cost_usd_total",
    "s3_stored_bytes": "llog_s3_stored_bytes",
    "s3_stored_objects": "llog_s3_stored_objects",
    "s3_estimated_storage_cost_usd_per_month": "llog_s3_estimated_storage_cost_usd_per_month",
    "consume_long_polls": "llog_consume_long_polls",
}
# Labelled totals: key -> (metric name, label whose values become sub-keys).
_LABELLED = {
    "produce_requests_by_status": ("llog_produce_requests_total", ("status",)),
    "produce_failed_entries": ("llog_produce_failed_entries_total", ("error_type",)),
    "s3_requests": ("llog_s3_requests_total", ("op", "outcome")),
    "oxia_requests": ("llog_oxia_requests_total", ("op", "outcome")),
    "s3_bytes": ("llog_s3_bytes_total", ("direction",)),
    "http_requests": ("llog_http_requests_total", ("handler", "status")),
}
# Figures that describe the whole bucket: aggregated with max, not summed.
_MAX_AGGREGATED = {"s3_stored_bytes", "s3_stored_objects",
                   "s3_estimated_storage_cost_usd_per_month", "batcher_buffered_bytes"}


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def broker_totals(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures the load test uses, from one broker's JSON ``/metrics``."""
    metrics: dict[str, dict[str, float]] = doc.get("metrics", {})
    totals: dict[str, Any] = {}
    for key, name in _SCALARS.items():
        totals[key] = sum(metrics.get(name, {}).values())
    for key, (name, labels) in _LABELLED.items():
        grouped: dict[str, float] = {}
        for label_text, value in metrics.get(name, {}).items():
            parsed = _labels(label_text)
            sub = ":".join(parsed.get(lbl, "") for lbl in labels)
            grouped[sub] = grouped.get(sub, 0.0) + value
        totals[key] = grouped
    totals["s3_put_ok"] = totals["s3_requests"].get("put:ok", 0.0)
    totals["s3_put_total"] = sum(v for k, v in totals["s3_requests"].items()
                                 if k.startswith("put:"))
    totals["s3_requests_total"] = sum(totals["s3_requests"].values())
    totals["oxia_requests_total"] = sum(totals["oxia_requests"].values())
    compaction = {name.removeprefix("llog_"): sum(values.values())
                  for name, values in metrics.items()
                  if name.startswith("llog_compaction_") and not name.endswith("_bucket")}
    if compaction:
        totals["compaction"] = compaction
    return totals


def aggregate(per_broker: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Sum of the brokers' totals (max for bucket-wide figures)."""
    out: dict[str, Any] = {}
    for totals in per_broker.values():
        for key, value in totals.items():
            if isinstance(value, dict):
                bucket = out.setdefault(key, {})
                for sub, v in value.items():
                    bucket[sub] = bucket.get(sub, 0.0) + v
            elif key in _MAX_AGGREGATED:
                out[key] = max(out.get(key, 0.0), value)
            else:
                out[key] = out.get(key, 0.0) + value
    return out


def fetch_json(url: str, timeout: float = 3.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


# -- processes and host -----------------------------------------------------------------


def tree_usage(root: int, tree: bool = True) -> tuple[int, float, int]:
    """Processes, CPU seconds and RSS of ``root`` and (with ``tree``) its descendants;
    a process that exits meanwhile is left out."""
    count, cpu, rss = 0, 0.0, 0
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)] if tree else [top]
    except psutil.Error:
        return count, cpu, rss
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                memory = proc.memory_info()
        except psutil.Error:
            continue
        count += 1
        cpu += times.user + times.system
        rss += memory.rss
    return count, cpu, rss


def host_counters() -> dict[str, float]:
    """CPU seconds (all cores), memory, load and loopback traffic of the host."""
    t = psutil.cpu_times()
    mem = psutil.virtual_memory()
    out = {
        # guest time is already inside user and nice
        "cpu_total_s": (t.user + t.nice + t.system + t.idle + t.iowait + t.irq + t.softirq
                        + t.steal),
        "cpu_idle_s": t.idle,
        "cpu_iowait_s": t.iowait,
        "memtotal_bytes": float(mem.total),
        "memavailable_bytes": float(mem.available),
        "loadavg1": os.getloadavg()[0],
    }
    loopback = psutil.net_io_counters(pernic=True).get("lo")
    if loopback is not None:
        out["lo_rx_bytes"] = float(loopback.bytes_recv)
        out["lo_tx_bytes"] = float(loopback.bytes_sent)
    return out


class Collector:
    """Samples into ``metrics-30s.jsonl``; run it in a thread with :meth:`start`."""

    def __init__(self, run: RunDir, interval_s: float,
                 extra_processes: Callable[[], dict[str, dict[str, Any]]] | None = None):
        self.run = run
        self.interval_s = interval_s
        self.extra_processes = extra_processes or (lambda: {})
        self.started = time.time()
        self.latest: dict[str, dict[str, Any]] = {}  # broker id -> last good totals
        self.latest_at: dict[str, float] = {}
        self.raw: dict[str, Any] = {}
        self.prev: dict[str, Any] | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _processes(self, stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
        refs: dict[str, dict[str, Any]] = {}
        for name in ("supervisor", "oxia", "minio"):
            if isinstance(stack.get(name), dict):
                refs[name] = stack[name]
        for broker in stack.get("brokers", []):
            refs[f"broker:{broker['id']}"] = broker
        if isinstance(stack.get("proxy"), dict):
            refs["proxy"] = stack["proxy"]
        refs.update(self.extra_processes())
        return refs

    def sample(self, final: bool = False) -> dict[str, Any]:
        with self._lock:
            return self._sample(final)

    def _sample(self, final: bool) -> dict[str, Any]:
        now = time.time()
        stack = self.run.stack()
        brokers: dict[str, Any] = {}
        for broker in stack.get("brokers", []):
            bid = broker["id"]
            entry: dict[str, Any] = {"url": broker["url"]}
            try:
                doc = fetch_json(f"{broker['url']}/metrics")
                totals = broker_totals(doc)
                self.latest[bid] = totals
                self.latest_at[bid] = now
                self.raw[bid] = doc
                entry.update(up=True, status=doc.get("status"), totals=totals)
            except Exception as exc:  # unreachable, killed, bad answer: keep the last totals
                entry.update(up=False, error=f"{type(exc).__name__}: {exc}",
                             stale_totals_at=self.latest_at.get(bid))
            brokers[bid] = entry
        agg = aggregate(self.latest)
        processes: dict[str, Any] = {}
        for name, ref in self._processes(stack).items():
            if not ref_alive(ref):
                processes[name] = {"alive": False}
                continue
            # The supervisor's children are tracked on their own: count it alone.
            count, cpu, rss = tree_usage(int(ref["pid"]), tree=name != "supervisor")
            processes[name] = {"alive": True, "pid": ref["pid"], "processes": count,
                               "cpu_s": round(cpu, 3), "rss_bytes": rss}
        host = host_counters()
        sample: dict[str, Any] = {
            "ts": now, "elapsed_s": round(now - self.started, 3), "final": final,
            "brokers": brokers, "aggregate": agg, "processes": processes, "host": host,
        }
        self._rates(sample)
        with (self.run / rundir.METRICS).open("a") as out:
            out.write(json.dumps(sample) + "\n")
        self.prev = sample
        self.samples += 1
        return sample

    def _rates(self, sample: dict[str, Any]) -> None:
        prev = self.prev
        if prev is None:
            return
        dt = float(sample["ts"]) - float(prev["ts"])
        if dt <= 0:
            return
        a, b = prev["aggregate"], sample["aggregate"]

        def rate(key: str) -> float:
            return max(0.0, (float(b.get(key, 0.0)) - float(a.get(key, 0.0))) / dt)

        def rates_of(key: str) -> dict[str, float]:
            old, new = a.get(key, {}), b.get(key, {})
            return {k: max(0.0, (v - old.get(k, 0.0)) / dt) for k, v in new.items()}

        sample["rates"] = {
            "produce_records_per_s": rate("produce_records"),
            "produce_mib_per_s": rate("produce_bytes") / 2**20,
            "consume_records_per_s": rate("consume_records"),
            "flushes_per_s": rate("batcher_flushes"),
            "s3_requests_per_s": rates_of("s3_requests"),
            "oxia_requests_per_s": rates_of("oxia_requests"),
        }
        for name, proc in sample["processes"].items():
            old = prev["processes"].get(name, {})
            if proc.get("alive") and old.get("alive") and old.get("pid") == proc.get("pid"):
                proc["cpu_pct"] = round(100 * (proc["cpu_s"] - old["cpu_s"]) / dt, 2)
        h, ph = sample["host"], prev["host"]
        total = h.get("cpu_total_s", 0) - ph.get("cpu_total_s", 0)
        if total > 0:
            idle = h.get("cpu_idle_s", 0) - ph.get("cpu_idle_s", 0)
            iowait = h.get("cpu_iowait_s", 0) - ph.get("cpu_iowait_s", 0)
            h["cpu_pct"] = round(100 * (1 - (idle + iowait) / total), 2)
            h["iowait_pct"] = round(100 * iowait / total, 2)
        for key in ("lo_rx_bytes", "lo_tx_bytes"):
            if key in h and key in ph:
                h[f"{key}_per_s"] = (h[key] - ph[key]) / dt

    # -- thread ------------------------------------------------------------------------

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="collector", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # never let a sampling hiccup end the run
                print(f"collector: sample failed: {exc}", flush=True)

    def stop(self) -> dict[str, Any]:
        """Stop the thread and take the final sample (also writes metrics-final.json)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 10)
        final = self.sample(final=True)
        rundir.write_json(self.run / rundir.METRICS_FINAL,
                          {"ts": final["ts"], "brokers": self.raw,
                           "last_scraped_at": self.latest_at})
        return final
