"""What a GiB of records costs: llog on S3 against a three-zone Kafka, computed alike.

For each corpus of bench/corpus.py and each codec (none, zstd), what ingesting one GiB
of records (uncompressed), keeping it 7 days and reading it back once costs at list
prices: llog from the broker's own counters (S3 PUTs and GETs per MiB of records, the
objects compaction writes and reads, Oxia requests, the stored bytes as compressed),
Kafka from its replication (three replicas in three zones: inter-zone transfer for the
producer, the followers and the consumers, gp3 disks for every replica). Every formula
is in :func:`llog_costs` and :func:`kafka_costs` and printed in the document.

The inputs are a JSON file (bench/cost_inputs.json: prices with their date, request
counts per MiB and compression ratios, each with where it was measured); ``--from-perf``
takes the request counts and ratios from the compression rows of a ``bench/perf.py``
run instead, and ``--save-inputs`` keeps them:

    .venv/bin/python bench/cost_model.py [--write docs/cost.md]
    .venv/bin/python bench/cost_model.py --from-perf .llog/bench/perf-<time>.json \\
        --save-inputs bench/cost_inputs.json --write docs/cost.md

tests/test_bench_cost_model.py fails when docs/cost.md is not what the inputs give.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ROOT / "bench" / "cost_inputs.json"
DOC = ROOT / "docs" / "cost.md"
COMMAND = "bench/cost_model.py --write docs/cost.md"
MIB_PER_GIB = 1024
CODECS = ("none", "zstd")


def load(path: Path = INPUTS) -> dict[str, Any]:
    inputs: dict[str, Any] = json.loads(path.read_text())
    return inputs


def ratios(inputs: dict[str, Any], corpus: str, codec: str) -> dict[str, float]:
    """Raw bytes over stored (llog WAL, llog chunks, Kafka batches); none stores 1:1."""
    if codec == "none":
        return {"wal_ratio": 1.0, "chunk_ratio": 1.0, "kafka_ratio": 1.0}
    found: dict[str, float] = inputs["corpora"][corpus][codec]
    return found


def _months(inputs: dict[str, Any], days: float) -> float:
    return days * 24 / inputs["hours_per_month"]


def llog_costs(inputs: dict[str, Any], corpus: str, codec: str) -> dict[str, float]:
    """USD for one GiB of records (and the requests behind them)."""
    p, lg = inputs["prices"], inputs["llog"]
    req = lg["requests_per_mib"]
    r = ratios(inputs, corpus, codec)
    puts = req["s3_put"] * MIB_PER_GIB  # a flush is one PUT, whatever it compresses to
    compaction_puts = req["chunk_objects"] * MIB_PER_GIB
    compaction_gets = req["wal_objects"] * lg["compaction_gets_per_wal_object"] * MIB_PER_GIB
    read_gets = req["s3_get_read_compacted"] * MIB_PER_GIB
    ingest = (puts + compaction_puts) / 1000 * p["s3_put_per_1000_usd"] + (
        compaction_gets / 1000 * p["s3_get_per_1000_usd"])
    # Chunks for the whole retention; WAL objects until vacuum deletes them.
    keep = (_months(inputs, inputs["retention_days"]) / r["chunk_ratio"]
            + _months(inputs, lg["wal_days_after_compaction"]) / r["wal_ratio"]
            ) * p["s3_storage_gb_month_usd"]
    read = read_gets / 1000 * p["s3_get_per_1000_usd"]
    # Clients that reach a broker in another zone: produce and read once, on the wire as
    # the client compressed them (a request's records, like a Kafka batch).
    crossing = (inputs["kafka"]["zones"] - 1) / inputs["kafka"]["zones"]
    any_zone = 2 * crossing / r["kafka_ratio"] * 2 * p["inter_zone_gb_each_direction_usd"]
    return {"puts": puts + compaction_puts, "gets": compaction_gets + read_gets,
            "oxia": req["oxia"] * MIB_PER_GIB, "ingest": ingest, "keep": keep, "read": read,
            "total": ingest + keep + read, "total_any_zone": ingest + keep + read + any_zone}


def kafka_costs(inputs: dict[str, Any], corpus: str, codec: str) -> dict[str, float]:
    """USD for one GiB of records on three replicas in three zones."""
    p, k = inputs["prices"], inputs["kafka"]
    stored = 1 / ratios(inputs, corpus, codec)["kafka_ratio"]  # GiB on each replica
    transfer = 2 * p["inter_zone_gb_each_direction_usd"]  # out of one zone, into another
    crossing = (k["zones"] - 1) / k["zones"]  # a client's leader is in another zone
    produce = crossing * stored * transfer
    replication = (k["replicas"] - 1) * stored * transfer
    keep = (stored * k["replicas"] * k["disk_headroom"] * p["ebs_gp3_gb_month_usd"]
            * _months(inputs, inputs["retention_days"]))
    read = crossing * stored * transfer  # without follower fetching; with it, 0
    ingest = produce + replication
    return {"ingest": ingest, "keep": keep, "read": read, "read_ff": 0.0,
            "total": ingest + keep + read, "total_ff": ingest + keep}


def _usd(v: float) -> str:
    return f"${v:.4f}"


def _n(v: float) -> str:
    return f"{v:,.0f}"


def render(inputs: dict[str, Any]) -> str:
    p, lg, k = inputs["prices"], inputs["llog"], inputs["kafka"]
    days = inputs["retention_days"]
    out = [
        "# What a GiB costs",
        "",
        f"Written by `{COMMAND}` from `bench/cost_inputs.json`; do not edit by hand "
        "(tests/test_bench_cost_model.py fails when this file is not what the inputs "
        "give). `--from-perf` takes the request counts and ratios from a `bench/perf.py` "
        "run's compression rows.",
        "",
        f"One GiB of records (2^30 bytes, uncompressed) ingested, kept {days} days and read "
        "back once, per corpus of `bench/corpus.py` and per topic codec. Compute (brokers, "
        "Oxia, Kafka's machines) is not counted on either side: both need machines, and "
        "their count follows the load, not the bytes kept.",
        "",
        "## Prices",
        "",
        f"{p['source']} As of {p['as_of']}.",
        "",
        "| item | price |",
        "|---|---|",
        f"| S3 PUT, COPY, POST, LIST | ${p['s3_put_per_1000_usd']} per 1,000 |",
        f"| S3 GET | ${p['s3_get_per_1000_usd']} per 1,000 |",
        f"| S3 Standard storage | ${p['s3_storage_gb_month_usd']} per GB-month |",
        f"| EBS gp3 storage | ${p['ebs_gp3_gb_month_usd']} per GB-month (provisioned) |",
        f"| transfer between zones | ${p['inter_zone_gb_each_direction_usd']} per GB out, "
        "and the same in |",
        "",
        "Transfer between EC2 and S3 in one region costs nothing; Oxia is not priced per "
        "request (it runs on the operator's machines), its requests are shown for scale.",
        "",
        "## Per GiB of records",
        "",
        "| corpus | codec | llog ratio WAL / chunk | llog ingest | llog keep | llog read "
        "| **llog total** | llog, clients in any zone | Kafka ratio | Kafka ingest "
        "| Kafka keep | Kafka read | **Kafka total** | Kafka, follower fetching | "
        "Kafka / llog |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for corpus, spec in inputs["corpora"].items():
        for codec in CODECS:
            r = ratios(inputs, corpus, codec)
            ll, kf = llog_costs(inputs, corpus, codec), kafka_costs(inputs, corpus, codec)
            out.append(
                f"| {spec['label']} | {codec} | {r['wal_ratio']:.2f} / {r['chunk_ratio']:.2f} "
                f"| {_usd(ll['ingest'])} | {_usd(ll['keep'])} | {_usd(ll['read'])} "
                f"| **{_usd(ll['total'])}** | {_usd(ll['total_any_zone'])} "
                f"| {r['kafka_ratio']:.2f} | {_usd(kf['ingest'])} | {_usd(kf['keep'])} "
                f"| {_usd(kf['read'])} | **{_usd(kf['total'])}** | {_usd(kf['total_ff'])} "
                f"| {kf['total'] / ll['total']:.1f}x |")
    one = llog_costs(inputs, "json", "none")
    req = lg["requests_per_mib"]
    out += [
        "",
        f"Requests behind the llog columns, per GiB: {_n(one['puts'])} S3 PUTs (flushes and "
        f"compacted chunks), {_n(one['gets'])} S3 GETs (compaction and the read), "
        f"{_n(one['oxia'])} Oxia requests (produce), the same for every corpus and codec: "
        "a flush is one PUT whatever its body compresses to.",
        "",
        "## How each figure is computed",
        "",
        "llog, per GiB of records:",
        "",
        f"- **ingest** = (PUTs per MiB x 1,024 + compacted objects per MiB x 1,024) x PUT "
        f"price + WAL objects per MiB x 1,024 x {lg['compaction_gets_per_wal_object']} "
        "(GETs compaction makes of each) x GET price. Bytes moved to and from S3 in its "
        "region cost nothing.",
        f"- **keep** = (1 / chunk ratio x {days} days + 1 / WAL ratio x "
        f"{lg['wal_days_after_compaction']} day) in months of {inputs['hours_per_month']} "
        f"hours x storage price: {lg['wal_days_note']}.",
        "- **read** = GETs per MiB reading compacted data back x 1,024 x GET price.",
        "- **clients in any zone**: producers and the one reader reach a broker in another "
        f"zone {k['zones'] - 1} times in {k['zones']} (no zone-aware routing): 2 x "
        f"{k['zones'] - 1}/{k['zones']} x 1 / Kafka ratio (the wire carries a request's "
        "records as the client compressed them, like a Kafka batch) x 2 x transfer price. "
        "With brokers in every zone and clients sent to their own, it is 0 (the total).",
        "",
        f"Kafka, {k['replicas']} replicas in {k['zones']} zones, per GiB of records "
        "(stored = 1 / Kafka ratio GiB):",
        "",
        f"- **ingest** = {k['zones'] - 1}/{k['zones']} x stored x 2 x transfer price (a "
        f"producer's leader is in another zone {k['zones'] - 1} times in {k['zones']}) + "
        f"{k['replicas'] - 1} x stored x 2 x transfer price (each follower in another zone "
        "fetches it).",
        f"- **keep** = stored x {k['replicas']} replicas x {k['disk_headroom']:g} (the "
        f"headroom: {k['disk_headroom_note']}) x gp3 price x {days} days in months.",
        f"- **read** = {k['zones'] - 1}/{k['zones']} x stored x 2 x transfer price, the "
        f"consumer's leader in another zone; **follower fetching**: "
        f"{k['follower_fetching_note']}: read = 0.",
        "",
        "## Where the inputs come from",
        "",
        "| input | value | measured |",
        "|---|---|---|",
    ]
    src = lg["requests_source"]
    for key, what in (("flushes_per_s", "flushes per second of one broker"),
                      ("s3_put", "S3 PUTs per MiB of records (produce)"),
                      ("oxia", "Oxia requests per MiB (produce)"),
                      ("wal_objects", "WAL objects per MiB"),
                      ("chunk_objects", "compacted objects per MiB"),
                      ("s3_get_read_compacted", "GETs per MiB reading compacted data")):
        value = lg[key] if key == "flushes_per_s" else req[key]
        out.append(f"| {what} | {value:g} | {src[key]} |")
    out += [
        f"| compaction GETs per WAL object | {lg['compaction_gets_per_wal_object']} "
        f"| {lg['compaction_gets_note']} |",
        "",
        f"Ratios: {inputs['ratios_source']}",
        "",
        "## What the table says",
        "",
        "- Kafka's bill is inter-zone transfer and replicated disks; llog's is mostly S3 "
        "requests, which follow flushes, not bytes. Compression divides what both store "
        "and what Kafka moves between zones, but not llog's PUTs: on llog it shrinks the "
        f"storage, {one['keep'] / one['total']:.0%} of the bill uncompressed (JSON events).",
        "- A broker that writes little pays per flush, not per byte: it flushes whenever "
        "its batch window holds records, so PUTs per GiB grow as the rate per broker falls. "
        f"Held at the measured {lg['flushes_per_s']:g} flushes/s (how often a broker with "
        "records in every window flushes depends on its window and S3's latency, not on "
        "its rate), the PUTs of one GiB cost as below; above the measured rate a flush "
        "carries more (up to the batcher's byte limit), so the count per MiB measured is "
        "the floor, the one in the table above.",
        "",
        "| MiB/s per broker | PUTs per GiB | PUT cost per GiB |",
        "|---|---|---|",
        *[f"| {rate:.1f} | {_n(puts)} | {_usd(puts / 1000 * p['s3_put_per_1000_usd'])} |"
          for rate in (1, 5, lg["flushes_per_s"] / req["s3_put"], 100)
          for puts in [max(lg["flushes_per_s"] / rate, req["s3_put"]) * MIB_PER_GIB]],
        "",
        "- Random bytes cost the same with zstd as without: compression is tried and the "
        "body stored raw when it would not save a tenth.",
        "- The broker keeps a running estimate of the same: `llog_s3_estimated_request_cost_"
        "usd_total`, `llog_s3_estimated_storage_cost_usd_per_month` and, from the bytes "
        "counted before and after compression (`llog_stored_raw_bytes_total`, "
        "`llog_stored_bytes_total`), `llog_s3_estimated_raw_bytes` and "
        "`llog_s3_estimated_storage_saved_usd_per_month` "
        "([operations.md](operations.md#metrics-and-alerts)).",
        "",
    ]
    return "\n".join(out)


def from_perf(inputs: dict[str, Any], perf: dict[str, Any], name: str) -> dict[str, Any]:
    """``inputs`` with the request counts (the JSON corpus, codec none, this tree) and
    the llog ratios (each corpus's zstd rows) of a perf run's compression section."""
    out = copy.deepcopy(inputs)
    rows = [r for r in perf["rows"] if r.get("section") == "compression"
            and r.get("broker") == "this" and "error" not in r]
    base = next((r for r in rows if r["corpus"] == "json" and r["codec"] == "none"), None)
    if base is None:
        raise SystemExit(f"{name}: no compression row of JSON events with codec none")
    mib = base["record_mib"]
    lg = out["llog"]
    lg["requests_per_mib"] = {
        "s3_put": round(base["produce"]["s3_put_per_mib"], 4),
        "oxia": round(base["produce"]["oxia_requests_per_mib"], 4),
        "wal_objects": round(base["stored_fresh"]["wal_objects"] / mib, 4),
        "chunk_objects": round(base["stored_compacted"]["chunk_objects"] / mib, 4),
        "s3_get_read_compacted": round(base["catchup_compacted"]["s3_get_per_mib"], 4)}
    lg["flushes_per_s"] = round(base["produce"]["flushes_per_s"], 1)
    where = f"{name} (bench/perf.py --sections compression), JSON events, codec none"
    lg["requests_source"] = {k: where for k in [*lg["requests_per_mib"], "flushes_per_s"]}
    measured = False
    for r in rows:
        codec = r["codec"].partition(":")[0]
        if codec != "none" and r["corpus"] in out["corpora"] and r.get("ratio_compacted"):
            out["corpora"][r["corpus"]][codec].update(
                wal_ratio=round(r["ratio_fresh"], 3), chunk_ratio=round(r["ratio_compacted"], 3))
            measured = True
    if measured:
        out["ratios_source"] = (f"llog's ratios: {name}, record bytes over the WAL and chunk "
                                "bytes listed. Before: " + out["ratios_source"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, default=INPUTS)
    parser.add_argument("--from-perf", type=Path, help="a perf-*.json with compression rows")
    parser.add_argument("--save-inputs", type=Path, help="write the inputs used here")
    parser.add_argument("--write", type=Path, help="write the document (docs/cost.md)")
    args = parser.parse_args(argv)
    inputs = load(args.inputs)
    if args.from_perf:
        inputs = from_perf(inputs, json.loads(args.from_perf.read_text()), args.from_perf.stem)
    if args.save_inputs:
        args.save_inputs.write_text(json.dumps(inputs, indent=2) + "\n")
    doc = render(inputs)
    if args.write:
        args.write.write_text(doc)
        print(f"wrote {args.write}")
    else:
        sys.stdout.write(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
