"""Oxia's NotificationBatch read by hand (app/stores/oxia/notification_wire.py), against the
oxia client's own decoder on the same bytes: every field, absent optional ones, values
that are negative on the wire, fields it does not know, and bytes that are not a batch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from oxia.internal.proto.io.streamnative.oxia import proto as pb

from app.stores.oxia.notification_wire import (
    Change,
    MalformedBatch,
    Refused,
    parse_batch,
    read_batch,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
KEYS = st.text(min_size=0, max_size=40)
NOTIFICATIONS = st.builds(
    lambda type_, version, last: pb.Notification(
        type=pb.NotificationType(type_), version_id=version, key_range_last=last),
    st.integers(0, 3), st.none() | INT64, st.none() | KEYS)
BATCHES = st.builds(
    lambda shard, offset, stamp, notes: pb.NotificationBatch(
        shard=shard, offset=offset, timestamp=stamp, notifications=notes),
    INT64, INT64, st.integers(0, 2**64 - 1), st.dictionaries(KEYS, NOTIFICATIONS, max_size=12))


def _expected(batch: pb.NotificationBatch) -> list[Change]:
    """What the client's decoder makes of each change, as the client's worker reads it
    (an absent version is 0)."""
    return [Change(key, int(n.type), n.version_id or 0, n.key_range_last)
            for key, n in batch.notifications.items()]


@given(BATCHES)
def test_a_batch_reads_as_the_clients_decoder_reads_it(batch: pb.NotificationBatch) -> None:
    raw = bytes(batch)
    theirs = pb.NotificationBatch.FromString(raw)
    mine = parse_batch(raw)
    assert (mine.shard, mine.offset) == (theirs.shard, theirs.offset)
    assert mine.changes == _expected(theirs)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


UNKNOWN = (_field(9, 0, _varint(300)) + _field(10, 1, b"\x01" * 8)
           + _field(11, 2, _varint(3) + b"abc") + _field(12, 5, b"\x02" * 4))


def test_fields_it_does_not_know_are_skipped_at_every_level() -> None:
    note = bytes(pb.Notification(type=pb.NotificationType.KEY_MODIFIED, version_id=7))
    entry = _field(1, 2, _varint(3) + b"k/1") + UNKNOWN + _field(2, 2, _varint(
        len(note + UNKNOWN)) + note + UNKNOWN)
    raw = (UNKNOWN + bytes(pb.NotificationBatch(shard=2, offset=41))
           + _field(4, 2, _varint(len(entry)) + entry) + UNKNOWN)
    batch = parse_batch(raw)
    assert (batch.shard, batch.offset) == (2, 41)
    assert batch.changes == [Change("k/1", 1, 7, None)]


@pytest.mark.parametrize("raw", [
    b"\x08",                                   # a varint cut off
    b"\x08" + b"\xff" * 11,                    # a varint that never ends
    _field(4, 2, _varint(10) + b"abc"),        # an entry longer than the batch
    _field(4, 2, _varint(2) + _field(1, 2, _varint(5))),  # a key longer than its entry
    _field(4, 2, _varint(4) + _field(1, 2, _varint(2) + b"\xff\xfe")),  # not UTF-8
    _field(5, 3, b""),                         # a group (wire type 3)
    _field(5, 6, b""),                         # no such wire type
])
def test_bytes_that_are_not_a_batch_are_refused(raw: bytes) -> None:
    with pytest.raises(MalformedBatch):
        parse_batch(raw)


def test_an_empty_batch_is_the_first_message_of_a_stream() -> None:
    assert parse_batch(b"") == (0, 0, [])
    assert parse_batch(bytes(pb.NotificationBatch(shard=1, offset=9))) == (1, 9, [])


def test_the_streams_decoder_answers_bad_bytes_with_how_far_it_read() -> None:
    """gRPC leaves a stream whose decoder raised open for good: the stream's decoder
    answers instead, with the shard and offset when they were read, so the batch can be
    skipped."""
    good = bytes(pb.NotificationBatch(shard=3, offset=77, notifications={
        "k": pb.Notification(type=pb.NotificationType.KEY_MODIFIED, version_id=5)}))
    assert read_batch(good) == parse_batch(good)
    cut = read_batch(good[:-2])
    assert isinstance(cut, Refused) and (cut.shard, cut.offset) == (3, 77)
    assert read_batch(b"\x08\x03\x10") == Refused(3, None, "a varint runs past its message")
    assert read_batch(b"\xff") == Refused(None, None, "a varint runs past its message")
