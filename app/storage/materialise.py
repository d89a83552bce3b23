"""Materialising a pending append on its own (docs/protocol.md, "Materialising a
pending record on its own"): create its index entry, then clear ``pending`` by CAS.

Writers do this as part of their next commit; this standalone form serves compaction
(before it selects a run), repair tools and the Spark jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from app.errors import VersionMismatch
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control, Pending
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec


def index_entry_put(layout: KeyLayout, tp: TopicPartition, pending: Pending) -> PutSpec:
    """Create-if-absent of the pending append's index entry.

    Never an unconditional put: "exists" means it was materialised already, or compaction
    has replaced it with a COMPACTED entry, which must never be overwritten.
    """
    return PutSpec(layout.index(tp, pending.end_offset), pending.index_entry().to_json(),
                   tp.partition_key, EXPECT_NOT_EXISTS)


async def ensure_index_entry(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                             pending: Pending, created: int | Exception) -> None:
    """After a CAS that retired ``pending`` in the same request as its index entry's
    create: the entry must exist now.

    It does whenever Oxia applied the request as one entry (``created`` is a version, or
    "exists"); should the create ever have failed on its own, it is written now, from
    the retired append this process still holds.
    """
    if isinstance(created, int | VersionMismatch):
        return
    put = index_entry_put(layout, tp, pending)
    (outcome,) = await oxia.put_group([put])
    if isinstance(outcome, Exception) and not isinstance(outcome, VersionMismatch):
        raise outcome


@dataclass(frozen=True)
class Materialised:
    """What :func:`materialise_pending` found and did.

    ``done``: this call cleared a pending append. ``control``/``version``: the control
    record as last read or written (None when the partition does not exist).
    """

    done: bool
    control: Control | None
    version: int | None


async def materialise_pending(
    oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition, *, attempts: int,
    metrics: StoreMetrics | None, by: str, min_age_ms: int = 0, clock: Callable[[], int],
) -> Materialised:
    """Materialise the partition's pending append, if any and at least ``min_age_ms`` old.

    A version conflict is settled by reading again: if the same append is still
    pending (fencing moved the version) the CAS is retried; if another one is, someone
    else retired ours (its entry exists), and there is nothing left to do.
    """
    control_key = layout.control(tp)
    target: list[str] = []  # the append_id being materialised, once chosen

    async def attempt(_: int) -> Done[Materialised] | Retry:
        found = await oxia.get(control_key, tp.partition_key)
        if found is None:
            return Done(Materialised(False, None, None))
        control = Control.from_json(found.value)
        pending = control.pending
        if (pending is None or (target and pending.append_id != target[0])
                or pending.created_at_ms > clock() - min_age_ms):
            return Done(Materialised(False, control, found.version_id))
        target[:] = [pending.append_id]
        cleared = dataclasses.replace(control, pending=None, extra=dict(control.extra))
        # One request: Oxia applies it as one log entry, index entry first.
        created, cas = await oxia.put_group([
            index_entry_put(layout, tp, pending),
            PutSpec(control_key, cleared.to_json(), tp.partition_key, found.version_id),
        ])
        if isinstance(cas, VersionMismatch):
            return Retry("conflict")
        if isinstance(cas, Exception):
            raise cas
        await ensure_index_entry(oxia, layout, tp, pending, created)
        if isinstance(created, int) and metrics is not None:
            metrics.pending_materialised.labels(by).inc()
        return Done(Materialised(True, cleared, cas))

    return await cas_loop(attempt, attempts=attempts, what=f"{tp}: clear the pending append",
                          retries=None if metrics is None else metrics.cas_retries,
                          op="materialise")
