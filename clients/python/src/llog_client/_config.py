"""What the sync and the async client share: the brokers, the settings of a client, and
the translation between httpx and the operations' replies."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Literal

import httpx

from llog_client._batching import KeySource
from llog_client._compression import (
    ACCEPT_ENCODING,
    DEFAULT_COMPRESSION,
    Compression,
    encode_body,
)
from llog_client._ops import Send
from llog_client._retry import ProduceLimits, RetryPolicy
from llog_client._routing import DIGEST_HEADER, Routes
from llog_client._wire import Broken, Reply, parse_retry_after

DEFAULT_BROKER_URL = "http://127.0.0.1:8080"
BROKER_URL_ENV = "LLOG_BROKER_URL"
# The bearer token (an API key or a JWT) for brokers with access control on.
TOKEN_ENV = "LLOG_TOKEN"
# Failures that prove the request never left: retrying them cannot write twice.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# A body at least this large is compressed on a worker thread by the async client.
OFF_LOOP_BYTES = 64 * 1024
# Sent on every produce: how long the broker may take to commit it (ms), at most.
COMMIT_DEADLINE_HEADER = "llog-commit-deadline-ms"
MAX_COMMIT_DEADLINE_MS = 600_000  # LLOG_PRODUCE_COMMIT_DEADLINE_MS's ceiling
COMMIT_DEADLINE_MARGIN_S = 1.0  # at most; a tenth of a shorter timeout
# The members' map (route="preferred"), fetched from the current broker of the list.
MAP_SEND = Send("GET", "/cluster")
# The outcome of a send with no target left (never the case: the list is never empty).
NOT_SENT = Broken("no broker to send to", maybe_sent=False)
# "any": every request to the current broker of the list; "preferred": a request for one
# partition to the broker that appends it, when the map names one (_routing.py).
Routing = Literal["any", "preferred"]
ROUTING_CHOICES: tuple[Routing, ...] = ("any", "preferred")
ROUTE_ENV = "LLOG_ROUTE"  # the CLI's default --route


def routes_for(route: Routing) -> Routes | None:
    if route not in ROUTING_CHOICES:
        raise ValueError(f"route must be one of {ROUTING_CHOICES}, not {route!r}")
    return Routes() if route == "preferred" else None


def version() -> str:
    try:
        return metadata.version("llog-client")
    except metadata.PackageNotFoundError:
        return "unknown"


def broker_urls(brokers: str | Sequence[str] | None) -> list[str]:
    """The brokers to use: as given (one URL, a comma-separated list or a sequence),
    else ``LLOG_BROKER_URL``, else the local default."""
    if brokers is None:
        brokers = os.environ.get(BROKER_URL_ENV) or DEFAULT_BROKER_URL
    given = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    urls = [u.strip().rstrip("/") for u in given if u.strip()]
    if not urls:
        raise ValueError("no broker URL given")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return urls


@dataclass
class ClientConfig:
    """Brokers are equal (any serves any partition); the client starts with the first
    and moves to the next one whenever it pauses to retry."""

    brokers: list[str]
    timeout_s: float
    retry: RetryPolicy
    limits: ProduceLimits
    compression: Compression = DEFAULT_COMPRESSION
    keys: KeySource = field(default_factory=KeySource)
    current: int = 0
    routes: Routes | None = None  # route="preferred": the members' map

    def url(self, path: str) -> str:
        return self.brokers[self.current % len(self.brokers)] + path

    def targets(self, send: Send) -> list[str]:
        """Where ``send`` goes: its partition's preferred broker when routing knows one,
        then (should that broker not take the connection) the current broker of the list."""
        fallback = self.url(send.path)
        if self.routes is not None and send.partition is not None:
            routed = self.routes.url_for(*send.partition)
            if routed is not None and routed + send.path != fallback:
                return [routed + send.path, fallback]
        return [fallback]

    def needs_map(self, send: Send) -> bool:
        return self.routes is not None and send.partition is not None and self.routes.stale()

    def took_map(self, response: httpx.Response | None) -> None:
        """The answer of ``GET /cluster``: None (no answer) or a server error keeps the
        map and asks again soon; any other answer replaces it (a broker without the
        route, or with affinity off, leaves it empty)."""
        assert self.routes is not None
        if response is None or response.status_code >= 500:
            self.routes.unreached()
            return
        body = None
        if response.status_code == 200:
            with contextlib.suppress(ValueError):
                body = json.loads(response.content)
        self.routes.update(body)

    def answered(self, send: Send, response: httpx.Response) -> None:
        if self.routes is not None and send.partition is not None:
            self.routes.noticed(response.headers.get(DIGEST_HEADER))

    def unanswered(self, send: Send, url: str) -> None:
        """``send`` got no answer from ``url``: if that was its preferred broker, it is
        passed over a while and the map fetched again."""
        if self.routes is not None and url != self.url(send.path):
            self.routes.failed(url.removesuffix(send.path))

    def next_broker(self) -> None:
        self.current = (self.current + 1) % len(self.brokers)

    def timeout(self, send: Send) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s + send.wait_s, connect=min(self.timeout_s, 10.0))

    def request(self, send: Send) -> tuple[bytes | None, dict[str, str]]:
        """The body to send and its headers: a produce body compressed as configured."""
        if send.content is None:
            return None, {}
        headers = {"content-type": "application/json"}
        deadline_ms = self.commit_deadline_ms()
        if send.path == "/produce" and deadline_ms is not None:
            headers[COMMIT_DEADLINE_HEADER] = str(deadline_ms)
        if not send.compressible:
            return send.content, headers
        content, encoding = encode_body(send.content, self.compression)
        if encoding is not None:
            headers["content-encoding"] = encoding
        return content, headers

    def commit_deadline_ms(self) -> int | None:
        """The produce deadline this client asks for: its timeout less a margin (None,
        no header: a timeout without bound asks for none, and the broker's own applies).
        The broker counts it from the request's arrival, a little after this client
        starts its timeout; the margin covers that, so a resend after a timeout comes
        after the deadline and cannot meet a late first copy (docs/http-api.md). At most
        the largest deadline a broker allows."""
        if not math.isfinite(self.timeout_s):
            return None
        return max(1, min(MAX_COMMIT_DEADLINE_MS,
                          math.floor((self.timeout_s - self.deadline_margin_s()) * 1000)))

    def deadline_margin_s(self) -> float:
        """How much earlier than this client's timeout the commit deadline ends."""
        return min(COMMIT_DEADLINE_MARGIN_S, self.timeout_s / 10)

    def compresses_off_thread(self, send: Send) -> bool:
        """Whether compressing the body is worth a worker thread (the async client's
        event loop would otherwise wait a millisecond or more per MiB)."""
        return (send.compressible and self.compression != "none"
                and send.content is not None and len(send.content) >= OFF_LOOP_BYTES)


def user_agent() -> dict[str, str]:
    return {"user-agent": f"llog-python/{version()}"}


def default_headers(token: str | None) -> dict[str, str]:
    """Headers of every request: the user agent, the encodings answers may come in, and
    the bearer token when one is given (else ``LLOG_TOKEN``, when set)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    headers = {**user_agent(), "accept-encoding": ACCEPT_ENCODING}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def reply_of(response: httpx.Response) -> Reply:
    return reply_from(response.status_code, response.content,
                      response.headers.get("retry-after"), lambda: response.text)


def reply_from(status: int, content: bytes, retry_after: str | None,
               text: Callable[[], str] | None = None) -> Reply:
    """An answer as the client reads it: its JSON body (None when it is not JSON) and,
    then, its text."""
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if body is not None:
        shown = ""
    elif text is not None:
        shown = text()
    else:
        shown = content.decode("utf-8", "replace")
    return Reply(status=status, body=body, retry_after_s=parse_retry_after(retry_after),
                 text=shown)


def broken_of(exc: httpx.TransportError) -> Broken:
    return Broken(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                  maybe_sent=not isinstance(exc, _NOT_SENT))
