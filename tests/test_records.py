"""Pure unit tests of the JSON records kept in Oxia (app/storage/metadata.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import CorruptData
from app.storage.metadata import (
    Compaction,
    CompactionCursor,
    CompactorClaim,
    Control,
    IndexEntry,
    Pending,
)

PROPS = settings(max_examples=200, deadline=None)

ints = st.integers(min_value=0, max_value=2**63 - 1)
uris = st.builds(lambda k: f"s3://leaderless-log-wal/llog/wal-shared/{k}", st.uuids())
opt_int = st.none() | ints
json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
)


def extras_for(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    known = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
    keys = st.text(min_size=1, max_size=12).filter(lambda k: k not in known)
    return st.dictionaries(keys, json_values, max_size=3)


@st.composite
def pendings(draw: st.DrawFn, with_extra: bool = False) -> Pending:
    start = draw(st.integers(min_value=1, max_value=2**62))
    count = draw(st.integers(min_value=1, max_value=100_000))
    sliced = draw(st.booleans())
    return Pending(
        append_id=str(draw(st.uuids())),
        start_offset=start,
        end_offset=start + count - 1,
        msg_count=count,
        data_key=draw(uris),
        entry_type=draw(st.sampled_from(["WAL", "COMPACTED"])),
        byte_offset=draw(ints) if sliced else None,
        byte_length=draw(ints) if sliced else None,
        created_at_ms=draw(ints),
        crc32c=draw(st.none() | st.integers(min_value=0, max_value=2**32 - 1)),
        extra=draw(extras_for(Pending)) if with_extra else {},
    )


@st.composite
def index_entries(draw: st.DrawFn) -> IndexEntry:
    sliced = draw(st.booleans())
    return IndexEntry(
        type=draw(st.sampled_from(["WAL", "COMPACTED"])),
        msg_count=draw(st.integers(min_value=1, max_value=2**31)),
        data_key=draw(uris),
        byte_offset=draw(ints) if sliced else None,
        byte_length=draw(ints) if sliced else None,
        created_at_ms=draw(ints),
        crc32c=draw(st.none() | st.integers(min_value=0, max_value=2**32 - 1)),
        append_id=draw(st.none() | st.uuids().map(str)),
    )


controls = st.builds(
    Control,
    log_state=st.sampled_from(["OPEN", "FENCED"]),
    sequence_counter=ints,
    pending=st.none() | pendings(),
)


@st.composite
def compactions(draw: st.DrawFn) -> Compaction:
    start = draw(st.integers(min_value=1, max_value=2**62))
    count = draw(st.integers(min_value=2, max_value=100_000))
    return Compaction(
        compaction_id=str(draw(st.uuids())),
        state=draw(st.sampled_from(["WRITING_COMPACTED_INDEX", "DELETING_OLD", "UPDATING_CURSOR"])),
        start_offset=start,
        end_offset=start + count - 1,
        msg_count=count,
        data_key=draw(uris),
        tail_entry_start_offset=draw(st.integers(min_value=start, max_value=start + count - 1)),
        created_at_ms=draw(ints),
        crc32c=draw(st.none() | st.integers(min_value=0, max_value=2**32 - 1)),
    )


# -- round trips ------------------------------------------------------------------------


@PROPS
@given(controls)
def test_control_round_trip(control: Control) -> None:
    raw = control.to_json()
    assert Control.from_json(raw) == control
    assert json.loads(raw) == control.to_dict()


@PROPS
@given(pendings())
def test_pending_round_trip(pending: Pending) -> None:
    assert Pending.from_json(pending.to_json()) == pending
    assert Pending.from_dict(pending.to_dict()) == pending


@PROPS
@given(index_entries())
def test_index_entry_round_trip(entry: IndexEntry) -> None:
    assert IndexEntry.from_json(entry.to_json()) == entry
    assert entry.is_slice == (entry.byte_offset is not None)


@PROPS
@given(compactions())
def test_compaction_round_trip(compaction: Compaction) -> None:
    assert Compaction.from_json(compaction.to_json()) == compaction


@PROPS
@given(ints)
def test_compaction_cursor_round_trip(offset: int) -> None:
    cursor = CompactionCursor(offset=offset)
    assert CompactionCursor.from_json(cursor.to_json()) == cursor
    assert json.loads(cursor.to_json()) == {"offset": offset}


@PROPS
@given(st.text(min_size=1, max_size=20), ints)
def test_compactor_claim_round_trip(compactor_id: str, claimed_at_ms: int) -> None:
    claim = CompactorClaim(compactor_id=compactor_id, claimed_at_ms=claimed_at_ms)
    assert CompactorClaim.from_json(claim.to_json()) == claim
    assert json.loads(claim.to_json()) == {"compactor_id": compactor_id,
                                           "claimed_at_ms": claimed_at_ms}


# -- exact JSON of PROTOCOL.md ----------------------------------------------------------


def test_initial_control_and_cursor_json() -> None:
    assert Control().to_json() == b'{"log_state":"OPEN","sequence_counter":0,"pending":null}'
    assert CompactionCursor().to_json() == b'{"offset":1}'
    control = Control.from_json(b'{"log_state":"OPEN","sequence_counter":0,"pending":null}')
    assert control == Control()
    assert not control.fenced
    assert Control(log_state="FENCED").fenced


def _pending(**overrides: Any) -> Pending:
    values: dict[str, Any] = {
        "append_id": "7b1c0e4e-0000-4000-8000-000000000001",
        "start_offset": 11,
        "end_offset": 13,
        "msg_count": 3,
        "data_key": "s3://leaderless-log-wal/llog/wal-shared/x",
        "byte_offset": 120,
        "byte_length": 40,
        "created_at_ms": 1_700_000_000_000,
    }
    values.update(overrides)
    return Pending(**values)


def test_pending_json_field_names() -> None:
    data = json.loads(_pending().to_json())
    assert data == {
        "append_id": "7b1c0e4e-0000-4000-8000-000000000001",
        "start_offset": 11,
        "end_offset": 13,
        "msg_count": 3,
        "entry_type": "WAL",
        "data_key": "s3://leaderless-log-wal/llog/wal-shared/x",
        "encoding": "bytes-batch-v1",
        "byte_offset": 120,
        "byte_length": 40,
        "created_at_ms": 1_700_000_000_000,
    }
    assert json.loads(_pending(crc32c=99).to_json())["crc32c"] == 99


def test_control_with_pending_json() -> None:
    control = Control(log_state="OPEN", sequence_counter=13, pending=_pending())
    data = json.loads(control.to_json())
    assert set(data) == {"log_state", "sequence_counter", "pending"}
    assert data["sequence_counter"] == 13
    assert data["pending"]["start_offset"] == 11
    assert Control.from_dict(data).pending == _pending()


def test_index_entry_json_field_names() -> None:
    entry = IndexEntry(type="WAL", msg_count=3, data_key="s3://b/k", byte_offset=120,
                       byte_length=40, created_at_ms=5)
    assert json.loads(entry.to_json()) == {
        "type": "WAL",
        "msg_count": 3,
        "data_key": "s3://b/k",
        "encoding": "bytes-batch-v1",
        "byte_offset": 120,
        "byte_length": 40,
        "created_at_ms": 5,
    }
    assert entry.is_slice


def test_index_entry_without_slice_omits_byte_fields() -> None:
    entry = IndexEntry(type="COMPACTED", msg_count=10, data_key="s3://b/k", created_at_ms=5)
    data = json.loads(entry.to_json())
    assert data == {"type": "COMPACTED", "msg_count": 10, "data_key": "s3://b/k",
                    "encoding": "bytes-batch-v1", "created_at_ms": 5}
    assert "byte_offset" not in data
    assert "byte_length" not in data
    assert not entry.is_slice
    assert IndexEntry.from_json(entry.to_json()) == entry


def test_index_entry_optional_fields_present_when_set() -> None:
    entry = IndexEntry(type="WAL", msg_count=1, data_key="s3://b/k", crc32c=7, append_id="a")
    data = json.loads(entry.to_json())
    assert data["crc32c"] == 7
    assert data["append_id"] == "a"


def test_compaction_json_field_names() -> None:
    compaction = Compaction(
        compaction_id="c1",
        state="DELETING_OLD",
        start_offset=1,
        end_offset=10,
        msg_count=10,
        data_key="s3://b/llog/t/partitions/0/data/compacted/u",
        tail_entry_start_offset=8,
        created_at_ms=3,
    )
    assert json.loads(compaction.to_json()) == {
        "compaction_id": "c1",
        "state": "DELETING_OLD",
        "start_offset": 1,
        "end_offset": 10,
        "msg_count": 10,
        "data_key": "s3://b/llog/t/partitions/0/data/compacted/u",
        "encoding": "bytes-batch-v1",
        "created_at_ms": 3,
        "tail_entry_start_offset": 8,
    }


# -- Pending -> IndexEntry --------------------------------------------------------------


@PROPS
@given(pendings())
def test_pending_index_entry_carries_slice(pending: Pending) -> None:
    entry = pending.index_entry()
    assert entry.type == pending.entry_type
    assert entry.msg_count == pending.msg_count
    assert entry.data_key == pending.data_key
    assert entry.encoding == pending.encoding
    assert entry.byte_offset == pending.byte_offset
    assert entry.byte_length == pending.byte_length
    assert entry.created_at_ms == pending.created_at_ms
    assert entry.crc32c == pending.crc32c
    assert entry.append_id == pending.append_id
    assert entry.is_slice == (pending.byte_offset is not None)


def test_pending_covers() -> None:
    pending = _pending()
    assert [o for o in range(9, 16) if pending.covers(o)] == [11, 12, 13]


# -- unknown fields ---------------------------------------------------------------------


def test_control_preserves_unknown_fields() -> None:
    raw = json.dumps({
        "log_state": "FENCED",
        "sequence_counter": 5,
        "pending": {**_pending().to_dict(), "producer_epoch": 4},
        "fenced_by": {"operator": "ops", "at": 123},
        "extra": "a field literally named extra",
    }).encode()
    control = Control.from_json(raw)
    assert control.fenced
    assert control.extra == {"fenced_by": {"operator": "ops", "at": 123},
                             "extra": "a field literally named extra"}
    assert control.pending is not None
    assert control.pending.extra == {"producer_epoch": 4}
    again = json.loads(control.to_json())
    assert again == json.loads(raw)


@settings(max_examples=100, deadline=None)
@given(controls, extras_for(Control), pendings(with_extra=True))
def test_control_round_trip_keeps_arbitrary_unknown_fields(
    control: Control, extra: dict[str, Any], pending: Pending
) -> None:
    control.extra = extra
    control.pending = pending
    raw = control.to_json()
    parsed = Control.from_json(raw)
    assert parsed == control
    assert json.loads(parsed.to_json()) == json.loads(raw)
    for key, value in extra.items():
        assert json.loads(raw)[key] == value


@pytest.mark.parametrize("cls", [IndexEntry, CompactionCursor, Compaction, CompactorClaim])
def test_readers_ignore_unknown_fields(cls: type) -> None:
    samples: dict[type, dict[str, Any]] = {
        IndexEntry: {"type": "WAL", "msg_count": 1, "data_key": "s3://b/k"},
        CompactionCursor: {"offset": 4},
        Compaction: {"compaction_id": "c", "state": "UPDATING_CURSOR", "start_offset": 1,
                     "end_offset": 2, "msg_count": 2, "data_key": "s3://b/k",
                     "tail_entry_start_offset": 2},
        CompactorClaim: {"compactor_id": "c1"},
    }
    data = {**samples[cls], "future": [1, {"x": None}]}
    record = cls.from_dict(data)  # type: ignore[attr-defined]
    assert record.extra == {"future": [1, {"x": None}]}
    assert record.to_dict()["future"] == [1, {"x": None}]


# -- corrupt input ----------------------------------------------------------------------


ALL_RECORDS = [Control, Pending, IndexEntry, CompactionCursor, Compaction, CompactorClaim]


@pytest.mark.parametrize("cls", ALL_RECORDS)
@pytest.mark.parametrize(
    "raw", [b"", b"{", b"not json", b"\xff\xfe\x00", b"\x80", b"[]", b"null", b"1", b'"x"',
            b"{}"]
)
def test_malformed_json_is_corrupt(cls: type, raw: bytes) -> None:
    with pytest.raises(CorruptData):
        cls.from_json(raw)  # type: ignore[attr-defined]


VALID: dict[type, dict[str, Any]] = {
    Control: {"log_state": "OPEN", "sequence_counter": 0, "pending": None},
    Pending: _pending().to_dict(),
    IndexEntry: {"type": "WAL", "msg_count": 1, "data_key": "s3://b/k"},
    CompactionCursor: {"offset": 1},
    Compaction: {"compaction_id": "c", "state": "DELETING_OLD", "start_offset": 1,
                 "end_offset": 2, "msg_count": 2, "data_key": "s3://b/k",
                 "tail_entry_start_offset": 2},
    CompactorClaim: {"compactor_id": "c1", "claimed_at_ms": 0},
}
REQUIRED = {
    Control: ["log_state", "sequence_counter"],
    Pending: ["append_id", "start_offset", "end_offset", "msg_count", "data_key"],
    IndexEntry: ["type", "msg_count", "data_key"],
    CompactionCursor: ["offset"],
    Compaction: ["compaction_id", "state", "start_offset", "end_offset", "msg_count",
                 "data_key", "tail_entry_start_offset"],
    CompactorClaim: ["compactor_id"],
}


@pytest.mark.parametrize("cls", ALL_RECORDS)
def test_valid_samples_parse(cls: type) -> None:
    record = cls.from_json(json.dumps(VALID[cls]).encode())  # type: ignore[attr-defined]
    assert record.extra == {}
    assert {k: v for k, v in record.to_dict().items() if k in VALID[cls]} == VALID[cls]


@pytest.mark.parametrize(
    ("cls", "name"), [(cls, name) for cls, names in REQUIRED.items() for name in names]
)
def test_missing_required_field_is_corrupt(cls: type, name: str) -> None:
    data = {k: v for k, v in VALID[cls].items() if k != name}
    with pytest.raises(CorruptData, match=name):
        cls.from_json(json.dumps(data).encode())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "data",
    [
        {"log_state": "CLOSED", "sequence_counter": 0},
        {"log_state": "open", "sequence_counter": 0},
        {"log_state": None, "sequence_counter": 0},
        {"log_state": ["OPEN"], "sequence_counter": 0},
        {"log_state": "OPEN", "sequence_counter": 0, "pending": 5},
        {"log_state": "OPEN", "sequence_counter": 0, "pending": []},
        {"log_state": "OPEN", "sequence_counter": 0, "pending": {}},
        {"log_state": "OPEN", "sequence_counter": 0,
         "pending": {**_pending().to_dict(), "msg_count": 4}},
    ],
)
def test_malformed_control_is_corrupt(data: dict[str, Any]) -> None:
    with pytest.raises(CorruptData):
        Control.from_dict(data)


@pytest.mark.parametrize(
    "overrides",
    [
        {"msg_count": 4},  # [11, 13] holds 3 records
        {"end_offset": 10},
        {"start_offset": 14, "end_offset": 13, "msg_count": 0},
        {"start_offset": "11"},
        {"end_offset": None},
        {"msg_count": "3"},
    ],
)
def test_inconsistent_pending_is_corrupt(overrides: dict[str, Any]) -> None:
    with pytest.raises(CorruptData):
        Pending.from_dict({**_pending().to_dict(), **overrides})


@pytest.mark.parametrize(
    "overrides",
    [
        {"msg_count": 0},
        {"msg_count": -1},
        {"msg_count": None},
        {"msg_count": "1"},
        {"byte_offset": 5},  # only one of byte_offset/byte_length
        {"byte_length": 5},
    ],
)
def test_inconsistent_index_entry_is_corrupt(overrides: dict[str, Any]) -> None:
    with pytest.raises(CorruptData):
        IndexEntry.from_dict({**VALID[IndexEntry], **overrides})


def test_constructors_validate_too() -> None:
    with pytest.raises(CorruptData):
        IndexEntry(type="WAL", msg_count=0, data_key="s3://b/k")
    with pytest.raises(CorruptData):
        _pending(msg_count=2)


def test_deeply_nested_json_is_corrupt() -> None:
    with pytest.raises(CorruptData):
        Control.from_json(b"[" * 100_000)
