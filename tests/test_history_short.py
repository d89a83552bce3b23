"""The history checker's short run in CI (docs/testing.md, "Histories"): seeded 45 s
of clients through two brokers while the nemesis kills, pauses and slows them and
deletes a topic, then the checker reads the whole history. Any anomaly fails the run,
and the report names each with its entries; the history, report.json and the plot stay
in the test's temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.history.checker import KINDS
from tests.history.run import run

pytestmark = [pytest.mark.own_servers, pytest.mark.slow]

SEED = 20261205
SECONDS = 45.0


def test_a_short_seeded_history_has_no_anomaly(tmp_path: Path) -> None:
    report = run(tmp_path / "history", seconds=SECONDS, seed=SEED)
    summary = report.summary()
    print(json.dumps(summary, indent=1))
    found = {k: [a.what for a in v[:5]] for k, v in report.anomalies.items() if v}
    assert report.valid, f"anomalies (see {tmp_path / 'history'}): {found}"
    # The run did what it is for: every client kind acted, faults were applied, and the
    # checker had acknowledged writes and reads to check.
    outcomes = summary["outcomes"]
    for f in ("produce", "poll", "group_poll", "group_commit", "final_read", "nemesis"):
        assert outcomes.get(f, {}).get("ok", 0) > 0, (f, outcomes)
    assert summary["checked"]["acknowledged"] > 100 and summary["checked"]["reads"] > 100
    assert set(summary["anomalies"]) == set(KINDS)
