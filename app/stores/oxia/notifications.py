"""Change notifications for the ``oxia`` client that follow a shard to its new leader.

The client's own ``Notifications`` (0.2.x) keeps one stream per shard, opened to the
leader of the moment, and opens new ones only when a stream fails. A leader that stops
answering without closing its connections (a stalled process, a network cut) leaves its
stream silent for good, even after the coordinator has moved the shard to another
server; the changes made there are then never reported, and a broker whose tail cache
trusts the silence serves "nothing new" for ever. It also waits without a bound for
each new stream's first message, and pauses up to 60 s between attempts.

:class:`FollowingNotifications` reopens every stream, from the last offset each shard
reported (nothing is skipped), whenever a stream ends or the shard assignments name
another leader; it bounds the wait for first messages (and waits for none from resumed
streams, which send nothing while their shard is idle) and pauses at most
:data:`MAX_RETRY_PAUSE_S`. After streams are reopened it calls ``on_resumed``: what
happened while they were down has been replayed, but a caller that cached "no change"
answers may want to check them again.

Its streams are read with :mod:`app.stores.oxia.notification_wire` rather than the client's
generic decoder (a tenth of the CPU, on a thread that competes with the event loop for
the GIL), and a caller that wants only some keys (``wanted``, judged by the key, or by
the first key of a deleted range) gets only those on the queue. A batch that does not
decode, or names a change of a type this client does not know, is skipped, logged, and
reported as ``on_resumed`` reports a reopened stream (what it held is not known): the
stream goes on, where reading it again would meet the same batch for ever.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from oxia.defs import Notification, NotificationType
from oxia.internal.notifications import Notifications
from oxia.internal.proto.io.streamnative.oxia import proto as pb

from app.stores.oxia.discovery import FailoverDiscovery
from app.stores.oxia.notification_wire import Batch, Refused, read_batch

log = logging.getLogger(__name__)

FIRST_RETRY_PAUSE_S = 0.1
MAX_RETRY_PAUSE_S = 1.0
FIRST_MESSAGE_TIMEOUT_S = 10.0
LEADER_CHECK_INTERVAL_S = 0.25
_METHOD = "/io.streamnative.oxia.proto.OxiaClient/GetNotifications"


class FollowingNotifications(Notifications):
    """Iterate it as ``client.get_notifications()``; ``close()`` ends it."""

    def __init__(self, discovery: FailoverDiscovery, *,
                 on_resumed: Callable[[], None] | None = None,
                 wanted: Callable[[str], bool] | None = None) -> None:
        self._on_resumed = on_resumed
        self._wanted = wanted
        self.resumptions = 0  # times the streams were reopened, or a batch skipped
        self._read_since = False  # a batch came since the streams were last opened
        super().__init__(discovery)

    def _coordinator_loop(self) -> None:
        pause = FIRST_RETRY_PAUSE_S
        interrupted = False
        while not self._closed:
            failed = threading.Event()
            try:
                leaders = self._service_discovery.leaders()
                self._read_since = False
                self._open_streams(failed)
                self._ready.set()
                if interrupted:
                    self._resumed()
                interrupted = False
                self._watch(failed, leaders)
                if self._read_since:  # the streams got somewhere: retry soon again
                    pause = FIRST_RETRY_PAUSE_S
            except threading.BrokenBarrierError:
                pass  # a stream failed, or was silent, before its first message
            except Exception as exc:  # no leader yet, a channel error: try again
                if not self._closed:
                    log.warning("Oxia notification streams failed: %s", exc)
            if self._closed:
                return
            interrupted = True
            self._teardown_workers()
            time.sleep(pause)
            pause = min(pause * 2, MAX_RETRY_PAUSE_S)

    def _open_streams(self, failed: threading.Event) -> None:
        """One stream and worker per shard; returns once each stream opened without an
        offset has its first message.

        A stream opened without an offset starts with an empty message at the shard's
        commit offset; one resumed from an offset sends nothing until the shard changes,
        so an idle shard would never pass a barrier: its worker gets one of its own."""
        shards = self._service_discovery.get_all_shards()
        offsets = {shard: self._last_notification.get(shard) for shard, _ in shards}
        fresh = sum(1 for offset in offsets.values() if offset is None)
        barrier = threading.Barrier(fresh + 1)
        threads, streams = [], []
        for shard, stub in shards:
            open_stream = stub._channel.unary_stream(
                _METHOD, pb.NotificationsRequest.SerializeToString, read_batch)
            stream = open_stream(pb.NotificationsRequest(
                shard=shard, start_offset_exclusive=offsets[shard]))
            waits = barrier if offsets[shard] is None else threading.Barrier(1)
            thread = threading.Thread(target=self._worker, args=(stream, waits, failed),
                                      daemon=True, name=f"oxia-notifications-{shard}")
            threads.append(thread)
            streams.append(stream)
            thread.start()
        with self._lock:
            self._threads, self._streams = threads, streams
        try:
            barrier.wait(FIRST_MESSAGE_TIMEOUT_S)
        except threading.BrokenBarrierError:
            barrier.abort()
            raise

    def _worker(self, stream: Any, barrier: threading.Barrier,
                failed: threading.Event) -> None:
        """The client's worker, for batches of :func:`read_batch` and ``wanted`` keys:
        each change a :class:`~oxia.defs.Notification` on the queue, then the shard's
        offset noted (a stream reopened starts after it)."""
        first = True
        try:
            batch: Batch | Refused
            for batch in stream:
                if isinstance(batch, Refused) or not self._queue_changes(batch):
                    self._skipped(batch)
                if batch.shard is not None and batch.offset is not None:
                    with self._lock:
                        self._last_notification[batch.shard] = batch.offset
                self._read_since = True
                if first:
                    barrier.wait()
                    first = False
        except threading.BrokenBarrierError:
            return
        except Exception as exc:  # the stream failed: the coordinator opens it again
            cancelled = (isinstance(exc, grpc.RpcError)
                         and exc.code() == grpc.StatusCode.CANCELLED)
            if not self._closed and not cancelled:
                log.warning("an Oxia notification stream failed: %s", exc,
                            exc_info=not isinstance(exc, grpc.RpcError))
        finally:
            if first:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.abort()
            failed.set()

    def _queue_changes(self, batch: Batch) -> bool:
        """Queue the batch's wanted changes; False (and nothing queued) if one is of a
        type this client does not know."""
        wanted = self._wanted
        notes = []
        for change in batch.changes:
            if wanted is not None and not wanted(change.key):
                continue
            try:
                kind = NotificationType(change.type)
            except ValueError:
                return False
            n = Notification()
            n._key, n._type, n._version_id = change.key, kind, change.version_id
            n._key_range_end = change.key_range_last
            notes.append(n)
        for n in notes:
            self._notifications.put(n)
        return True

    def _skipped(self, batch: Batch | Refused) -> None:
        why = (batch.reason if isinstance(batch, Refused)
               else "a change of a type this client does not know")
        if batch.offset is None:  # nowhere to go on from: the stream is opened again
            raise RuntimeError(f"an Oxia notification batch does not decode: {why}")
        log.error("Oxia notification batch %s of shard %s skipped: %s; its changes are "
                  "unknown, so every partition is looked at again", batch.offset,
                  batch.shard, why)
        self._resumed()

    def _watch(self, failed: threading.Event, leaders: dict[int, str]) -> None:
        """Until a stream ends, the client closes, or a shard has another leader."""
        while not failed.wait(LEADER_CHECK_INTERVAL_S):
            if self._closed or self._service_discovery.leaders() != leaders:
                return

    def _resumed(self) -> None:
        self.resumptions += 1
        if self._on_resumed is not None:
            try:
                self._on_resumed()
            except Exception:
                log.exception("on_resumed callback failed")


def notifications(client: Any, *, on_resumed: Callable[[], None] | None = None,
                  wanted: Callable[[str], bool] | None = None) -> FollowingNotifications:
    """Change notifications of a client built by :func:`app.stores.oxia.patches.connect`
    (of the keys ``wanted`` says, or all)."""
    discovery = client._service_discovery
    if not isinstance(discovery, FailoverDiscovery):
        raise TypeError("the client was not built by oxia_patches.connect")
    return FollowingNotifications(discovery, on_resumed=on_resumed, wanted=wanted)
