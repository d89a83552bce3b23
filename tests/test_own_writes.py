"""Which control-record versions are this process's own (app/storage/own_writes.py)."""

from __future__ import annotations

from app.storage.keys import TopicPartition
from app.storage.own_writes import REMEMBERED_VERSIONS, OwnWrites

TP = TopicPartition("t", 0)


def _own() -> tuple[OwnWrites, list[TopicPartition]]:
    foreign: list[TopicPartition] = []
    own = OwnWrites(max_partitions=8, on_foreign=foreign.append)
    return own, foreign


def test_a_notification_before_the_write_returns_is_held_and_found_own() -> None:
    own, foreign = _own()
    with own.writing(TP):
        assert own.claims(TP, 7)  # the write has not returned yet
        own.wrote(TP, 7)
    assert foreign == []


def test_a_foreign_version_held_during_a_write_is_reported_when_it_ends() -> None:
    own, foreign = _own()
    with own.writing(TP):
        assert own.claims(TP, 6)  # another process's change, seen meanwhile
        own.wrote(TP, 7)
        assert foreign == []
    assert foreign == [TP]


def test_a_failed_write_reports_what_it_held() -> None:
    own, foreign = _own()
    try:
        with own.writing(TP):
            assert own.claims(TP, 9)
            raise TimeoutError
    except TimeoutError:
        pass
    assert foreign == [TP]


def test_without_a_write_in_flight_an_unknown_version_is_foreign_at_once() -> None:
    own, foreign = _own()
    own.wrote(TP, 3)
    assert own.claims(TP, 3)
    assert not own.claims(TP, 4)
    assert not own.claims(TopicPartition("t", 1), 3)
    assert foreign == []  # the caller acts on False itself


def test_recent_own_versions_are_remembered_not_only_the_last() -> None:
    own, _ = _own()
    for v in range(1, REMEMBERED_VERSIONS + 2):
        own.wrote(TP, v)
    assert own.owns(TP, 2) and own.owns(TP, REMEMBERED_VERSIONS + 1)
    assert not own.owns(TP, 1)  # forgotten: called foreign, which is only late, never wrong


def test_overlapping_writes_decide_when_the_last_one_ends() -> None:
    own, foreign = _own()
    with own.writing(TP):
        with own.writing(TP):
            assert own.claims(TP, 11)
        assert foreign == []
        own.wrote(TP, 11)
    assert foreign == []
