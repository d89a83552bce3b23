"""Every way into the broker passes every middleware of the app, in the app's order.

A request reaches the broker's handlers by one of several ways: the hot lane
(app/routes/hot_lane.py) for ``POST /produce`` and ``POST /consume``, the framework's
router for every other route, and an event stream (the router too, answering as it
goes). A middleware added to the app must see all of them; one the hot lane skipped
would silently not apply to the requests the broker serves most. Each middleware class
of the app is watched here (its ``__call__``, whichever chain holds the instance; one
documented stand-in is counted as the middleware it stands in for), a
request is sent each way, on the real Oxia and MinIO, with access control off and on and
CORS on, and the middlewares it entered are compared with the app's list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.routes.hot_lane import HttpMetrics
from tests.helpers.asgi import served
from tests.helpers.auth import Keys, bearer
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import make_settings

SITE = "https://app.example"
ROUTER = "the router"  # entered by the requests the framework routes, not by the lane's
# The documented exception: in the hot lane, a copy given the same arguments stands in
# for the instrumentator's HTTP metrics middleware (app/routes/hot_lane.py, HttpMetrics).
STAND_INS: dict[type, type] = {HttpMetrics: PrometheusInstrumentatorMiddleware}


class Entered:
    """Records, per HTTP request, the middleware classes entered and whether the app's
    router was."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def watch(self, monkeypatch: pytest.MonkeyPatch, cls: type, mark: Any) -> None:
        original: Callable[..., Awaitable[None]] = cls.__call__  # type: ignore[operator]

        async def entered(self_: Any, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                self.seen.append(mark)
            await original(self_, scope, receive, send)

        monkeypatch.setattr(cls, "__call__", entered)

    @contextlib.contextmanager
    def during(self) -> Iterator[list[Any]]:
        self.seen.clear()
        seen: list[Any] = []
        yield seen
        seen.extend(self.seen)


def _watched(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> tuple[Entered, list[type]]:
    """The app's middleware classes, outermost first, each watched (and its router)."""
    entered = Entered()
    classes = [m.cls for m in app.user_middleware]
    for cls in classes:
        assert isinstance(cls, type), f"{cls!r}: a middleware factory this cannot watch"
        entered.watch(monkeypatch, cls, cls)
    assert len(set(classes)) == len(classes), classes  # one instance of each
    for stand_in, original in STAND_INS.items():
        entered.watch(monkeypatch, stand_in, original)
    entered.watch(monkeypatch, type(app.router), ROUTER)
    return entered, classes


def _auth_file(tmp_path: Path, keys: Keys, topic: str) -> Path:
    path = tmp_path / "auth.toml"
    path.write_text(f"""
[principals.writer]
keys = ["{keys.entries['writer']}"]
produce = ["{topic}"]
consume = ["{topic}"]
admin = ["{topic}"]
""")
    return path


async def _stream_starts(app: ASGIApp, path: str, query: str,
                         headers: dict[str, str]) -> Message:
    """An event stream's answer until it starts (its status and headers), then the
    client goes away: the stream itself never ends."""
    started: list[Message] = []
    answered = anyio.Event()
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            started.append(message)
            answered.set()

    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": query.encode(), "client": ("127.0.0.1", 50000),
        "server": ("broker", 80),
        "headers": [(b"host", b"broker"),
                    *((k.lower().encode(), v.encode()) for k, v in headers.items())]}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(app, scope, receive, send)
        with anyio.fail_after(30):
            await answered.wait()
        tasks.cancel_scope.cancel()
    return started[0]


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
async def test_every_way_in_passes_every_middleware_in_order(
        stack: LocalStack, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        auth: bool) -> None:
    keys = Keys()
    token = keys.new("writer")
    overrides: dict[str, Any] = {"cors_allow_origins": SITE}
    if auth:
        overrides.update(auth="on", auth_file=_auth_file(tmp_path, keys, topic))
    app = create_app(make_settings(stack, **overrides))
    entered, middleware = _watched(app, monkeypatch)
    headers = {"origin": SITE, **bearer(token)}
    async with served(app) as http:
        with entered.during() as hot_produce:
            r = await http.post("/produce", json=produce_body(topic, "a"), headers=headers)
            assert r.status_code == 200, r.text
        with entered.during() as hot_consume:
            r = await http.post("/consume", json=consume_body(topic), headers=headers)
            assert r.status_code == 200 and r.json()["results"][0]["ok"], r.text
        with entered.during() as routed:
            r = await http.post("/offsets", headers=headers, json={
                "topic_partitions": [{"topic": topic, "partition": 0}]})
            assert r.status_code == 200, r.text
        with entered.during() as streamed:
            start = await _stream_starts(app, f"/topics/{topic}/stream", "from=earliest",
                                         headers)
            assert start["status"] == 200
            assert dict(start["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert middleware[0].__name__ == "CORSMiddleware"  # the app under test has them all
    assert any(m.__name__ == "AccessMiddleware" for m in middleware) == auth
    assert hot_produce == middleware, "POST /produce (hot lane)"
    assert hot_consume == middleware, "POST /consume (hot lane)"
    assert routed == [*middleware, ROUTER], "POST /offsets (the router)"
    assert streamed == [*middleware, ROUTER], "GET /topics/{topic}/stream (the router)"
