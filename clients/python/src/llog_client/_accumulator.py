"""The producer's records waiting to be sent, gathered per partition into batches; free
of I/O, so the sync and the async producer share it.

A batch takes records until it holds ``batch_bytes``; it is ready to go when it is full,
when its first record has waited ``linger_s``, or when a flush asks for everything. A
request takes ready batches of many partitions, up to ``max_request_bytes``. Once a batch
has been drained into a request it is *sealed*: its records and its producer sequence
(or idempotency key) never change again, so every retry of it is the same append and the
broker writes it at most once (docs/http-api.md, Idempotent producers).

With ``ordered`` (the default), a partition's batches are sent as its producer sequence
(app's docs/http-api.md, Idempotent producers), ``in_flight_per_partition`` of them at
once (Kafka's ``max.in.flight.requests.per.connection`` with idempotence): the broker
appends each only after the one before it, so a partition's records are stored in the
order they were sent however many retries it takes. A batch to retry goes back to its
place in its partition's queue (by ``serial``) and is sent only once the batches sent
before it are answered. A batch whose sequence was broken by an earlier batch failing
for good, and which may have been written, keeps its old place in that sequence
(``stale``): it travels alone in its partition. Batches the broker places by key (no
partition, no sequence) go one at a time. Unordered, many batches of a partition travel
at once and a retried one may land after a later one.

Every method is called with the producer's lock held: the sync producer's threads append
while its sender thread drains.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from llog_client._errors import LlogError, ProducerClosed

# A record's bytes besides its value and key, for the size bound (lengths, timestamp).
RECORD_OVERHEAD = 16
# Where a batch goes: topic, partition (-1: the broker places it by ``key``), key.
Route = tuple[str, int, bytes | None]


class Batch:
    """Records bound for one partition, sent and acknowledged together.

    Plain slots and lists, no object per record: a record is a position in the batch's
    columns, and what a caller holds for it (a future) is the batch and that position."""

    __slots__ = (
        "alone",
        "attempts",
        "base_offset",
        "behind_certain",
        "callbacks",
        "created",
        "deadline",
        "duplicate",
        "error",
        "finished",
        "full",
        "headers",
        "idempotency_key",
        "keys",
        "last_error",
        "maybe_ended_at",
        "maybe_written",
        "observed",
        "plain",
        "producer_id",
        "ready_at",
        "route",
        "sealed",
        "sequence",
        "serial",
        "size",
        "stale",
        "timestamps",
        "values",
        "waiter",
    )

    def __init__(self, route: Route, created: float, deadline: float, waiter: Any) -> None:
        self.route = route
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None  # None until a record has a key
        self.timestamps: list[int] | None = None
        self.headers: list[Sequence[tuple[str, bytes]]] | None = None
        self.size = 0
        self.created = created
        self.deadline = deadline
        self.idempotency_key = ""
        self.producer_id = ""  # with ``sequence``: its place in its producer's sequence
        self.sequence = -1
        self.stale = False  # keeps a sequence the producer has left (module docstring)
        # Out when its sequence broke at a batch certainly not written: neither is it.
        self.behind_certain = False
        self.attempts = 0
        self.ready_at = created  # a batch to retry waits out its backoff
        self.sealed = self.full = self.finished = False
        self.base_offset = -1
        self.duplicate = False
        self.error: LlogError | None = None
        self.last_error: LlogError | None = None
        self.waiter = waiter  # set once the batch is finished (threading or anyio Event)
        # The done-callbacks of its records' futures (a DoneCallbacks of
        # _producer_core, which imports this module), until it is finished.
        self.callbacks: Any = None
        self.alone = False  # refused whole with other batches: sent by itself from then on
        self.observed = False  # a caller read a future of it (or a delivery callback did)
        self.serial = 0  # the accumulator's count of batches, for flush
        self.plain = True  # every record so far is a value alone (no key, headers, time)
        self.maybe_written = False  # an attempt may have been committed
        self.maybe_ended_at = 0.0  # when the last such attempt ended (failed, unanswered)

    @property
    def topic(self) -> str:
        return self.route[0]

    @property
    def partition(self) -> int:
        return self.route[1]

    def add(self, value: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes]],
            timestamp_ms: int | None, size: int) -> int:
        """Append one record; its index in the batch. A column appears with the first
        record that needs it, filled with "none" for the records before."""
        index = len(self.values)
        self.values.append(value)
        if key is not None or timestamp_ms is not None or headers:
            self.plain = False
        if key is not None or self.keys is not None:
            if self.keys is None:
                self.keys = [None] * index
            self.keys.append(key)
        if timestamp_ms is not None or self.timestamps is not None:
            if self.timestamps is None:
                self.timestamps = [-1] * index
            self.timestamps.append(-1 if timestamp_ms is None else timestamp_ms)
        if headers or self.headers is not None:
            if self.headers is None:
                self.headers = [()] * index
            self.headers.append(headers)
        self.size += size
        return index

    def __len__(self) -> int:
        return len(self.values)

    def finish(self, base_offset: int, duplicate: bool) -> None:
        """Acknowledged (lock held: a callback added from now on runs at once)."""
        self.base_offset, self.duplicate = base_offset, duplicate
        self.finished = True

    def fail(self, error: LlogError) -> None:
        """Failed for good (lock held)."""
        self.error = error
        self.finished = True


def lane_of(route: Route) -> Route:
    """The queue a batch waits in, and the unit of ordering: its partition, or, for
    batches the broker places by key (their topic's partition count unknown yet), one
    lane for all of the topic's keys. The broker may put two keys in one partition, so
    their batches are kept in order, one in flight, as one partition's are."""
    return route if route[1] >= 0 else (route[0], -1, None)


# Unordered, at most this many batches of a partition travel at once, and none is sent
# once this many more were sent after the oldest one not settled: a batch that may have
# been written and is sent again meets its key among the 64 a partition remembers.
UNORDERED_PER_PARTITION = 16
UNORDERED_PASSING = 48


class Accumulator:
    """Each partition's queue of batches; see the module."""

    def __init__(self, *, batch_bytes: int, batch_records: int, linger_s: float,
                 ordered: bool, new_waiter: Callable[[], Any], clock: Callable[[], float],
                 in_flight_per_partition: int = 1) -> None:
        self.batch_bytes = batch_bytes
        self.batch_records = batch_records  # a request's record limit holds one batch
        self.linger_s = linger_s
        self.ordered = ordered
        self._per_partition = in_flight_per_partition
        self._new_waiter = new_waiter
        self._clock = clock
        self._queues: dict[Route, deque[Batch]] = {}
        # The open batch of each partition named by the sender of its records, by topic
        # then partition: where a value alone goes in one step (ProducerCore.express),
        # without a route made and hashed per record. A batch leaves it once drained,
        # and one taken out of its queue any other way is sealed, so it takes no more.
        self.tails: dict[str, dict[int, Batch]] = {}
        # Each lane's batches in flight, oldest first; lanes whose sequence broke send
        # nothing more until those are answered.
        self._flying: dict[Route, list[Batch]] = {}
        self._draining: set[Route] = set()
        # The producer's id and next sequence for a partition (the sender's sequences).
        self.position: Callable[[tuple[str, int]], tuple[str, int]] | None = None
        # Lanes held back until a time: a batch failed for good after an attempt that
        # may still commit (until its commit deadline); nothing passes it before then.
        self._held: dict[Route, float] = {}
        self._start = 0  # where the next drain starts, so no lane is always last
        # Unordered: each lane's count of batches sent, and the count at which each batch
        # not yet settled was first sent (by serial).
        self._sent: dict[Route, int] = {}
        self._unsettled: dict[Route, dict[int, int]] = {}
        self.buffered = 0  # bytes of records appended and not yet finished
        self._serial = 0
        self.unfinished: dict[int, Batch] = {}  # by serial, oldest first: what flush waits on
        self.flushing = 0  # flushes under way: every batch is ready meanwhile
        # No appends once set (close, or the sender's crash): what is queued is sent, or
        # failed, and nothing comes in behind it that no sender would settle.
        self.closed = False

    def append(self, route: Route, value: bytes, key: bytes | None,
               headers: Sequence[tuple[str, bytes]], timestamp_ms: int | None,
               size: int, deadline_s: float) -> tuple[Batch, int, bool]:
        """Add a record to its partition's open batch (a new one when the last is sealed
        or full): the batch, the record's index, and whether the sender should look now
        (a new batch starts its linger; a full one is ready)."""
        if key is None and timestamp_ms is None and not headers:
            found = self.append_value(route, value, size)
            if found is not None:
                return found
        if self.closed:
            raise ProducerClosed("the producer is closed")
        lane = lane_of(route)
        queue = self._queues.get(lane)
        if queue is None:
            queue = self._queues[lane] = deque()
        batch = queue[-1] if queue else None
        opened = False
        if batch is None or batch.sealed or batch.full or batch.route != route:
            now = self._clock()
            batch = Batch(route, now, now + deadline_s, self._new_waiter())
            self._serial += 1
            batch.serial = self._serial
            self.unfinished[batch.serial] = batch
            queue.append(batch)
            opened = True
            if route[1] >= 0:
                self.tails.setdefault(route[0], {})[route[1]] = batch
        index = batch.add(value, key, headers, timestamp_ms, size)
        self.buffered += size
        if batch.size >= self.batch_bytes or index + 1 >= self.batch_records:
            batch.full = True
            return batch, index, True
        return batch, index, opened

    def append_value(self, route: Route, value: bytes, size: int
                     ) -> tuple[Batch, int, bool] | None:
        """The common case of :meth:`append`, in few steps (it runs once per record): a
        value alone, to a partition whose open batch holds values alone. None when
        anything else applies."""
        queue = self._queues.get(route)
        if not queue or self.closed:
            return None
        tail = queue[-1]
        if not tail.plain or tail.sealed or tail.full:
            return None
        index = len(tail.values)
        tail.values.append(value)
        tail.size += size
        self.buffered += size
        if tail.size >= self.batch_bytes or index + 1 >= self.batch_records:
            tail.full = True
            return tail, index, True
        return tail, index, False

    def by_key_pending(self, topic: str) -> bool:
        """Whether batches of ``topic`` placed by the broker by key are queued, in
        flight, or held (one failed that may still commit): keyed records go the same
        way until they are settled and the hold is over, or one could be stored before
        an earlier record of its key."""
        lane = (topic, -1, None)
        if lane in self._queues or lane in self._flying:
            return True
        held = self._held.get(lane)
        return held is not None and held > self._clock()

    def _waits_for_answer(self, lane: Route, head: Batch) -> bool:
        """Whether the lane may not send ``head`` before an answer settles one of its
        batches: it has as many in flight as it may, or (unordered) the oldest batch
        not settled must be settled before more pass it (unless ``head`` is that one,
        back for a retry)."""
        flying = self._flying.get(lane)
        if flying:
            if len(flying) >= self._limit(lane) or lane in self._draining:
                return True
            if head.stale or any(b.stale for b in flying):
                return True  # a sequence left behind: alone in its partition
            if head.attempts and any(b.serial < head.serial for b in flying):
                return True  # a retry goes once the batches sent before it are answered
            if not head.producer_id and self._window_full(lane):
                return True
        unsettled = self._unsettled.get(lane)
        if not unsettled or head.serial in unsettled:
            return False
        return self._sent[lane] - min(unsettled.values()) >= UNORDERED_PASSING

    def _sendable(self, lane: Route, now: float) -> Batch | None:
        queue = self._queues.get(lane)
        if not queue or self._waits_for_answer(lane, queue[0]):
            return None
        held = self._held.get(lane)
        if held is not None:
            if held > now:
                return None
            del self._held[lane]
        head = queue[0]
        if head.ready_at > now:
            return None
        if head.full or self.flushing or head.sealed or now >= head.created + self.linger_s:
            return head
        return None

    def drain(self, now: float, max_bytes: int, max_records: int, max_entries: int,
              group: Callable[[Batch], object] | None = None) -> list[Batch]:
        """Ready batches for one request, sealed and counted in flight: at most
        ``max_bytes`` of records (one batch at least), ``max_records`` and
        ``max_entries``; with ``group``, only batches of the first one's group (the
        broker each goes to). Lanes are visited from a rotating start."""
        taken: list[Batch] = []
        size = records = 0
        first_group: object = None
        lanes = list(self._queues)
        if lanes:
            self._start = (self._start + 1) % len(lanes)
            lanes = lanes[self._start:] + lanes[:self._start]
        for lane in lanes:
            batch = self._sendable(lane, now)
            if batch is None:
                continue
            if taken and (batch.alone or size + batch.size > max_bytes
                          or records + len(batch) > max_records or len(taken) >= max_entries):
                continue
            if group is not None:
                mine = group(batch)
                if not taken:
                    first_group = mine
                elif mine != first_group:
                    continue
            queue = self._queues[lane]
            queue.popleft()
            if not queue:
                del self._queues[lane]  # lanes by key come and go
            self._seal(batch)
            self._flying.setdefault(lane, []).append(batch)
            if not self.ordered:
                sent = self._sent.get(lane, 0)
                self._sent[lane] = sent + 1
                self._unsettled.setdefault(lane, {}).setdefault(batch.serial, sent)
            taken.append(batch)
            size += batch.size
            records += len(batch)
            if batch.alone:
                break
        return taken

    def _seal(self, batch: Batch) -> None:
        """``batch`` takes no more records: drained, expired or failed at close."""
        batch.sealed = True
        topic, partition, _ = batch.route
        tails = self.tails.get(topic)
        if tails is not None and tails.get(partition) is batch:
            del tails[partition]
            if not tails:
                del self.tails[topic]

    def _window_full(self, lane: Route) -> bool:
        """Whether the next batch of ``lane``'s sequence would be as far past the oldest
        one not yet answered as the partition remembers (``in_flight_per_partition``): a
        retry of that one must still find its place among the sequences remembered."""
        if self.position is None or lane[1] < 0 or not self.ordered:
            return False
        producer_id, following = self.position((lane[0], lane[1]))
        unanswered = [b.sequence for b in (*self._flying.get(lane, ()),
                                           *self._queues.get(lane, ()))
                      if b.producer_id == producer_id]
        return bool(unanswered) and following - min(unanswered) >= self._limit(lane)

    def _limit(self, lane: Route) -> int:
        """Batches of ``lane`` in flight at once."""
        if not self.ordered:
            return UNORDERED_PER_PARTITION
        return self._per_partition if lane[1] >= 0 else 1

    def requeue(self, batch: Batch, ready_at: float) -> None:
        """A batch to send again after ``ready_at``: back in its place in its
        partition's queue, before the batches made after it."""
        lane = lane_of(batch.route)
        self._landed(lane, batch)
        batch.ready_at = ready_at
        queue = self._queues.setdefault(lane, deque())
        at = next((i for i, b in enumerate(queue) if b.serial > batch.serial), len(queue))
        queue.insert(at, batch)

    def predecessor_pending(self, batch: Batch) -> bool:
        """Whether a batch before ``batch`` in its producer sequence is still to be
        answered (in flight, or queued to go again)."""
        lane = lane_of(batch.route)
        return any(b.producer_id == batch.producer_id and b.sequence < batch.sequence
                   for b in (*self._flying.get(lane, ()), *self._queues.get(lane, ())))

    def sequence_broken(self, batch: Batch) -> None:
        """``batch``'s partition goes on under a new sequence. The batches after it in
        the old one: if ``batch`` was certainly not written, neither can they be (the
        broker appends a sequence only in order): queued, they take places in the new
        one when sent; out, they will once answered (``behind_certain``). If it may have
        been, so may they: they keep their places (``stale``). Nothing more of the
        partition is sent before its batches in flight are answered."""
        lane = lane_of(batch.route)
        certain = not batch.maybe_written
        for queued in self._queues.get(lane, ()):
            if queued.producer_id != batch.producer_id or queued.sequence < batch.sequence:
                continue
            if certain:
                queued.producer_id, queued.sequence = "", -1
                queued.maybe_written = queued.stale = False
            else:
                queued.stale = True
        for out in self._flying.get(lane, ()):
            if out.producer_id == batch.producer_id and out.sequence > batch.sequence:
                if certain:
                    out.behind_certain = True
                else:
                    out.stale = True
        if lane in self._flying:
            self._draining.add(lane)

    def settled(self, batch: Batch, hold_until: float | None = None) -> None:
        """A batch that was in flight is finished: its bytes are free. ``hold_until``:
        it failed, but an attempt of it may still commit until then; its lane sends
        nothing before."""
        lane = lane_of(batch.route)
        self._landed(lane, batch)
        self._forget(batch)
        if hold_until is not None:
            self.hold(batch.route, hold_until)

    def hold(self, route: Route, until: float) -> None:
        """Send nothing more of ``route``'s lane before ``until``."""
        lane = lane_of(route)
        self._held[lane] = max(until, self._held.get(lane, until))

    def _forget(self, batch: Batch) -> None:
        self.buffered -= batch.size
        self.unfinished.pop(batch.serial, None)
        if not self.ordered:
            lane = lane_of(batch.route)
            unsettled = self._unsettled.get(lane)
            if unsettled is not None:
                unsettled.pop(batch.serial, None)
                if not unsettled:
                    del self._unsettled[lane]

    def _landed(self, lane: Route, batch: Batch) -> None:
        flying = self._flying.get(lane)
        if flying is not None and batch in flying:
            flying.remove(batch)
        if not flying:
            self._flying.pop(lane, None)
            self._draining.discard(lane)

    def expired(self, now: float) -> list[Batch]:
        """Queued batches past their delivery deadline, taken out (the caller fails
        them; their bytes are freed here)."""
        out: list[Batch] = []
        for lane, queue in list(self._queues.items()):
            while queue and queue[0].deadline <= now:
                batch = queue.popleft()
                self._seal(batch)
                self._forget(batch)
                out.append(batch)
            if not queue:
                del self._queues[lane]
        return out

    def next_check_s(self, now: float, can_send: bool = True) -> float:
        """How long the sender may sleep before a batch could be ready or expire
        (infinity when nothing waits; appends and answers wake it). ``can_send``
        False: no request may start now (``max_in_flight``), so only expiries count."""
        soonest = math.inf
        for lane, queue in self._queues.items():
            if not queue:
                continue
            head = queue[0]
            soonest = min(soonest, head.deadline)
            if not can_send or self._waits_for_answer(lane, head):
                continue  # waits for an answer, which wakes the sender
            due = head.created + self.linger_s
            if head.full or head.sealed or self.flushing:
                due = head.ready_at
            soonest = min(soonest, max(due, head.ready_at, self._held.get(lane, 0.0)))
        return max(0.0, soonest - now)

    def batches(self) -> Iterator[Batch]:
        """Every queued batch (not those in flight)."""
        for queue in self._queues.values():
            yield from queue

    def empty(self) -> bool:
        return not any(self._queues.values()) and not self._flying

    def take_all(self) -> list[Batch]:
        """Every queued batch, taken out (closing: the caller fails them)."""
        out = list(self.batches())
        for batch in out:
            self._seal(batch)
            self._forget(batch)
        self._queues.clear()
        return out
