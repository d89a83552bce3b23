"""Fixes for the ``oxia`` Python client (0.2.x): two races and missing deadlines.

- Start-up: ``ServiceDiscovery.__init__`` starts its shard-assignment thread before it
  creates the barrier that thread signals; when the first assignments arrive quickly,
  the thread hits a missing attribute and dies, and the constructor then waits its full
  30 s and fails. The barrier becomes a lazily created, first-wins attribute.
- Shutdown: ``Client.close`` closes the channels before it marks the discovery closed,
  so the assignment thread may retry on a closed channel and die with "Channel closed!".
  The discovery is marked closed first.

- TLS: the client only opens plaintext channels. The same pool opens TLS channels when
  :func:`connect` is given :class:`TlsFiles` (every channel comes from the pool: the
  service address and each shard leader's).
- Deadlines: the client sets none on its calls, so a paused or partitioned server
  blocks a worker thread for ever. :func:`connect` builds the client with a connection
  pool whose channels add a deadline to every request/response call, including those on
  the channel to the service address, which the client opens while it is constructed.
  The long-lived streams (shard assignments, notifications, session keep-alives) are
  left alone; instead every channel pings its server, so a stream to a server that
  stalled ends within ``KEEPALIVE_S + KEEPALIVE_TIMEOUT_S``. The channels also try to
  reconnect to a server that went away at least every second (gRPC's default pause
  grows to two minutes), so a restarted server that leads a shard again is used at once.
- Lost sessions: the client keeps using a session the server has expired (the process
  stalled, or its keep-alives went unanswered) until its own keep-alive check gives up
  on it, so ephemeral puts fail meanwhile. :func:`put_ephemeral` drops such a session
  and creates the record again under a new one.
- Leader changes: :func:`connect` also gives the client a
  :class:`~app.stores.oxia.discovery.FailoverDiscovery`, which follows every shard
  assignment update and takes them from any of several service addresses.

:func:`install` is idempotent and runs when this module loads.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import oxia.client
from oxia.client import Client
from oxia.internal.connection_pool import ConnectionPool
from oxia.internal.service_discovery import ServiceDiscovery

from app.stores.oxia.discovery import FailoverDiscovery

_LOCK = threading.Lock()
_SLOT = "_llog_init_barrier"


class _FirstWinsBarrier:
    """Data descriptor: whoever touches ``_init_barrier`` first creates it."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        with _LOCK:
            barrier = obj.__dict__.get(_SLOT)
            if barrier is None:
                barrier = obj.__dict__[_SLOT] = threading.Barrier(2)
            return barrier

    def __set__(self, obj: Any, value: Any) -> None:
        with _LOCK:
            obj.__dict__.setdefault(_SLOT, value)


def _closing_discovery_first(close: Any) -> Any:
    def wrapper(self: Any) -> Any:
        discovery = getattr(self, "_service_discovery", None)
        if discovery is not None:
            discovery._closed = True  # the assignment thread then exits instead of retrying
        return close(self)

    wrapper._llog_fixed = True  # type: ignore[attr-defined]
    return wrapper


# Request/response methods of the Oxia client service that must finish promptly.
_DEADLINE_METHODS = ("/Write", "/Read", "/List", "/RangeScan", "/CreateSession",
                     "/KeepAlive", "/CloseSession")
_CONSTRUCT_LOCK = threading.Lock()
# A stalled server (a stopped process, a network cut) keeps its connections open and
# silent: without pings, the streams on them (shard assignments, notifications) wait for
# ever. Pings every KEEPALIVE_S on idle connections too, answered within
# KEEPALIVE_TIMEOUT_S, end them; Oxia's servers refuse pings more often than every 5 s.
KEEPALIVE_S = 6
KEEPALIVE_TIMEOUT_S = 2
# gRPC waits up to 120 s between reconnection attempts to a server that went away; a
# restarted Oxia server may lead a shard again within seconds.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor,
                           grpc.UnaryStreamClientInterceptor):
    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s

    def _details(self, details: Any) -> Any:
        if details.timeout is not None or not details.method.endswith(_DEADLINE_METHODS):
            return details
        return _CallDetails(
            details.method, self._timeout, details.metadata, details.credentials,
            getattr(details, "wait_for_ready", None), getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS to Oxia: the CAs to trust (None: the system's roots), and a
    client certificate and key for servers that ask for one."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the files (blocking: call it off the event loop)."""

        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file), private_key=read(self.key_file),
            certificate_chain=read(self.cert_file))


class _DeadlinePool(ConnectionPool):
    """The client's connection pool, with a deadline on every request/response call,
    over TLS when given credentials."""

    def __init__(self, timeout_s: float, credentials: grpc.ChannelCredentials | None) -> None:
        super().__init__()
        self._interceptor = _DeadlineInterceptor(timeout_s)
        self._credentials = credentials

    def _channel(self, address: str) -> grpc.Channel:
        if self._credentials is None:
            return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        return grpc.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)

    def get(self, address: str) -> Any:
        from oxia.internal.proto.io.streamnative.oxia.proto import OxiaClientStub

        with self._lock:
            entry = self.connections.get(address)
            if entry is None:
                channel = grpc.intercept_channel(self._channel(address), self._interceptor)
                entry = self.connections[address] = (channel, OxiaClientStub(channel))
            return entry[1]


def connect(address: str, *, request_timeout_s: float, tls: TlsFiles | None = None,
            **kwargs: Any) -> Client:
    """``oxia.Client(address, **kwargs)`` whose every request/response call has a deadline,
    over TLS when ``tls`` is given, and whose shard assignments follow leader changes;
    ``address`` may list several servers, comma separated.

    The client creates its pool and discovery in its constructor and opens the channel
    to ``address`` at once, so both classes are swapped for the duration of the
    construction (under a lock: constructions are rare and short).
    """
    credentials = tls.credentials() if tls is not None else None
    with _CONSTRUCT_LOCK:
        pool, discovery = oxia.client.ConnectionPool, oxia.client.ServiceDiscovery
        oxia.client.ConnectionPool = functools.partial(_DeadlinePool, request_timeout_s,
                                                       credentials)
        oxia.client.ServiceDiscovery = FailoverDiscovery
        try:
            return Client(address, **kwargs)
        finally:
            oxia.client.ConnectionPool, oxia.client.ServiceDiscovery = pool, discovery


def install() -> None:
    if not isinstance(ServiceDiscovery.__dict__.get("_init_barrier"), _FirstWinsBarrier):
        ServiceDiscovery._init_barrier = _FirstWinsBarrier()
    if not getattr(Client.close, "_llog_fixed", False):
        Client.close = _closing_discovery_first(Client.close)


install()


def put_ephemeral(client: Client, key: str, value: bytes, partition_key: str,
                  expected_version: int | None) -> int:
    """An ephemeral put (its version; raises as ``Client.put`` does). A session the
    server no longer has is dropped from the client, and the put is sent again once
    under a new session: nothing was written by the refused one."""
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    for attempt in range(2):
        shard, stub = client._service_discovery.get_leader(key, partition_key)
        session = client._session_manager.get_session(shard)
        request = pb.PutRequest(key=key, value=value, partition_key=partition_key,
                                expected_version_id=expected_version,
                                session_id=session.session_id(),
                                client_identity=session.client_identifier())
        result = stub.write(pb.WriteRequest(shard=shard, puts=[request])).puts[0]
        if result.status == pb.Status.SESSION_DOES_NOT_EXIST and attempt == 0:
            _drop_session(client, session)
            continue
        oxia.client._check_status(result.status)
        return int(result.version.version_id)
    raise AssertionError("unreachable")


def _drop_session(client: Client, session: Any) -> None:
    """Forget ``session`` (if it is still the shard's current one) and stop its
    keep-alives; the server has no such session, so there is nothing to close there."""
    manager = client._session_manager
    with manager.lock:
        if manager.sessions_by_shard.get(session.shard_id()) is session:
            del manager.sessions_by_shard[session.shard_id()]
    session._closed = True
    session._stop_event.set()
