"""A producer request of sealed batches, and what its answer says of each batch; free
of I/O.

The body is one binary envelope, an entry per batch with the batch's producer sequence
or, placed by key, its idempotency key (docs/http-api.md, Binary bodies). The answer is
the JSON of ``POST /produce``: one result per entry, in order, each acknowledged or
failed on its own (a 409 mixes both).
"""

from __future__ import annotations

from collections.abc import Sequence

from llog_client import _codec as codec
from llog_client import _wire as wire
from llog_client._accumulator import Batch
from llog_client._errors import LlogError, UnexpectedResponse
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
    """LLP2 when a batch carries its producer's sequence, LLP1 otherwise."""
    entries = []
    producers: list[tuple[bytes, int] | None] = []
    for batch in batches:
        topic, partition, _ = batch.route
        code, parts = body(batch)
        entries.append((topic.encode(), partition, batch.idempotency_key.encode(), code,
                        parts))
        producers.append((batch.producer_id.encode(), batch.sequence)
                         if batch.producer_id else None)
    sequenced = any(p is not None for p in producers)
    return codec.envelope(entries, producers if sequenced else None)


Settled = tuple[int, bool] | LlogError  # (first offset, duplicate) or the batch's error


def _result(result: object, reply: wire.Reply) -> Settled:
    if not isinstance(result, dict):
        return outside_contract(reply, ValueError("a result is not an object"))
    if result.get("ok"):
        offset = result.get("start_offset")
        if type(offset) is not int or offset < 0:
            return outside_contract(reply, ValueError(f"start_offset {offset!r}"))
        return offset, bool(result.get("duplicate"))
    return wire.entry_error(result, reply)


def outside_contract(outcome: Outcome, exc: Exception) -> LlogError:
    """An answer the client cannot read: it may have written. As the blocking client
    does, only a server error's is retried (a broker that answers success in another
    shape would answer every retry so too)."""
    status = outcome.status if isinstance(outcome, wire.Reply) else None
    return UnexpectedResponse(f"an answer outside the contract: {exc}", status=status,
                              retriable=status is None or status >= 500,
                              maybe_written=True)


def settle(batches: Sequence[Batch], outcome: Outcome) -> tuple[list[Settled], list[int]]:
    """What the answer says of each batch, and the partitions the broker placed them in
    (a batch sent by key learns its partition from its result)."""
    keep = [b.partition for b in batches]
    if isinstance(outcome, Broken):
        error: LlogError = wire.broken_error(outcome)
        return [error] * len(batches), keep
    results = None
    if outcome.status in _RESULT_STATUSES and isinstance(outcome.body, dict):
        found = outcome.body.get("results")
        if isinstance(found, list) and len(found) == len(batches):
            results = found
    if results is None:
        return [wire.reply_error(outcome)] * len(batches), keep
    placed = [_partition(r, b.partition) for r, b in zip(results, batches, strict=True)]
    return [_result(r, outcome) for r in results], placed


def _partition(result: object, sent: int) -> int:
    found = result.get("partition") if isinstance(result, dict) else None
    return found if type(found) is int and found >= 0 else sent
