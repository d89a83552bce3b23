"""bench/cost_model.py: what a GiB costs on llog and on a three-zone Kafka, computed from
the inputs' prices, counts and ratios, and docs/cost.md kept in step with it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cost_model as cm  # noqa: E402

INPUTS = cm.load()
WEEK_IN_MONTHS = 7 * 24 / 730


def test_the_document_is_what_the_model_writes(tmp_path: Path) -> None:
    out = tmp_path / "cost.md"
    assert cm.main(["--write", str(out)]) == 0
    assert out.read_text() == (ROOT / "docs" / "cost.md").read_text(), (
        f"docs/cost.md is stale: run .venv/bin/python {cm.COMMAND}")


def test_kafka_pays_transfer_between_zones_and_three_replicated_disks() -> None:
    got = cm.kafka_costs(INPUTS, "json", "none")
    assert got["ingest"] == pytest.approx(2 / 3 * 0.02 + 2 * 0.02)
    assert got["keep"] == pytest.approx(3 * 2.0 * 0.08 * WEEK_IN_MONTHS)
    assert got["read"] == pytest.approx(2 / 3 * 0.02) and got["read_ff"] == 0
    assert got["total_ff"] == pytest.approx(got["total"] - got["read"])
    # Compression divides all of it by Kafka's ratio.
    ratio = INPUTS["corpora"]["json"]["zstd"]["kafka_ratio"]
    assert cm.kafka_costs(INPUTS, "json", "zstd")["total"] == pytest.approx(
        got["total"] / ratio)


def test_llog_pays_requests_per_flush_and_storage_per_stored_byte() -> None:
    req = INPUTS["llog"]["requests_per_mib"]
    none = cm.llog_costs(INPUTS, "json", "none")
    zstd = cm.llog_costs(INPUTS, "json", "zstd")
    assert none["ingest"] == zstd["ingest"] == pytest.approx(
        (req["s3_put"] + req["chunk_objects"]) * 1024 * 0.005 / 1000
        + req["wal_objects"] * 4 * 1024 * 0.0004 / 1000)
    assert none["keep"] == pytest.approx((WEEK_IN_MONTHS + 24 / 730) * 0.023)
    r = INPUTS["corpora"]["json"]["zstd"]
    assert zstd["keep"] == pytest.approx(
        (WEEK_IN_MONTHS / r["chunk_ratio"] + 24 / 730 / r["wal_ratio"]) * 0.023)
    assert none["read"] == pytest.approx(req["s3_get_read_compacted"] * 1024 * 0.0004 / 1000)
    # Random bytes are stored raw: trying zstd costs nothing here (measured ratios of
    # raw bodies are a hair under 1: the LLS1 header and record framing).
    tried = cm.llog_costs(INPUTS, "random", "zstd")
    assert tried == pytest.approx(cm.llog_costs(INPUTS, "random", "none"), rel=0.03)
    assert none["total_any_zone"] == pytest.approx(none["total"] + 2 * 2 / 3 * 0.02)


def _perf_row(corpus: str, codec: str, **extra: object) -> dict[str, object]:
    return {"section": "compression", "corpus": corpus, "codec": codec, "broker": "this",
            "record_mib": 100.0,
            "produce": {"s3_put_per_mib": 2.0, "oxia_requests_per_mib": 2.5,
                        "flushes_per_s": 30.0},
            "stored_fresh": {"wal_objects": 150.0},
            "stored_compacted": {"chunk_objects": 10.0},
            "catchup_compacted": {"s3_get_per_mib": 0.2}, **extra}


def test_a_perf_run_gives_the_counts_and_the_ratios(tmp_path: Path) -> None:
    perf = {"rows": [_perf_row("json", "none"),
                     _perf_row("json", "zstd", ratio_fresh=6.1, ratio_compacted=7.2),
                     {"section": "compression", "corpus": "access", "codec": "zstd",
                      "broker": "this", "error": "refused"}]}
    path = tmp_path / "perf-x.json"
    path.write_text(json.dumps(perf))
    saved = tmp_path / "inputs.json"
    assert cm.main(["--from-perf", str(path), "--save-inputs", str(saved),
                    "--write", str(tmp_path / "cost.md")]) == 0
    got = json.loads(saved.read_text())
    assert got["llog"]["requests_per_mib"] == {
        "s3_put": 2.0, "oxia": 2.5, "wal_objects": 1.5, "chunk_objects": 0.1,
        "s3_get_read_compacted": 0.2}
    assert got["llog"]["flushes_per_s"] == 30.0
    assert got["corpora"]["json"]["zstd"]["wal_ratio"] == 6.1
    assert got["corpora"]["json"]["zstd"]["chunk_ratio"] == 7.2
    # A refused row leaves the ratios it would have measured as they were.
    assert got["corpora"]["access"] == INPUTS["corpora"]["access"]
    assert "perf-x" in got["ratios_source"]
    assert (tmp_path / "cost.md").read_text() == cm.render(got)
