"""Access control at the HTTP edge (app/auth/ holds the rules).

:class:`AccessMiddleware` authenticates every request to a protected path before its
body is read (by its bearer token, or for an event stream by a stream ticket in the
query) and charges it to the principal's request-rate quota; it is only installed
when ``LLOG_AUTH=on``. Handlers then call :func:`authorize` (rights on the topics or
groups the request names) and :func:`charge_produce` before any storage work; with auth
off both return at once.

Consumer-group routes declare ``Depends(require(Right.GROUP, param="group"))`` for a
group named in the path, or call ``authorize(request, Right.GROUP, [name])`` for one
named in the body; either way a refusal is a 403 before the handler touches storage.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import parse_qs

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.control import AccessControl, Principal
from app.auth.metrics import ANONYMOUS
from app.auth.rights import Right
from app.errors import Forbidden, LlogError
from app.routes.errors import error_response

access_log = logging.getLogger("llog.access")
PRINCIPAL = "llog.principal"
# Open with auth on: health (probes and load balancers carry no token), the API's
# description, and the console's page and assets (a browser's navigation carries no
# token; they hold no data, and the page asks for one). Metrics are added when
# LLOG_AUTH_METRICS=open.
OPEN_PATHS = frozenset({"/health", "/health/ready", "/health/live", "/openapi.json",
                        "/docs", "/docs/oauth2-redirect", "/redoc", "/console",
                        "/console/"})
OPEN_PREFIXES = ("/console/assets/",)
METRICS_PATHS = frozenset({"/metrics", "/metrics/prometheus"})


def control_of(request: Request) -> AccessControl | None:
    control: AccessControl | None = request.app.state.auth
    return control


def principal_of(request: Request) -> Principal | None:
    """The authenticated principal of this request (None with auth off)."""
    principal: Principal | None = request.scope.get("state", {}).get(PRINCIPAL)
    return principal


def _both(request: Request) -> tuple[AccessControl, Principal] | None:
    control = control_of(request)
    if control is None:
        return None
    principal = principal_of(request)
    assert principal is not None, "AccessMiddleware authenticates every protected path"
    return control, principal


def authorize(request: Request, right: Right, names: Iterable[str]) -> None:
    """Forbidden (403) unless the caller holds ``right`` on every one of ``names``
    (topics; consumer groups for Right.GROUP)."""
    both = _both(request)
    if both is not None:
        both[0].authorize(both[1], right, names)


def holds(request: Request, right: Right, name: str) -> bool:
    """Whether the caller holds ``right`` on ``name`` (for filtering lists)."""
    both = _both(request)
    return both is None or not both[0].entry(both[1]).acl.denied(right, [name])


def require(right: Right, *, param: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency: the caller holds ``right`` on the path parameter ``param``."""

    async def dependency(request: Request) -> None:  # async: FastAPI threads a plain def
        authorize(request, right, [str(request.path_params[param])])

    return dependency


def sees_topic(request: Request, topic: str) -> bool:
    """Whether the caller may know of ``topic`` (describe, list): any right on it."""
    both = _both(request)
    return both is None or both[0].sees_topic(both[1], topic)


def authorize_describe(request: Request, topic: str) -> None:
    """Forbidden unless the caller may know of ``topic``."""
    both = _both(request)
    if both is not None and not both[0].sees_topic(both[1], topic):
        raise Forbidden(f"{both[1].name} holds no right on topic {topic}")


def charge_produce(request: Request, size: int) -> None:
    """Take ``size`` record bytes (values, keys, headers) from the caller's produce
    quota (429 when over it)."""
    both = _both(request)
    if both is not None:
        both[0].charge_bytes(both[1], size)


def account(request: Request, *, produced: int = 0, consumed: int = 0) -> None:
    """Count acknowledged and returned record bytes under the caller's label."""
    both = _both(request)
    if both is None:
        return
    metrics, label = both[0].metrics, both[1].label
    if produced:
        metrics.produced_bytes.labels(label).inc(produced)
    if consumed:
        metrics.consumed_bytes.labels(label).inc(consumed)


class AccessMiddleware:
    """Authenticates requests to protected paths, charges their request quota, names
    the principal in per-principal metrics and the access log."""

    def __init__(self, app: ASGIApp, control: AccessControl, *, log_requests: bool) -> None:
        self.app = app
        self.control = control
        self.log_requests = log_requests
        open_paths = set(OPEN_PATHS)
        if control.settings.auth_metrics == "open":
            open_paths |= METRICS_PATHS
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or \
                scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        principal: Principal | None = None
        try:
            authorization = _header(scope, b"authorization")
            ticket = _stream_ticket(scope) if authorization is None else None
            if ticket is not None:  # charged to its quota as it is redeemed
                principal = self.control.redeem(*ticket)
            else:
                principal = await self.control.authenticate(authorization)
                self.control.charge_request(principal)
        except LlogError as exc:
            self.control.metrics.refusals.labels(exc.error_type).inc()
            await error_response(exc)(scope, receive, send)
            self._done(scope, principal, exc.http_status, started)
            return
        scope.setdefault("state", {})[PRINCIPAL] = principal
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status in (403, 429):
                    self.control.metrics.refusals.labels(_REFUSED[status]).inc()
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            self._done(scope, principal, status, started)

    def _done(self, scope: Scope, principal: Principal | None, status: int,
              started: float) -> None:
        label = principal.label if principal is not None else ANONYMOUS
        self.control.metrics.requests.labels(label, str(status)).inc()
        if self.log_requests:
            client = scope.get("client")
            where = f"{client[0]}:{client[1]}" if client else "-"
            query = _TICKET_IN_QUERY.sub(r"\1ticket=…",
                                         scope.get("query_string", b"").decode("latin-1"))
            path = scope["path"] + (f"?{query}" if query else "")
            access_log.info('%s - "%s %s HTTP/%s" %d principal=%s %.1fms', where,
                            scope["method"], path, scope.get("http_version", "1.1"), status,
                            principal.name if principal is not None else "-",
                            (time.monotonic() - started) * 1000)


_REFUSED = {403: "Forbidden", 429: "QuotaExceeded"}


# The one path that takes a stream ticket in place of a token (browsers' EventSource
# cannot send headers), and the ticket's parameter, kept out of the access log.
_STREAM_PATH = re.compile(r"/topics/([^/]+)/stream")
_TICKET_IN_QUERY = re.compile(r"(^|&)ticket=[^&]*")


def _stream_ticket(scope: Scope) -> tuple[str, str] | None:
    """(ticket, topic) of a GET of a stream with ``?ticket=``, else None."""
    match = _STREAM_PATH.fullmatch(scope["path"])
    if match is None or scope["method"] != "GET":
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    tickets = query.get("ticket")
    return (tickets[0], match[1]) if tickets else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None
