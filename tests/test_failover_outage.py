"""The check that acknowledgements kept coming all through a data server's outage
(tests/helpers/failover.py), on made-up timelines: the cluster test that uses it can
only show it passing."""

from __future__ import annotations

from tests.helpers.failover import late_from, outage_problems

SESSION_S = 3.0
FAILED_AT, RESTORED_AT = 100.0, 130.0


def every(start: float, end: float, step: float = 0.05) -> list[float]:
    return [start + i * step for i in range(round((end - start) / step))]


def problems(acked: list[float], late_least: int = 100) -> list[str]:
    return outage_problems(acked, failed_at=FAILED_AT, restored_at=RESTORED_AT,
                           session_s=SESSION_S, late_least=late_least)


def test_steady_acknowledgements_through_the_outage_pass() -> None:
    assert problems(every(90, 140)) == []


def test_a_slow_takeover_passes_when_acknowledgements_then_keep_coming() -> None:
    # Nothing for 12 s after the failure (an election on a loaded machine), then steady.
    assert problems(every(90, FAILED_AT) + every(112, 140)) == []


def test_acknowledgements_that_stop_mid_outage_fail() -> None:
    # Served by another leader at once, then nothing from +4 s (a session expired)
    # until the server was back.
    found = problems(every(90, 104) + every(RESTORED_AT, 140))
    assert len(found) == 1
    assert found[0].startswith("acknowledgements stopped during the outage")
    assert "then 0 (at least 100 wanted)" in found[0]
    assert "the last at +4.0 s" in found[0]


def test_a_few_late_acknowledgements_are_not_enough() -> None:
    # A trickle after the sessions' end: the count, not its mere presence, is judged.
    acked = [*every(90, 105), 120.0, 125.0, *every(RESTORED_AT, 140)]
    found = problems(acked)
    assert len(found) == 1 and "then 2 (at least 100 wanted)" in found[0]


def test_acknowledgements_only_once_the_server_is_back_fail() -> None:
    found = problems(every(90, FAILED_AT) + every(RESTORED_AT, 140))
    assert len(found) == 1
    assert found[0].startswith("no entry of the lost server's partitions was "
                               "acknowledged in the 30.0 s it was down")


def test_no_acknowledgements_at_all_fail() -> None:
    assert problems([])[0].startswith("no entry")


def test_an_outage_shorter_than_the_late_part_fails() -> None:
    # Restored before two session timeouts passed: the late part was never seen.
    found = outage_problems(every(90, 140), failed_at=FAILED_AT, restored_at=104.0,
                            session_s=SESSION_S, late_least=1)
    assert len(found) == 1 and "then 0 (at least 1 wanted)" in found[0]


def test_the_late_part_begins_two_session_timeouts_after_the_first_acknowledgement() -> None:
    assert late_from([], FAILED_AT, SESSION_S) is None
    assert late_from([99.0], FAILED_AT, SESSION_S) is None  # before the failure
    assert late_from([99.0, 107.5, 108.0], FAILED_AT, SESSION_S) == 113.5
