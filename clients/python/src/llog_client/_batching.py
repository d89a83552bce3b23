"""Cutting records into produce requests: consecutive records bound for the same place
form an entry, entries fill a request up to the limits, and every entry gets its own
idempotency key, kept across its retries."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llog_client._models import RecordLike
from llog_client._retry import ProduceLimits
from llog_client._wire import dumps, record_json, record_key

_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,100}$")
# Bytes of an entry besides its records ({"topic":…,"partition":…,"idempotency_key":…,
# "records":[]}), with room for the longest partition number and key.
_ENTRY_OVERHEAD = 200
_REQUEST_OVERHEAD = 32

# Where a record goes: a partition number, or its key (the broker picks the partition).
Route = int | bytes


class KeySource:
    """Idempotency keys: ``{prefix}.{n}``. The client's prefix is random, so two
    clients never share a key; a caller's own prefix (``produce(idempotency_key=…)``)
    makes a later call with the same records and limits reuse the same keys."""

    def __init__(self, prefix: str | None = None) -> None:
        if prefix is not None and not _PRINTABLE.match(prefix):
            raise ValueError("an idempotency key is 1 to 100 printable ASCII characters "
                             "(no spaces)")
        self._prefix = prefix or uuid.uuid4().hex
        self._numbers = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}.{next(self._numbers)}"


@dataclass
class Entry:
    """One ``topic_partitions`` entry of a produce request, its records already JSON."""

    topic: str
    route: Route
    idempotency_key: str
    first_index: int
    records: list[bytes] = field(default_factory=list)

    def encode(self) -> bytes:
        head: dict[str, object] = {"topic": self.topic, "idempotency_key": self.idempotency_key}
        if isinstance(self.route, int):
            head["partition"] = self.route
        return dumps(head)[:-1] + b',"records":[' + b",".join(self.records) + b"]}"


def request_body(entries: list[Entry]) -> bytes:
    return b'{"topic_partitions":[' + b",".join(e.encode() for e in entries) + b"]}"


def _route(record: RecordLike, partition: int | None) -> Route:
    """The given partition; else the record's key; keyless records go to partition 0."""
    if partition is not None:
        return partition
    key = record_key(record)
    return 0 if key is None else key


class _Request:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.size = _REQUEST_OVERHEAD
        self.count = 0

    def fits(self, size: int, new_entry: bool, limits: ProduceLimits) -> bool:
        if not self.entries:
            return True  # a record too large for any request is still sent, alone
        return (self.size + size <= limits.max_request_bytes
                and self.count < limits.max_records_per_request
                and not (new_entry and len(self.entries) >= limits.max_entries_per_request))


def plan_requests(topic: str, records: Iterable[RecordLike], partition: int | None,
                  limits: ProduceLimits, keys: KeySource) -> Iterator[list[Entry]]:
    """The records as produce requests, lazily: a long input is sent while it is read."""
    request = _Request()
    for index, record in enumerate(records):
        encoded = dumps(record_json(record))
        route = _route(record, partition)
        new_entry = not request.entries or request.entries[-1].route != route
        size = len(encoded) + 1 + (_ENTRY_OVERHEAD + len(topic) if new_entry else 0)
        if not request.fits(size, new_entry, limits):
            yield request.entries
            request = _Request()
            new_entry = True
            size = len(encoded) + 1 + _ENTRY_OVERHEAD + len(topic)
        if new_entry:
            request.entries.append(Entry(topic, route, keys.next(), index))
        request.entries[-1].records.append(encoded)
        request.size += size
        request.count += 1
    if request.entries:
        yield request.entries
