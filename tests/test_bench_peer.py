"""bench/peer.py and bench/peer_clients.py: the llog/Kafka tables from the two sides' rows,
and the producers' schedule and latency figures (no timing: a clock the test moves)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import peer  # noqa: E402
import peer_clients  # noqa: E402


def _row(op: str, who: str, mib_per_s: float, size: int = 1024, **extra: Any
         ) -> dict[str, Any]:
    return peer.row(op, who, size, {"mib_per_s": mib_per_s, "records_per_s": mib_per_s * 1024,
                                    "cpu_us_per_record": 3.0, "box_cpu_cores": 1.5}, **extra)


def test_table_sets_each_llog_row_against_go_and_each_kafka_client() -> None:
    llog = {"rows": [_row("produce", "go-binary", 100.0), _row("produce", "llog-producer", 80.0),
                     _row("produce", "go-binary", 50.0, size=100),
                     peer.row("produce", "llog-producer", 100, {"error": "no Producer"}),
                     _row("catchup_fresh", "go", 200.0),
                     _row("catchup_fresh", "llog-consumer", 160.0),
                     _row("catchup_compacted", "llog-consumer", 100.0)]}
    kafka = {"rows": [_row("produce", "confluent-kafka", 160.0), _row("produce", "aiokafka", 40.0),
                      _row("catchup", "confluent-kafka", 400.0), _row("catchup", "aiokafka", 200.0),
                      _row("paced", "aiokafka", 20.0)]}
    rows = peer.table(llog, kafka)
    assert [(r["figure"], r["system"], r["client"]) for r in rows] == [
        ("produce, 100 B", "llog", "go-binary"), ("produce, 100 B", "llog", "llog-producer"),
        ("produce, 1 KiB", "llog", "go-binary"), ("produce, 1 KiB", "llog", "llog-producer"),
        ("produce, 1 KiB", "Kafka", "confluent-kafka"), ("produce, 1 KiB", "Kafka", "aiokafka"),
        ("catch-up fresh, 1 KiB", "llog", "go"), ("catch-up fresh, 1 KiB", "llog", "llog-consumer"),
        ("catch-up compacted, 1 KiB", "llog", "llog-consumer"),
        ("catch-up, 1 KiB", "Kafka", "confluent-kafka"), ("catch-up, 1 KiB", "Kafka", "aiokafka")]
    producer = rows[3]
    assert (producer["of_go"], producer["of_confluent"], producer["of_aiokafka"]) == (0.8, 0.5, 2.0)
    assert producer["cpu_us_per_record"] == 3.0 and producer["label"] == "llog_client Producer"
    failed = rows[1]
    assert failed["error"] == "no Producer" and failed["mib_per_s"] is None
    assert failed["of_go"] is None  # a failed row has no ratio
    assert rows[2]["of_go"] is None  # the Go row is the reference itself
    assert rows[4]["of_go"] is None and rows[4]["of_aiokafka"] == 4.0  # Kafka: no Go row
    assert rows[7]["of_go"] == 0.8 and rows[7]["of_confluent"] == 0.4
    assert rows[8]["of_go"] is None  # no Go read of the compacted partitions here
    assert rows[10]["of_confluent"] == 0.5


def test_paced_sets_the_target_from_the_linger_and_go_s_p99() -> None:
    go = {"latency_ms": {"p50_ms": 4.0, "p99_ms": 12.0}}
    llog = {"rows": [
        peer.row("paced", "llog-producer", 1024, {"latency_ms": {"p50_ms": 9.0, "p99_ms": 26.0},
                                                  "linger_ms": 5, "rate_records_per_s": 1e4},
                 of_max=0.5, go=go),
        peer.row("paced", "llog-async-producer", 1024,
                 {"latency_ms": {"p50_ms": 9.0, "p99_ms": 28.0}, "linger_ms": 5}, go=go)]}
    kafka = {"rows": [peer.row("paced", "aiokafka", 1024, {"latency_ms": {"p99_ms": 7.0},
                                                          "linger_ms": 5})]}
    rows = peer.paced(llog, kafka)
    assert [(r["target_p99_ms"], r["met"]) for r in rows] == [(27.0, True), (27.0, False),
                                                              (None, None)]


def test_a_paced_row_says_whether_go_kept_up_with_the_rate() -> None:
    def paced_row(go_records_per_s: float | None) -> dict[str, object]:
        go = {"latency_ms": {"p99_ms": 12.0}, "records_per_s": go_records_per_s}
        return peer.row("paced", "llog-producer", 1024, {
            "latency_ms": {"p99_ms": 20.0}, "linger_ms": 5, "rate_records_per_s": 1e4}, go=go)

    rows = peer.paced({"rows": [paced_row(9_800.0), paced_row(9_000.0), paced_row(None)]},
                      {"rows": []})
    assert [r["go_kept_up"] for r in rows] == [True, False, None]
    assert [r["met"] for r in rows] == [True, True, True]  # met, the second leniently


def test_a_paced_go_request_carries_what_the_producer_s_requests_carried() -> None:
    shape = (4, 25, 1024)
    producer = {"producer_metrics": {"requests": 1_000, "records_sent": 700_000}}
    assert peer.paced_shape(shape, producer) == (4, 175, 1024)
    small = {"producer_metrics": {"requests": 1_000, "records_sent": 40_000}}
    assert peer.paced_shape(shape, small) == shape  # never fewer than the shape's
    assert peer.paced_shape(shape, {"error": "failed"}) == shape


def test_go_requests_carry_at_least_100_kib_of_records() -> None:
    assert [peer.shape_for(n) for n in (100, 1024, 10240)] == [
        (4, 256, 100), (4, 25, 1024), (4, 3, 10240)]
    assert peer.paced_bytes([100, 10240]) == 100 and peer.paced_bytes([100, 1024]) == 1024


def test_a_paced_schedule_sends_what_is_due_and_waits_for_the_next() -> None:
    now = [100.0]  # the clock: the test moves it
    schedule = peer_clients.Schedule(
        peer_clients.Options(seconds=1.0, rate=1000.0, time_every=1), lambda: now[0])
    assert schedule.burst() == range(0, 1) and schedule.due(0) == 100.0
    assert abs(schedule.pause() - 0.001) < 1e-9
    now[0] += 0.0009  # the next is due in 0.1 ms: it waits a tick, with the ones after it
    assert schedule.burst() == range(1, 1) and schedule.pause() == peer_clients.TICK_S
    now[0] -= 0.0009
    now[0] += 0.0105  # late: every record due by now goes at once, each with its due time
    assert schedule.burst() == range(1, 11) and abs(schedule.due(10) - 100.010) < 1e-9
    assert schedule.burst() == range(11, 11)  # nothing more is due yet
    now[0] += 1.0
    assert schedule.burst() is None


def test_a_paced_warm_up_is_sent_but_not_timed() -> None:
    now = [100.0]
    o = peer_clients.Options(seconds=1.0, rate=10.0, warmup=0.5, time_every=1)
    schedule = peer_clients.Schedule(o, lambda: now[0])
    now[0] += 0.75
    assert schedule.burst() == range(0, 8)
    assert [schedule.due(i) is None for i in (0, 4, 5, 7)] == [True, True, False, False]
    now[0] += 0.7  # the measured second runs from the warm-up's end
    assert schedule.burst() == range(8, 15)
    now[0] += 0.1
    assert schedule.burst() is None


def test_a_paced_run_times_one_record_in_time_every_of_every_partition() -> None:
    o = peer_clients.Options(seconds=1.0, rate=1000.0)  # the default: one in 17
    schedule = peer_clients.Schedule(o, lambda: 100.0)
    timed = [i for i in range(1000) if schedule.due(i) is not None]
    assert timed[:3] == [0, 17, 34] and len(timed) == 59
    due = schedule.due(17)
    assert due is not None and abs(due - 100.017) < 1e-9
    # 17 is prime to the partitions records go round (i % 4): each has its share timed.
    assert {i % peer_clients.PARTITIONS for i in timed} == {0, 1, 2, 3}
    with pytest.raises(SystemExit):
        peer_clients.parse(["llog-producer", "http://x", "t", "--time-every", "0"])


def test_an_unpaced_schedule_sends_bursts_until_the_mib_are_sent() -> None:
    o = peer_clients.Options(mib=1.0, record_bytes=100_000)  # 11 records
    schedule = peer_clients.Schedule(o, lambda: 100.0)
    assert schedule.burst() == range(0, 11) and schedule.due(0) is None
    assert schedule.pause() == 0.0 and schedule.burst() is None


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    got = peer_clients.percentiles([i / 1000 for i in range(1, 101)])
    assert (got["count"], got["p50_ms"], got["p99_ms"], got["max_ms"]) == (100, 50, 99, 100)
    assert peer_clients.percentiles([]) == {"count": 0}


def test_a_tally_counts_failures_apart_and_times_only_paced_records() -> None:
    tally = peer_clients.Tally()
    tally.outcome(None, None)
    tally.outcome(None, 0.0)
    tally.outcome(ValueError("refused"), 0.0)
    assert (tally.acked, tally.errors, len(tally.latencies)) == (2, 1, 1)
    assert tally.error_sample == "ValueError('refused')"
    values = peer_clients.values_of(100)
    assert len(set(values)) == len(values) == 65536
    assert all(len(v) == 100 and v.isascii() for v in values)
