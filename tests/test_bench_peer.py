"""bench/peer.py: the llog/Kafka table from the two sides' rows."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import peer  # noqa: E402


def _row(mib_per_s: float) -> dict[str, float]:
    return {"mib_per_s": mib_per_s, "box_cpu_cores": 1.5}


def test_table_sets_each_llog_figure_against_kafka_s() -> None:
    llog = {"produce_json": _row(20.0), "produce_binary": _row(40.0),
            "catchup_fresh_python": _row(10.0), "catchup_compacted_go": _row(200.0)}
    kafka = {"produce": _row(200.0), "catchup": _row(400.0)}
    rows = {r["figure"]: r for r in peer.table(llog, kafka)}
    assert [r["ratio"] for r in rows.values()] == [0.1, 0.2, 0.025, 0.5]
    assert len(rows) == 4  # figures a side did not measure are left out
    assert peer.table(llog, {"produce": _row(0.0)})[0]["ratio"] is None
