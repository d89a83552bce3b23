"""A record of the log with more than a value: a key, headers, a producer timestamp.

Plain records travel as ``bytes`` everywhere (the common case costs nothing extra);
a :class:`LogRecord` carries the rest. Bodies holding any of them are encoded as
bytes-batch-v2 (docs/protocol.md, Encodings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class LogRecord:
    value: bytes
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int | None = None  # the producer's, if it gave one
    # When the broker appended it; 0 in a WAL body means "the entry's append time".
    append_time_ms: int = 0

    @property
    def size(self) -> int:
        """Bytes counted against budgets: value, key, header names and values."""
        return (len(self.value) + len(self.key or b"")
                + sum(len(n.encode()) + len(v) for n, v in self.headers))

    @property
    def plain(self) -> bool:
        return self.key is None and not self.headers and self.timestamp_ms is None


Payload = bytes | LogRecord
"""What a body holds per offset: plain bytes, or a record with more than a value."""


def payload_size(payload: Payload) -> int:
    return len(payload) if isinstance(payload, bytes) else payload.size


def payload_value(payload: Payload) -> bytes:
    return payload if isinstance(payload, bytes) else payload.value


def all_plain(payloads: Sequence[Payload]) -> bool:
    return all(isinstance(p, bytes) or p.plain for p in payloads)
