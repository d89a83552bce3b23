"""Shard assignments for the ``oxia`` client that follow a replicated cluster.

The client's own ``ServiceDiscovery`` (0.2.x) has two faults that only show once a shard
can change its leader:

- It applies the first assignment message only: its thread then waits on a two-party
  barrier that nothing else waits on any more, so every later update (a new leader after
  a server died, a shard moved) is never read, and the client keeps sending a shard's
  requests to a dead server until the process restarts.
- It knows one service address: when that server is down the client gets no updates
  at all, and its retry pause doubles up to 60 s.

:class:`FailoverDiscovery` reads every update, takes them from any of several addresses
(``LLOG_OXIA_ADDRESS`` may list the servers, comma separated; it moves to the next one
whenever a stream ends) and pauses at most :data:`MAX_RETRY_PAUSE_S` between attempts.
A shard whose assignment names no leader (an election is under way) fails its calls
with :class:`NoLeader` at once instead of opening a channel to an empty address.

A server that stalls (a paused process, a network cut) keeps its stream open and sends
nothing, so the new leaders elected meanwhile are never heard of until gRPC's pings
give up on it, which can take a minute. A call to a shard leader that times out or
finds it unreachable therefore calls :meth:`FailoverDiscovery.refresh`: the stream is
dropped and the assignments read again from the next server, at most every
:data:`MIN_REFRESH_INTERVAL_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
from oxia.internal.proto.io.streamnative.oxia import proto as pb
from oxia.internal.service_discovery import ServiceDiscovery

log = logging.getLogger(__name__)

FIRST_RETRY_PAUSE_S = 0.1
MAX_RETRY_PAUSE_S = 1.0
MIN_REFRESH_INTERVAL_S = 2.0
_ASSIGNMENTS = "/io.streamnative.oxia.proto.OxiaClient/GetShardAssignments"
# gRPC outcomes of a call to a shard leader that suggest it is gone or stalled.
STALE_LEADER_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.UNAVAILABLE})


class NoLeader(Exception):
    """The shard has no leader right now (an election is under way)."""


def split_addresses(service_address: str) -> list[str]:
    """``"a:1,b:2"`` -> ``["a:1", "b:2"]`` (one address stays one)."""
    return [a.strip() for a in service_address.split(",") if a.strip()]


class FailoverDiscovery(ServiceDiscovery):
    """Drop-in for the client's ``ServiceDiscovery`` (same constructor, same lookups)."""

    def __init__(self, service_address: str, connection_pool: Any, namespace: str,
                 init_timeout: float = 30) -> None:
        # The base constructor is not called: it starts the faulty thread.
        self._assignments: dict[int, Any] = {}
        self._service_address = service_address
        self._addresses = split_addresses(service_address)
        self._connection_pool = connection_pool
        self._namespace = namespace
        self._closed = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.updates = 0  # assignment messages applied (tests and diagnostics)
        self.refreshes = 0  # streams dropped by refresh() (tests and diagnostics)
        self._stream: Any = None
        self._refreshed_at = float("-inf")
        self._thread = threading.Thread(target=self.get_assignments, daemon=True,
                                         name="oxia-assignments")
        self._thread.start()
        if not self._ready.wait(init_timeout):
            self._closed = True  # the thread ends at its next failure
            raise RuntimeError(f"Timed out after {init_timeout}s waiting for initial shard "
                               f"assignments from {service_address}")

    def get_assignments(self) -> None:
        pause = FIRST_RETRY_PAUSE_S
        turn = 0
        while not self._closed:
            address = self._addresses[turn % len(self._addresses)]
            try:
                # The call itself rather than the stub's generator: refresh() cancels it.
                stream = self._connection_pool.get(address)._channel.unary_stream(
                    _ASSIGNMENTS, pb.ShardAssignmentsRequest.SerializeToString,
                    pb.ShardAssignments.FromString,
                )(pb.ShardAssignmentsRequest(namespace=self._namespace))
                with self._lock:
                    self._stream = stream
                for message in stream:
                    self._parse_assignments(message.namespaces[self._namespace])
                    self.updates += 1
                    self._ready.set()
                    pause = FIRST_RETRY_PAUSE_S
            except grpc.RpcError as exc:
                if not self._closed and exc.code() != grpc.StatusCode.CANCELLED:
                    log.warning("Oxia shard assignments from %s failed: %s", address,
                                exc.code())
            except Exception:  # a malformed message: the next server may do better
                if not self._closed:
                    log.exception("Oxia shard assignments from %s failed", address)
            if self._closed:
                return
            turn += 1
            time.sleep(pause)
            pause = min(pause * 2, MAX_RETRY_PAUSE_S)

    def refresh(self) -> None:
        """Drop the assignments stream, so that they are read again from the next server
        (a call to a leader timed out or found it unreachable: the stream may come from
        a stalled server that sends no updates). At most every MIN_REFRESH_INTERVAL_S."""
        now = time.monotonic()
        with self._lock:
            if now - self._refreshed_at < MIN_REFRESH_INTERVAL_S or self._stream is None:
                return
            self._refreshed_at = now
            stream, self._stream = self._stream, None
            self.refreshes += 1
        log.info("Oxia call to a shard leader failed: reading shard assignments again")
        stream.cancel()

    def leaders(self) -> dict[int, str]:
        """The leader of each shard, as last assigned ("" while one is elected)."""
        with self._lock:
            return {shard: str(s.leader) for shard, s in self._assignments.items()}

    def get_leader(self, key: str, partition_key: str) -> tuple[int, Any]:
        shard = self.get_shard(partition_key or key)
        return shard.shard, self._connection_pool.get(self._leader(shard))

    def get_stub(self, shard: int) -> Any:
        with self._lock:
            found = self._assignments.get(shard)
        if found is None:
            raise NoLeader(f"Oxia shard {shard} is not assigned")
        return self._connection_pool.get(self._leader(found))

    def get_all_shards(self) -> list[tuple[int, Any]]:
        with self._lock:
            shards = list(self._assignments.values())
        return [(s.shard, self._connection_pool.get(self._leader(s))) for s in shards]

    @staticmethod
    def _leader(shard: Any) -> str:
        # While a shard elects a leader its assignment names none; the client would
        # otherwise open a channel to "" and fail with an obscure gRPC error.
        if not shard.leader:
            raise NoLeader(f"Oxia shard {shard.shard} has no leader yet (election)")
        return str(shard.leader)

    def close(self) -> None:
        """Called by ``Client.close`` after it closed the channels, which ends the
        stream this thread reads."""
        self._closed = True
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
