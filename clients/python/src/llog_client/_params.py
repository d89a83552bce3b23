"""Arguments both clients take the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from llog_client._models import Record, RecordLike

DEFAULT_FETCH_BYTES: Final = 4 * 1024 * 1024
# A long-poll well under the broker's ceiling (LLOG_MAX_WAIT_MS_CEILING, 30 s by default).
DEFAULT_WAIT_MS: Final = 10_000


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()  # "leave as it is", where None means "clear"


def as_records(records: Iterable[RecordLike] | RecordLike) -> Iterable[RecordLike]:
    """One record is a record, not an iterable of characters or byte values."""
    if isinstance(records, str | bytes | Record):
        return [records]
    return records


def topic_config(retention_ms: int | None, retention_bytes: int | None,
                 max_record_bytes: int | None, compression: str | None = None,
                 compression_level: int | None = None) -> dict[str, object]:
    """The fields of a topic create (None: not sent; no compression: the broker's
    default, LLOG_TOPIC_DEFAULT_COMPRESSION)."""
    return {"retention_ms": retention_ms, "retention_bytes": retention_bytes,
            "max_record_bytes": max_record_bytes, "compression": compression,
            "compression_level": compression_level}


def topic_changes(partitions: int | None, retention_ms: object, retention_bytes: object,
                  max_record_bytes: object, compression: object = UNSET,
                  compression_level: int | None = None) -> dict[str, object]:
    """The fields of a topic update that were given (``partitions`` when not None, the
    limits when not :data:`UNSET`), checked to be numbers or None; ``compression``
    (a codec name) with its level (None: the codec's default), sent together."""
    wanted: Mapping[str, object] = {
        "partitions": UNSET if partitions is None else partitions,
        "retention_ms": retention_ms, "retention_bytes": retention_bytes,
        "max_record_bytes": max_record_bytes}
    out: dict[str, object] = {}
    for name, value in wanted.items():
        if value is UNSET:
            continue
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{name} must be an integer or None, not {value!r}")
        out[name] = value
    if compression is not UNSET:
        out["compression"], out["compression_level"] = compression, compression_level
    return out


def as_topics(topics: Iterable[str] | str) -> list[str]:
    """One topic is a topic, not an iterable of characters."""
    return [topics] if isinstance(topics, str) else list(topics)


def reset_entry(topic: str, partition: int | None, to: str | None, timestamp_ms: int | None,
                offset: int | None) -> dict[str, object]:
    """One entry of a reset-offsets request: exactly one of the three targets."""
    targets = {"to": to, "timestamp_ms": timestamp_ms, "offset": offset}
    given = {k: v for k, v in targets.items() if v is not None}
    if len(given) != 1:
        raise ValueError("give exactly one of to, timestamp_ms and offset")
    entry: dict[str, object] = {"topic": topic, **given}
    if partition is not None:
        entry["partition"] = partition
    return entry
