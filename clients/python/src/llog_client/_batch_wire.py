"""A producer request of sealed batches, and what its answer says of each batch; free
of I/O.

The body is one binary envelope, an entry per batch with the batch's idempotency key
(docs/http-api.md, Binary bodies). The answer is the JSON of ``POST /produce``: one result
per entry, in order, each acknowledged or failed on its own (a 409 mixes both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llog_client import _codec as codec
from llog_client import _wire as wire
from llog_client._accumulator import Batch
from llog_client._errors import LlogError
from llog_client._wire import Broken, Outcome

# Statuses whose body holds one result per entry.
_RESULT_STATUSES = (200, 409, 503)


def body(batch: Batch) -> tuple[int, list[bytes]]:
    """The batch as a body (in parts) and its encoding code: bytes-batch-v3, or v2 for
    headers."""
    if batch.headers is not None:
        return codec.V2, [codec.encode_v2(batch.values, batch.keys, batch.timestamps,
                                          batch.headers)]
    return codec.V3, codec.v3_parts(batch.values, batch.keys, batch.timestamps)


def envelope(batches: Sequence[Batch]) -> bytes:
    entries = []
    for batch in batches:
        topic, partition, _ = batch.route
        code, parts = body(batch)
        entries.append((topic.encode(), partition, batch.idempotency_key.encode(), code,
                        parts))
    return codec.envelope(entries)


Settled = tuple[int, bool] | LlogError  # (first offset, duplicate) or the batch's error


def _result(result: Mapping[str, Any], reply: wire.Reply) -> Settled:
    if result.get("ok"):
        return int(result["start_offset"]), bool(result.get("duplicate"))
    return wire.entry_error(result, reply)


def settle(batches: Sequence[Batch], outcome: Outcome) -> tuple[list[Settled], list[int]]:
    """What the answer says of each batch, and the partitions the broker placed them in
    (a batch sent by key learns its partition from its result)."""
    if isinstance(outcome, Broken):
        error: LlogError = wire.broken_error(outcome)
        return [error] * len(batches), [b.partition for b in batches]
    results = None
    if outcome.status in _RESULT_STATUSES and isinstance(outcome.body, dict):
        found = outcome.body.get("results")
        if isinstance(found, list) and len(found) == len(batches):
            results = found
    if results is None:
        error = wire.reply_error(outcome)
        return [error] * len(batches), [b.partition for b in batches]
    placed = [int(r.get("partition", b.partition)) if isinstance(r, dict) else b.partition
              for r, b in zip(results, batches, strict=True)]
    return [_result(r, outcome) if isinstance(r, dict) else wire.reply_error(outcome)
            for r in results], placed
