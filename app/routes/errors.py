"""Errors at the HTTP edge: the one place that turns exceptions into status codes."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Forbidden, LlogError, QuotaExceeded, Unauthenticated, UnsupportedEncoding
from app.wire.content_encoding import ACCEPTED_ENCODINGS

REALM = "llog"
# RFC 6750's error_description allows only these characters.
_UNQUOTED = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")

log = logging.getLogger(__name__)


def error_body(error_type: str, error: str, details: list[dict[str, str]] | None = None
               ) -> dict[str, Any]:
    body: dict[str, Any] = {"error_type": error_type, "error": error}
    if details:
        body["details"] = details
    return body


def _challenge(exc: LlogError) -> str | None:
    """The ``WWW-Authenticate`` value for an access refusal (RFC 6750, section 3)."""
    if isinstance(exc, Unauthenticated):
        code = exc.code
    elif isinstance(exc, Forbidden):
        code = "insufficient_scope"
    else:
        return None
    if code is None:  # no credentials were sent: no error code
        return f'Bearer realm="{REALM}"'
    description = _UNQUOTED.sub("?", str(exc))
    return f'Bearer realm="{REALM}", error="{code}", error_description="{description}"'


def error_response(exc: LlogError) -> JSONResponse:
    """A whole request refused with ``exc``: its class says the status and headers."""
    headers: dict[str, str] = {}
    if isinstance(exc, QuotaExceeded):
        headers["Retry-After"] = str(exc.retry_after_s)
    elif exc.retriable and exc.http_status == 503:
        headers["Retry-After"] = "1"
    challenge = _challenge(exc)
    if challenge is not None:
        headers["WWW-Authenticate"] = challenge
    if isinstance(exc, UnsupportedEncoding):  # RFC 9110 12.5.3: the codings it does take
        headers["Accept-Encoding"] = ACCEPTED_ENCODINGS
    return JSONResponse(error_body(exc.error_type, str(exc)), status_code=exc.http_status,
                        headers=headers or None)


def _loc(parts: tuple[Any, ...]) -> str:
    # Drop FastAPI's leading "body" and pydantic's union-branch names.
    shown = [str(p) for p in parts if p not in ("body",) and not str(p).startswith("function-")]
    return ".".join(shown) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = []
        malformed = False
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                malformed = True
            details.append({"loc": _loc(tuple(err.get("loc", ()))), "msg": str(err.get("msg"))})
        message = "malformed JSON body" if malformed else "invalid request body"
        return JSONResponse(error_body("InvalidRequest", message, details), status_code=400)

    @app.exception_handler(LlogError)
    async def refused(_: Request, exc: LlogError) -> JSONResponse:
        # A whole request refused by the broker (a limit, a role, access control).
        log.info("request refused: %s: %s", exc.error_type, exc)
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge"}.get(
            exc.status_code, "HTTPError")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request.scope)}
        return JSONResponse(error_body(kind, str(exc.detail)), status_code=exc.status_code,
                            headers=headers)


def allowed_methods(scope: Scope) -> str:
    """The ``Allow`` value of a 405: every method the path is served with.

    The router answers a method no route of the path takes with the first such route's
    own methods, and a path served by several routes (``GET`` and ``POST /topics``, one
    handler each) would name only one of them: this merges every route of the path."""
    methods: set[str] = set()
    for route in scope["app"].router.routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods.update(route_methods)
    return ", ".join(sorted(methods))


class _BodyTooLarge(StarletteHTTPException):
    """Raised by the counting receive; turned into the 413 below (internal). An
    HTTPException, so that FastAPI's body parsing lets it through unchanged."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=413, detail=message)


class BodyLimitMiddleware:
    """Refuses bodies over ``max_bytes`` with 413 before anything parses them: by
    Content-Length when given, and by counting streamed chunks otherwise.

    FastAPI's own ``max_body_size`` refuses at the same moments, but answers a plain
    text body; this one answers the documented JSON :class:`ErrorResponse`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge(self._message())
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(send)

    def _message(self) -> str:
        return f"request body larger than the limit of {self.max_bytes} bytes"

    async def _reject(self, send: Send) -> None:
        import json

        body = json.dumps(error_body("PayloadTooLarge", self._message())).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class CloseWhileDraining:
    """While the service drains, every answer carries ``Connection: close``: a load
    balancer then opens a new connection for its next request, which goes to another
    broker, instead of reusing one this broker is about to close (a request sent on a
    connection the server closes at that moment is lost: a 502 to the client)."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.draining():
            await self.app(scope, receive, send)
            return

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing_send)
