"""What adding brokers costs in coordination, beyond this machine: an analytic model.

Fed with measured per-operation costs (defaults: this machine's figures, below; override
them with flags, ``--costs FILE.json``, or the rows of ``bench/scale_out.py`` runs with
``--from-json``), it predicts for 1 to 64 broker processes and 16 to 4,096 partitions,
with and without affinity (``LLOG_AFFINITY=forward`` / ``off``): flushes/s, records per
flush, Oxia requests/s and per 1,000 records, commit CAS conflicts, S3 PUTs/s, forward
frames/s and the extra network bytes, the brokers' CPU, and the most records/s a cluster
takes before a wall (one process's CPU, one Oxia shard leader, S3 PUTs on one prefix).
It checks itself against the measured 1-3 broker rows (model beside measured) and writes
docs/scaling.md:

    .venv/bin/python bench/scaling_model.py [--write docs/scaling.md] [--from-json F ...]

Every formula is in :func:`predict` and printed in docs/scaling.md; the only constants
not measured per operation are the calibrations of :func:`calibrate` (flush rate and CPU
per record, per flush and per conflict), taken from the measured rows and printed with
the check. Nothing is simulated: rates are averages in a steady state.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"
COMMAND = "bench/scaling_model.py --write docs/scaling.md"


@dataclass(frozen=True)
class Costs:
    """Measured per-operation costs and the shape of the load (defaults: this machine,
    docs/performance.md's storage ceiling and the scale-out rows of :data:`MEASURED`)."""

    # Storage, one operation at a time (p50; docs/performance.md, "The storage ceiling").
    s3_put_ms: float = 18.4  # 512 KiB
    oxia_write_ms: float = 5.6
    oxia_get_ms: float = 5.6  # not measured apart: a round trip like a write
    # Walls.
    oxia_shards: int = 1  # `llog dev` and the scale-out runs: one shard
    oxia_shard_writes_per_s: float = 2837.0  # measured: one client, 16 in flight (a floor)
    s3_prefix_puts_per_s: float = 3500.0  # AWS: PUTs/s per prefix; all WAL blobs share one
    cores_per_process: float = 1.0  # one Python event loop
    # The batcher (app/settings.py defaults).
    window_ms: float = 5.0  # LLOG_BATCH_MAX_DELAY_MS
    flush_slots: int = 4  # LLOG_BATCH_MAX_INFLIGHT
    lane_slots: int = 2  # a forward lane's flush slots (app/cluster)
    # Calibrated (see calibrate()); None: from the measured rows.
    flushes_per_s_cap: float | None = None  # one saturated process's flushes/s
    cpu_us_per_record: float | None = None
    cpu_ms_per_flush: float | None = None
    cpu_ms_per_conflict: float | None = None
    cpu_us_per_forwarded_record: float = 0.0  # not separable in the rows (see the doc)
    cpu_ms_per_frame: float = 0.0  # likewise
    # Membership: a session keep-alive every 2 s and a re-list every 5 s per process.
    background_oxia_per_s: float = 0.7
    # The load: bench/scale_out.py's request, entries over partitions in turn.
    records_per_request: int = 80  # 16 entries x 5 records
    entries_per_request: int = 16
    record_bytes: int = 1024

    @property
    def records_per_group(self) -> float:
        return self.records_per_request / self.entries_per_request

    def unloaded_flush_cap(self) -> float:
        """A process whose event loop is not the limit: its slots each turn over in one
        window plus one PUT and one Oxia write."""
        return self.flush_slots / ((self.window_ms + self.s3_put_ms + self.oxia_write_ms) / 1e3)


@dataclass(frozen=True)
class Measured:
    """One row of bench/scale_out.py (10 s, 16 partitions, 16 connections through Caddy)."""

    case: str
    processes: int
    affinity: str
    records_per_s: float
    oxia_per_1k: float
    cas_per_1k: float
    flushes_per_s: float
    partitions_per_flush: float
    broker_cores: float
    forward_frames_per_s: float | None = None
    flush_slots: int = 4
    source: str = ""

    @property
    def conflicts_per_s(self) -> float:
        return self.cas_per_1k * self.records_per_s / 1000


_RUN = ".llog/bench/scale-out-20261127T095825Z"  # this machine, 2 CPUs, 15 s rows
_ONE_SLOT = ".llog/bench/scale-out-20261127T090713Z"  # LLOG_BATCH_MAX_INFLIGHT=1, 10 s
MEASURED = [
    Measured("1", 1, "off", 8444, 4.0, 0.0, 32.6,
             16.0, 0.88, source=_RUN),
    Measured("1", 1, "forward", 7715, 4.1, 0.0, 29.8,
             16.0, 0.86, source=_RUN),
    Measured("2", 2, "forward", 5742, 10.7, 0.0, 59.6,
             7.6, 1.17, 29.9, source=_RUN),
    Measured("2", 2, "off", 3885, 91.3, 56.8, 26.3,
             16.0, 1.25, source=_RUN),
    Measured("3", 3, "off", 2221, 192.1, 129.3, 20.3,
             16.0, 1.33, source=_RUN),
    Measured("3", 3, "forward", 4189, 18.9, 0.0, 76.3,
             5.2, 1.28, 68.1, source=_RUN),
    Measured("1x2", 2, "forward", 4481, 9.8, 0.0, 41.2,
             8.0, 0.99, 21.9, source=_RUN),
    Measured("1x2", 2, "off", 4615, 70.2, 45.6, 21.6,
             16.0, 1.20, source=_RUN),
    Measured("1", 1, "forward", 11110, 1.7, 0.0, 17.3, 16.0, 0.78, flush_slots=1,
             source=_ONE_SLOT),
    Measured("3", 3, "forward", 6144, 10.5, 0.2, 58.1, 5.1, 1.13, 999 / 10.1, flush_slots=1,
             source=_ONE_SLOT),
]


def rows_from_json(paths: Iterable[Path]) -> list[Measured]:
    """The proxy rows of bench/scale_out.py result files, or of bench/perf.py's cost
    section (its ``proxy`` rows); not ``ideal``, not failed, not another revision's."""
    out = []
    for path in paths:
        results = json.loads(path.read_text())
        slots = int((results["settings"].get("broker_settings") or {})
                    .get("LLOG_BATCH_MAX_INFLIGHT", Costs.flush_slots))
        for r in results["rows"]:
            if "section" in r and r.get("kind") != "proxy":
                continue  # bench/perf.py: only its brokers-behind-Caddy rows
            if "error" in r or r.get("direct") or not r["code"].startswith("this tree"):
                continue
            frames = r.get("forward_frames")
            out.append(Measured(
                r["case"], r["brokers"] * r["workers"], r["affinity"], r["records_per_s"],
                r["oxia_per_1k_records"], r["cas_conflicts_per_1k_records"],
                r["flushes_per_s"], r["partitions_per_flush"], r["broker_cpu_cores"],
                frames / r["window_s"] if frames is not None else None, slots, str(path)))
    return out


# -- calibration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    flush_caps: dict[int, float]  # flush slots -> one saturated process's flushes/s
    cpu_us_per_record: float
    cpu_ms_per_flush: float
    cpu_ms_per_conflict: float
    notes: list[str] = field(default_factory=list)


def _least_squares_2(xs: Sequence[tuple[float, float]], ys: Sequence[float]
                     ) -> tuple[float, float]:
    """y = a*x1 + b*x2 (no intercept), by the normal equations."""
    s11 = sum(x1 * x1 for x1, _ in xs)
    s12 = sum(x1 * x2 for x1, x2 in xs)
    s22 = sum(x2 * x2 for _, x2 in xs)
    t1 = sum(x1 * y for (x1, _), y in zip(xs, ys, strict=True))
    t2 = sum(x2 * y for (_, x2), y in zip(xs, ys, strict=True))
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-12 * max(s11 * s22, 1e-30):
        raise ValueError("the one-process rows do not tell records from flushes apart")
    return (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det


def calibrate(rows: Sequence[Measured], costs: Costs) -> Calibration:
    """What the model takes from the measured rows, and only from one-process rows
    except the conflict cost:

    - a saturated process's flushes/s, per flush-slot setting: the mean of the one-process
      rows with those slots (every row here is closed-loop, so saturated);
    - CPU per record and per flush: least squares of ``cores = rec/s * a + flushes/s * b``
      over the one-process rows (they differ in flushes per record through the slots);
    - CPU per conflict: the multi-process rows without affinity, what their CPU exceeds
      records and flushes by, over their conflicts.
    """
    notes: list[str] = []
    single = [r for r in rows if r.processes == 1]
    caps: dict[int, list[float]] = {}
    for r in single:
        caps.setdefault(r.flush_slots, []).append(r.flushes_per_s)
    flush_caps = {s: sum(v) / len(v) for s, v in caps.items()}
    if costs.flushes_per_s_cap is not None:
        flush_caps[costs.flush_slots] = costs.flushes_per_s_cap
    if costs.cpu_us_per_record is not None and costs.cpu_ms_per_flush is not None:
        a, b = costs.cpu_us_per_record / 1e6, costs.cpu_ms_per_flush / 1e3
        notes.append("CPU per record and per flush: given")
    else:
        a, b = _least_squares_2([(r.records_per_s, r.flushes_per_s) for r in single],
                                [r.broker_cores for r in single])
        if a <= 0 or b <= 0:  # rows too alike to tell records from flushes apart
            raise SystemExit(
                "scaling_model: the one-process rows cannot separate the CPU per record "
                f"from the CPU per flush ({a * 1e6:.1f} us, {b * 1e3:.2f} ms): add rows "
                "with other flush rates (another run with --broker-setting "
                "LLOG_BATCH_MAX_INFLIGHT=1) or give --costs")
        notes.append(f"CPU per record and per flush: least squares over {len(single)} "
                     "one-process rows")
    if costs.cpu_ms_per_conflict is not None:
        c = costs.cpu_ms_per_conflict / 1e3
        notes.append("CPU per conflict: given")
    else:
        contended = [r for r in rows if r.processes > 1 and r.affinity == "off"
                     and r.conflicts_per_s > 0]
        excess = sum(r.broker_cores - a * r.records_per_s - b * r.flushes_per_s
                     for r in contended)
        conflicts = sum(r.conflicts_per_s for r in contended)
        c = max(0.0, excess / conflicts) if conflicts else 0.0
        notes.append(f"CPU per conflict: {len(contended)} multi-process row(s) without "
                     "affinity, their CPU beyond records and flushes over their conflicts")
    return Calibration(flush_caps, a * 1e6, b * 1e3, c * 1e3, notes)


# -- the model ---------------------------------------------------------------------------


def predict(costs: Costs, cal: Calibration, *, processes: int, partitions: int,
            load: float, affinity: bool, flushes_per_s: float | None = None,
            flush_slots: int | None = None) -> dict[str, float]:
    """Steady-state rates of ``processes`` broker processes behind a balancer that
    spreads requests evenly, taking ``load`` records/s in requests of
    ``costs.records_per_request`` records over ``costs.entries_per_request`` partitions
    in turn. ``flushes_per_s`` (cluster total) overrides the predicted flush rate: the
    check gives the measured one for rows whose flush rate the model does not predict.
    """
    n, p, c = processes, partitions, costs
    slots = flush_slots or c.flush_slots
    cap = cal.flush_caps.get(slots) or c.unloaded_flush_cap()
    requests = load / c.records_per_request  # cluster, per second
    # A request's entries reach a process if one of them is for a partition it appends:
    # with affinity that is any process preferred for one of them; without, only the
    # process the balancer picked.
    touched = 1 - (1 - 1 / n) ** min(c.entries_per_request, p) if affinity else 1 / n
    arrivals = requests * touched  # per process: requests with work for it
    # A process flushes when a slot is free and work waits: at most `cap` per second (its
    # slots turning over), at most one per window, and no more often than work arrives.
    per_process = min(cap, 1000 / c.window_ms, arrivals)
    flushes = flushes_per_s if flushes_per_s is not None else n * per_process
    per_process = flushes / n
    records_per_flush = load / flushes if flushes else 0.0
    groups_per_flush = records_per_flush / c.records_per_group
    # Partitions a process appends: its preferred ones with affinity, all without. The
    # entries of a request are partitions in turn, so a flush's groups are distinct
    # partitions until they cover them all.
    owned = p / n if affinity else p
    partitions_per_flush = min(owned, max(1.0, groups_per_flush))
    commits = flushes * partitions_per_flush  # partition commits/s
    # One Write per flush per Oxia shard its commits touch (group commit).
    shards = c.oxia_shards * (1 - (1 - 1 / c.oxia_shards) ** partitions_per_flush)
    # Without affinity every process appends every partition, so the commit before ours
    # was another's with probability (N-1)/N: our cached version is stale, the CAS
    # conflicts and costs a get (re-read) and a retry write.
    conflict_share = 0.0 if affinity else (n - 1) / n
    conflicts = commits * conflict_share
    background = n * c.background_oxia_per_s
    oxia = flushes * shards + 2 * conflicts + background
    # Forwarding: a request's groups for partitions another process prefers cross once
    # more. A lane (one per ordered pair) has `lane_slots` frames out at a time, and a
    # frame is answered after the receiver's flush: it waits for a free slot (a flush's
    # share of the turn, T/slots) and the flush (T = slots/cap), so a lane sends at most
    # lane_slots / (T (1 + 1/slots)) frames/s.
    forwarded_share = (n - 1) / n if affinity else 0.0
    turn = slots / cap
    lane_frames = min(requests / n * (1 - (1 - 1 / n) ** min(c.entries_per_request, p)),
                      c.lane_slots / (turn * (1 + 1 / slots))) if affinity and n > 1 else 0.0
    frames = n * (n - 1) * lane_frames
    forwarded_records = load * forwarded_share
    cpu = (load * cal.cpu_us_per_record / 1e6 + flushes * cal.cpu_ms_per_flush / 1e3
           + conflicts * cal.cpu_ms_per_conflict / 1e3
           + forwarded_records * c.cpu_us_per_forwarded_record / 1e6
           + frames * c.cpu_ms_per_frame / 1e3)
    oxia_per_shard = (flushes * shards + 2 * conflicts) / c.oxia_shards + (
        background if c.oxia_shards == 1 else 0.0)  # members: one shard of their own
    return {
        "processes": n, "partitions": p, "load": load, "affinity": float(affinity),
        "flushes_per_s": flushes, "flushes_per_s_per_process": per_process,
        "records_per_flush": records_per_flush,
        "partitions_per_flush": partitions_per_flush,
        "oxia_per_s": oxia, "oxia_per_flush": oxia / flushes if flushes else 0.0,
        "oxia_per_1k": oxia / load * 1000 if load else 0.0,
        "oxia_per_shard_per_s": oxia_per_shard,
        "conflicts_per_s": conflicts, "cas_per_1k": conflicts / load * 1000 if load else 0.0,
        "s3_puts_per_s": flushes,
        "forward_frames_per_s": frames, "frames_per_s_per_process": frames / n,
        "forwarded_mib_per_s": forwarded_records * c.record_bytes / 2**20,
        "broker_cores": cpu, "cores_per_process": cpu / n,
        "records_per_cpu_s": load / cpu if cpu else 0.0,
    }


WALLS = ("CPU of a process", "Oxia shard leader", "S3 PUTs on one prefix")


def walls_hit(costs: Costs, row: dict[str, float]) -> list[str]:
    hit = []
    if row["cores_per_process"] > costs.cores_per_process:
        hit.append(WALLS[0])
    if row["oxia_per_shard_per_s"] > costs.oxia_shard_writes_per_s:
        hit.append(WALLS[1])
    if row["s3_puts_per_s"] > costs.s3_prefix_puts_per_s:
        hit.append(WALLS[2])
    return hit


def capacity(costs: Costs, cal: Calibration, *, processes: int, partitions: int,
             affinity: bool) -> tuple[float, str]:
    """The most records/s before a wall, and which wall: bisection on the load (every
    cost grows with it)."""

    def ok(load: float) -> bool:
        return not walls_hit(costs, predict(costs, cal, processes=processes,
                                            partitions=partitions, load=load,
                                            affinity=affinity))

    lo, hi = 0.0, 1.0
    while ok(hi) and hi < 1e12:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    over = predict(costs, cal, processes=processes, partitions=partitions, load=hi,
                   affinity=affinity)
    return lo, ", ".join(walls_hit(costs, over)) or "-"


# -- the check ---------------------------------------------------------------------------


def check_rows(costs: Costs, cal: Calibration, rows: Sequence[Measured]
               ) -> list[dict[str, Any]]:
    """Model beside measured, at each row's measured load. Affinity rows: the flush rate
    is predicted (each process saturated at its calibrated rate). Rows without affinity
    and more than one process: the measured flush rate is given (the model does not
    predict how far conflicts slow flushes), and the per-flush costs are predicted."""
    out = []
    for r in rows:
        given = r.processes > 1 and r.affinity == "off"
        m = predict(costs, cal, processes=r.processes, partitions=16, load=r.records_per_s,
                    affinity=r.affinity != "off", flush_slots=r.flush_slots,
                    flushes_per_s=r.flushes_per_s if given else None)
        out.append({"row": r, "model": m, "flushes_given": given})
    return out


def _ratio(model: float, measured: float) -> str:
    if measured == 0:
        return "-" if model == 0 else "n/a"
    return f"{model / measured:.2f}"


def check_table(checked: Sequence[dict[str, Any]]) -> list[str]:
    head = ("| processes | affinity | slots | rec/s (load) | flushes/s | rec/flush | "
            "partitions/flush | Oxia/1k | CAS/1k | frames/s | broker cores |")
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for item in checked:
        r, m = item["row"], item["model"]
        flushes = (f"{r.flushes_per_s:.1f} (given)" if item["flushes_given"]
                   else f"{r.flushes_per_s:.1f} / {m['flushes_per_s']:.1f}")
        frames = ("-" if r.forward_frames_per_s is None
                  else f"{r.forward_frames_per_s:.0f} / {m['forward_frames_per_s']:.0f}")
        rec_flush = r.records_per_s / r.flushes_per_s
        lines.append(
            f"| {r.processes} | {r.affinity} | {r.flush_slots} | {r.records_per_s:,.0f} | "
            f"{flushes} | {rec_flush:.0f} / {m['records_per_flush']:.0f} | "
            f"{r.partitions_per_flush:.1f} / {m['partitions_per_flush']:.1f} | "
            f"{r.oxia_per_1k:.1f} / {m['oxia_per_1k']:.1f} "
            f"({_ratio(m['oxia_per_1k'], r.oxia_per_1k)}) | "
            f"{r.cas_per_1k:.1f} / {m['cas_per_1k']:.1f} | {frames} | "
            f"{r.broker_cores:.2f} / {m['broker_cores']:.2f} |")
    return lines


# -- the tables --------------------------------------------------------------------------

PROCESSES = (1, 2, 3, 4, 8, 16, 32, 64)
PARTITIONS = (16, 256, 4096)


def _n(value: float, digits: int = 0) -> str:
    if value >= 100_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.{digits}f}"


def fixed_load_table(costs: Costs, cal: Calibration, load: float, partitions: int
                     ) -> list[str]:
    lines = ["| brokers | affinity | flushes/s | rec/flush | Oxia req/s | Oxia/1k rec | "
             "CAS conflicts/s | CAS/1k | S3 PUTs/s | frames/s | forwarded MiB/s | "
             "broker cores (per process) | walls |",
             "|" + "|".join("---" for _ in range(13)) + "|"]
    for n in PROCESSES:
        for aff in (False, True):
            m = predict(costs, cal, processes=n, partitions=partitions, load=load,
                        affinity=aff)
            lines.append(
                f"| {n} | {'forward' if aff else 'off'} | {_n(m['flushes_per_s'])} | "
                f"{_n(m['records_per_flush'])} | {_n(m['oxia_per_s'])} | "
                f"{m['oxia_per_1k']:.1f} | {_n(m['conflicts_per_s'])} | "
                f"{m['cas_per_1k']:.1f} | {_n(m['s3_puts_per_s'])} | "
                f"{_n(m['forward_frames_per_s'])} | {m['forwarded_mib_per_s']:.0f} | "
                f"{m['broker_cores']:.1f} ({m['cores_per_process']:.2f}) | "
                f"{', '.join(walls_hit(costs, m)) or '-'} |")
    return lines


def per_broker_table(costs: Costs, cal: Calibration, per_process: float, partitions: int
                     ) -> list[str]:
    lines = ["| brokers | load rec/s | affinity | flushes/s (per process) | rec/flush | "
             "Oxia/1k rec | CAS/1k | Oxia req/s per shard | S3 PUTs/s | "
             "rec per broker CPU-s | walls |",
             "|" + "|".join("---" for _ in range(11)) + "|"]
    for n in PROCESSES:
        for aff in (False, True):
            m = predict(costs, cal, processes=n, partitions=partitions,
                        load=per_process * n, affinity=aff)
            lines.append(
                f"| {n} | {_n(per_process * n)} | {'forward' if aff else 'off'} | "
                f"{_n(m['flushes_per_s'])} ({m['flushes_per_s_per_process']:.1f}) | "
                f"{_n(m['records_per_flush'])} | {m['oxia_per_1k']:.1f} | "
                f"{m['cas_per_1k']:.1f} | {_n(m['oxia_per_shard_per_s'])} | "
                f"{_n(m['s3_puts_per_s'])} | {_n(m['records_per_cpu_s'])} | "
                f"{', '.join(walls_hit(costs, m)) or '-'} |")
    return lines


def shards_table(costs: Costs, cal: Calibration, per_process: float) -> list[str]:
    lines = ["| brokers | Oxia shards | partitions/flush | Oxia Writes/flush | Oxia/1k rec | "
             "Oxia req/s per shard |", "|" + "|".join("---" for _ in range(6)) + "|"]
    for n in (1, 8, 64):
        for shards in (1, 4, 16):
            m = predict(dataclasses.replace(costs, oxia_shards=shards), cal, processes=n,
                        partitions=4096, load=per_process * n, affinity=True)
            lines.append(f"| {n} | {shards} | {m['partitions_per_flush']:.0f} | "
                         f"{m['oxia_per_flush']:.1f} | {m['oxia_per_1k']:.1f} | "
                         f"{_n(m['oxia_per_shard_per_s'])} |")
    return lines


def capacity_table(costs: Costs, cal: Calibration) -> list[str]:
    head = ["brokers"] + [f"{p} partitions, {a}" for p in PARTITIONS for a in ("off", "forward")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for n in PROCESSES:
        cells = [str(n)]
        for p in PARTITIONS:
            for aff in (False, True):
                cap, wall = capacity(costs, cal, processes=n, partitions=p, affinity=aff)
                cells.append(f"{_n(cap)} ({_abbrev(wall)})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _abbrev(wall: str) -> str:
    return {WALLS[0]: "CPU", WALLS[1]: "Oxia shard", WALLS[2]: "S3 prefix"}.get(wall, wall)


# -- the document ------------------------------------------------------------------------


def document(costs: Costs, cal: Calibration, rows: Sequence[Measured], load: float,
             per_process: float, sources: Sequence[str]) -> str:
    cap = cal.flush_caps.get(costs.flush_slots) or costs.unloaded_flush_cap()
    checked = check_rows(costs, cal, rows)
    fwd_cap = [capacity(costs, cal, processes=n, partitions=4096, affinity=True)
               for n in PROCESSES]
    s3_wall_n = costs.s3_prefix_puts_per_s / cap
    oxia_wall_n = costs.oxia_shard_writes_per_s * costs.oxia_shards / (
        cap + costs.background_oxia_per_s)
    unloaded = costs.unloaded_flush_cap()
    fixed64 = predict(costs, cal, processes=PROCESSES[-1], partitions=4096, load=load,
                      affinity=True)
    out = [
        "# Scaling: what each added broker costs",
        "",
        f"Written by `{COMMAND}` (bench/scaling_model.py); do not edit by hand. "
        "An analytic model fed with costs measured on one 2-CPU machine, checked against "
        "the 1-3 broker runs of bench/scale_out.py on the same machine, and extended to "
        "64 brokers and 4,096 partitions. It answers how coordination (Oxia requests, "
        "compare-and-set conflicts, S3 PUTs, forwarding) grows as brokers are added, with "
        "affinity (`LLOG_AFFINITY=forward`) and without (`off`), and where the next wall is. "
        "Figures beyond this machine are predictions, not measurements.",
        "",
        "\"Broker\" below means one broker *process*: a `llog serve --workers 2` counts "
        "twice (each worker is a member and flushes on its own).",
        "",
        "## Inputs",
        "",
        "| cost | value | from |",
        "|---|---|---|",
        f"| S3 PUT (512 KiB) | {costs.s3_put_ms} ms p50 | docs/performance.md, storage "
        "ceiling |",
        f"| Oxia write | {costs.oxia_write_ms} ms p50 | same |",
        f"| Oxia get (a conflict's re-read) | {costs.oxia_get_ms} ms | taken as a write's "
        "round trip |",
        f"| one Oxia shard leader | {costs.oxia_shard_writes_per_s:,.0f} writes/s | storage "
        "ceiling (one client, 16 in flight): a floor, not the server's limit |",
        f"| S3 PUTs on one prefix | {costs.s3_prefix_puts_per_s:,.0f}/s | AWS's documented "
        "rate per prefix; every WAL blob is under `wal-shared/` |",
        f"| Oxia shards | {costs.oxia_shards} | `llog dev` and the runs here |",
        f"| CPU per process | {costs.cores_per_process} core | one Python event loop |",
        f"| batch window, flush slots | {costs.window_ms:g} ms, {costs.flush_slots} | "
        "LLOG_BATCH_MAX_DELAY_MS, LLOG_BATCH_MAX_INFLIGHT defaults |",
        f"| a saturated process's flushes/s | {cap:.1f} | calibrated: one-process rows |",
        f"| broker CPU per record | {cal.cpu_us_per_record:.1f} us | calibrated: one-process "
        "rows |",
        f"| broker CPU per flush | {cal.cpu_ms_per_flush:.2f} ms | calibrated: one-process "
        "rows |",
        f"| broker CPU per CAS conflict | {cal.cpu_ms_per_conflict:.2f} ms | calibrated: "
        "the 3-broker row without affinity |",
        f"| broker CPU per forwarded record | {costs.cpu_us_per_forwarded_record:g} us | not "
        "separable in these rows (see the check) |",
        f"| broker CPU per forward frame | {costs.cpu_ms_per_frame:g} ms | likewise |",
        f"| membership Oxia requests | {costs.background_oxia_per_s} /s per process | a "
        "keep-alive every 2 s, a re-list every 5 s |",
        f"| load | {costs.records_per_request} records of {costs.record_bytes} B per request,"
        f" {costs.entries_per_request} entries | bench/scale_out.py's request |",
        "",
        "The CPU per record includes the HTTP request's share: the scale-out request has 16 "
        "entries of 5 records, so it costs more per record than the 4 x 25 requests of "
        "docs/performance.md (1.5-2 ms per 100 KiB).",
        "",
        "## The model",
        "",
        "N broker processes behind a balancer that spreads requests evenly; P partitions; "
        "a load of L records/s in requests of r records over e partitions in turn (r = "
        f"{costs.records_per_request}, e = {costs.entries_per_request}, 5 records per "
        "entry: a *group*). Steady state, averages:",
        "",
        "- **Work reaching a process**, requests/s with something for it: "
        "`a = L/r * (1 - (1 - 1/N)^min(e, P))` with affinity (any process preferred for "
        "one of the request's partitions), `L/(r N)` without (only the one the balancer "
        "picked).",
        "- **Flushes** per process: `f = min(f_cap, 1000/window_ms, a)`. A process flushes "
        "when a slot is free and work waits, so under load each flushes at about its own "
        "rate `f_cap`, set by its flush slots and how long a flush takes: measured "
        f"{cap:.1f}/s here (CPU-bound); a process whose event loop is not the limit turns "
        f"its slots over in one window + one PUT + one Oxia write, "
        f"`slots / (window + PUT + write)` = {unloaded:.0f}/s. Cluster: `F = N f`. "
        "Records per flush `R = L / F`.",
        "- **Partitions per flush**: `k = min(P/N, R/5)` with affinity (a process appends "
        "only its preferred partitions), `min(P, R/5)` without (groups of one request are "
        "distinct partitions in turn).",
        "- **Oxia requests**: one Write per flush per shard its commits touch, "
        "`s = S (1 - (1 - 1/S)^k)` for S shards (group commit), plus two per conflict "
        "(a get to re-read `meta/control` and the retry's write), plus membership: "
        "`O = F s + 2 C + 0.7 N` per second; per 1,000 records `1000 O / L`.",
        "- **CAS conflicts**: without affinity every process commits every partition, so "
        "the commit before ours was another's with probability `(N-1)/N`: "
        "`C = (N-1)/N * F k`. With affinity only the preferred process appends (forwarding "
        "falls back to a local append only when a peer refuses or is gone): `C = 0`.",
        "- **S3 PUTs**: one per flush, `F`, all under one prefix.",
        "- **Forwarding** (affinity): a share `(N-1)/N` of the records goes to another "
        "process: `(N-1)/N * L * 1 KiB` crosses the network a second time. Frames: one "
        "lane per ordered pair, each at most `lane_slots` frames per turn of the "
        "receiver's flush (a frame waits for a free slot, `T/slots`, then the flush, "
        "`T = slots/f_cap`): `N (N-1) min(a/N, lane_slots / (T (1 + 1/slots)))`, "
        f"lane_slots = {costs.lane_slots}.",
        "- **Broker CPU**: `L c_rec + F c_flush + C c_conflict + forwarded c_fwd + frames "
        "c_frame`.",
        "- **Capacity**: the largest L for which no wall is hit: a process's CPU above one "
        "core, a shard's Oxia writes above the leader's rate, S3 PUTs above the prefix's "
        "rate (bisection; every term grows with L).",
        "",
        "So with affinity there are no conflicts, but at a **fixed** load, N processes make "
        "about N times the flushes, each 1/N the size: Oxia requests and S3 PUTs per record "
        "grow with N. When the load grows with the brokers (constant load per broker, the "
        "reason to add them), they stay flat.",
        "",
        "## Check against this machine",
        "",
        "Measured / model, at each row's measured load (16 partitions, 16 connections "
        "through Caddy, 16 x 5 x 1 KiB binary per request, 10 s rows; indicative, taken "
        "while others used the machine). Rows: " + "; ".join(sorted(set(sources))) + ".",
        "",
        *check_table(checked),
        "",
        "Calibration: " + "; ".join(cal.notes) + ". The one-process rows calibrate the "
        "flush rate and CPU, and the 3-broker row without affinity calibrates the CPU per "
        "conflict, so those cells check the fit, not a prediction. Predicted: the "
        "multi-process rows with affinity (flushes/s, records and partitions per flush, "
        "Oxia and CAS per 1,000 records, frames, CPU) and, without affinity, Oxia and CAS "
        "per 1,000 records at the measured flush rate.",
        "",
        "What the check shows:",
        "",
        "- With affinity each process flushes at about the one-process rate, so three make "
        "three times the flushes, a third the size; Oxia requests per 1,000 records follow "
        "from flushes alone (one Write each, one shard).",
        "- Without affinity the model's Oxia requests per 1,000 records match the "
        "measured ones, but partly by two errors that offset: its conflicts, `(N-1)/N` of "
        "the commits, are below the measured ones (a retry can conflict again when another "
        "broker commits between the re-read and the retry), and its two requests per "
        "conflict are above them (by operation, bench/scale_out.py counts about one get "
        "per conflict, while retries often share a Write with other commits). It does not "
        "predict how far conflicts slow "
        "the flushes (their retries, pauses and CPU starve a shared event loop): that row's "
        "flush rate is given.",
        "- The flush rate of a saturated process is the least certain input: it is set by "
        "how long a flush takes, which on a shared 2-CPU machine depends on the CPU left to "
        "each process (2 s rows taken while the machine was loaded gave 15-33 flushes/s "
        "per process, one and two brokers). At a fixed load Oxia requests and S3 PUTs per "
        "record scale with it; recalibrate with `--from-json` from a quiet run.",
        "- Several processes on this 2-CPU machine cannot each flush at one process's rate: "
        "with MinIO, Oxia, Caddy and the load generator beside them, the brokers share "
        "about 1.3 cores, while the model gives every process a core of its own. So for the "
        "multi-process rows the model over-counts flushes (most for three brokers and for "
        "two workers of one broker) and with them Oxia requests per 1,000 records: on such "
        "a machine it is an upper bound; on hosts with a core per process it is the "
        "estimate.",
        "- Forwarding's own CPU does not show apart from the flushes it adds at the "
        "receivers: the model without a forwarding term puts the multi-process forward "
        "rows' CPU at " + ", ".join(
            f"{item['model']['broker_cores'] / item['row'].broker_cores:.2f}x"
            for item in checked
            if item["row"].processes > 1 and item["row"].affinity != "off")
        + " of what was measured, so `c_fwd` and `c_frame` stay 0: at these sizes records "
        "and flushes explain the CPU, and the cost of a frame is not known.",
        "",
        f"## A fixed total load: {_n(load)} records/s",
        "",
    ]
    for p in (16, 4096):
        out += [f"{p} partitions:", "", *fixed_load_table(costs, cal, load, p), ""]
    out += [
        "At a fixed load, more brokers mean more, smaller flushes: Oxia requests and S3 PUTs "
        "per record grow with N, with or without affinity; without affinity conflicts come "
        "on top and grow too. Few brokers cannot carry this load (their CPU); past the "
        "point where they can, adding more only adds coordination.",
        "",
        f"## Load growing with the brokers: {_n(per_process)} records/s per broker",
        "",
        "4,096 partitions:",
        "",
        *per_broker_table(costs, cal, per_process, 4096),
        "",
        "With affinity, Oxia requests and CAS conflicts per 1,000 records stay flat as "
        "brokers are added, and records per broker CPU-second hold. Without it they grow "
        "with (N-1)/N and CPU per record rises.",
        "",
        "## More Oxia shards",
        "",
        f"Affinity, 4,096 partitions, {_n(per_process)} records/s per broker:",
        "",
        *shards_table(costs, cal, per_process),
        "",
        "More shards do not divide each leader's load here: a flush's commits span every "
        "shard (one Write each), so each leader still sees one Write per flush, and "
        "requests per record grow with the shards a flush touches. They would divide it "
        "if a broker's preferred partitions lay on few shards (preference by shard, not "
        "built).",
        "",
        "## Capacity: records/s before the first wall",
        "",
        "Each cell: the most records/s, and the wall that stops it (CPU = one process's "
        "core; Oxia shard = one shard leader's writes/s; S3 prefix = PUTs/s on "
        "`wal-shared/`).",
        "",
        *capacity_table(costs, cal),
        "",
        "## Where the walls are",
        "",
        f"- **S3 PUTs on one prefix.** Every flush is one PUT under `wal-shared/`. "
        f"Saturated processes flush about {cap:.0f}/s each here, so {s3_wall_n:.0f} "
        f"processes reach {costs.s3_prefix_puts_per_s:,.0f} PUTs/s; on hosts where a "
        f"flush is I/O-bound ({unloaded:.0f}/s each) about "
        f"{costs.s3_prefix_puts_per_s / unloaded:.0f}. Next lever: spread WAL blobs over "
        "prefixes (per broker or hashed), which AWS scales per prefix.",
        f"- **One Oxia shard leader.** Each flush is one Write per shard touched; with one "
        f"shard about {oxia_wall_n:.0f} saturated processes reach "
        f"{costs.oxia_shard_writes_per_s:,.0f} writes/s (a measured floor). More shards "
        "divide the commits, but a flush over many partitions touches more of them (more "
        "Writes per flush): `s` above. Without affinity conflicts reach this wall much "
        "sooner (two more requests each).",
        "- **The batch window and flush slots.** Unpaced, a process flushes at its own rate "
        "whatever the load, so at a fixed load every added process makes flushes smaller: "
        "records per flush fall as 1/N and each flush's fixed costs (an S3 PUT, an Oxia "
        f"Write, {cal.cpu_ms_per_flush:.0f} ms of CPU here) are shared by fewer records. "
        "This model predicts that unpaced rate (the rows it is calibrated on were measured "
        "before pacing), an upper bound on flushes now: brokers pace their flushes "
        "(`LLOG_BATCH_EAGER_FLUSHES`, shared by the members with affinity, flush starts "
        "spaced by the flush cycle times the members, at most 250 ms apart), so N brokers "
        "at a fixed load flush about as often as one until that ceiling; past it, flushes "
        "grow with N again (docs/performance.md has the paced rows). With a fixed number "
        "of requests in flight (a closed loop: each client waits for its answer), a "
        "flush cannot carry more than the records in flight at its broker, C x R / N for "
        "C connections of R records: 427 for 16 x 80 over 3 brokers, against the 640 one "
        "broker takes (one batch filling while the other flushes). So at such a load no "
        "flush rule brings 3 brokers within 1.5x of one broker's Oxia requests per "
        "record; the records in flight must grow with the brokers, as they do when "
        "brokers are added for load (docs/performance.md measures both).",
        "- **Forwarding fan-out.** A request's 16 entries go to up to min(16, N-1) peers, "
        "so frames grow with N: at the fixed load above, "
        f"{_n(fixed64['frames_per_s_per_process'])} frames/s per process at 64 brokers, "
        f"about {fixed64['load'] / fixed64['forward_frames_per_s']:.0f} records each. "
        "Their CPU is the one cost here not measured apart (0 in the tables); at 1 ms a "
        "frame they would take "
        f"{fixed64['frames_per_s_per_process'] / 1000:.2f} of a core per process. "
        "Clients that send each partition's records to its preferred broker (the Python "
        "client's `route=\"preferred\"`, the load generator's `-route members`, "
        "docs/operations.md) save the hop and the frames.",
        "- **CPU of one process** bounds what each broker takes "
        f"({_n(fwd_cap[0][0])} records/s for one process with 4,096 partitions). Without "
        "affinity each conflict costs "
        f"{cal.cpu_ms_per_conflict:.1f} ms of CPU here, and conflicts per record grow "
        "with (N-1)/N, so added brokers add less and less.",
        "",
        "## Reproduce",
        "",
        f"    .venv/bin/python {COMMAND}",
        "",
        "With other costs: `--s3-put-ms`, `--oxia-write-ms`, `--oxia-shards`, "
        "`--flush-cap`, `--costs FILE.json` (any field of `Costs`); with new measurements: "
        "`--from-json .llog/bench/scale-out-*.json` (rows of bench/scale_out.py, e.g. "
        "`bench/scale_out.py --cases 1,2,3,1x2 --affinity off,forward --duration 10`).",
        "",
    ]
    return "\n".join(out)


# -- command line ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None,
                        help="write the document here (e.g. docs/scaling.md)")
    parser.add_argument("--from-json", type=Path, action="append", default=[],
                        help="bench/scale_out.py results: their rows replace the built-in "
                             "measured rows (repeatable)")
    parser.add_argument("--costs", type=Path, default=None,
                        help="a JSON object of Costs fields to override")
    parser.add_argument("--load", type=float, default=100_000,
                        help="the fixed total load, records/s (default 100,000)")
    parser.add_argument("--per-broker-load", type=float, default=5_000,
                        help="the load per broker of the growing case (default 5,000)")
    for name, help_ in (("s3-put-ms", "S3 PUT p50"), ("oxia-write-ms", "Oxia write p50"),
                        ("oxia-shards", "Oxia shards"),
                        ("flush-cap", "a saturated process's flushes/s")):
        parser.add_argument(f"--{name}", type=float, default=None, help=help_)
    return parser.parse_args(argv)


def costs_from(args: argparse.Namespace) -> Costs:
    overrides: dict[str, Any] = {}
    if args.costs is not None:
        overrides.update(json.loads(args.costs.read_text()))
    for flag, name in (("s3_put_ms", "s3_put_ms"), ("oxia_write_ms", "oxia_write_ms"),
                       ("flush_cap", "flushes_per_s_cap")):
        if getattr(args, flag) is not None:
            overrides[name] = getattr(args, flag)
    if args.oxia_shards is not None:
        overrides["oxia_shards"] = int(args.oxia_shards)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Costs)}
    if unknown:
        raise SystemExit(f"scaling_model: unknown costs {sorted(unknown)}")
    return Costs(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    costs = costs_from(args)
    rows = rows_from_json(args.from_json) if args.from_json else MEASURED
    if not rows:
        raise SystemExit("scaling_model: no measured rows")
    cal = calibrate(rows, costs)
    sources = [r.source for r in rows]
    print("model vs measured (measured / model):")
    for line in check_table(check_rows(costs, cal, rows)):
        print(line)
    print("calibration: " + "; ".join(cal.notes))
    print(f"  flushes/s cap by slots {cal.flush_caps}, CPU {cal.cpu_us_per_record:.1f} us/"
          f"record, {cal.cpu_ms_per_flush:.2f} ms/flush, {cal.cpu_ms_per_conflict:.2f} ms/"
          "conflict")
    text = document(costs, cal, rows, args.load, args.per_broker_load, sources)
    if args.write is not None:
        args.write.write_text(text)
        print(f"wrote {args.write}")
    else:
        print()
        print(text)
    if not all(math.isfinite(v) for item in check_rows(costs, cal, rows)
               for v in item["model"].values()):
        print("scaling_model: a prediction is not finite", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
