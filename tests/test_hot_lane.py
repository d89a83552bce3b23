"""The hot lane (app/routes/hot_lane.py): POST /produce and /consume served by short chains
that keep
every behaviour of the full stack: request ids, the body limit, access control, the
app's error answers and the HTTP metrics (counted once)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator import metrics as http_metrics
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from app.errors import UnknownTopic
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.routes.errors import BodyLimitMiddleware, install_error_handlers
from app.routes.hot_lane import HotLane
from app.routes.http_series import HttpSeries
from app.routes.table import Route
from app.telemetry.request_id import RequestIdMiddleware
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import make_settings


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


class _Inner:
    """The rest of the app: records what reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append((scope["method"], scope["path"]))
        await JSONResponse({"from": "app"})(scope, receive, send)


async def _answer(request: Request) -> Response:
    body = await request.body()
    if body == b"unknown":
        raise UnknownTopic("topic nope does not exist")
    if body == b"bug":
        raise RuntimeError("a bug")
    return JSONResponse({"from": "lane", "bytes": len(body)})


@contextlib.asynccontextmanager
async def _lane(registry: CollectorRegistry) -> AsyncIterator[tuple[httpx.AsyncClient, _Inner]]:
    inner = _Inner()
    app = FastAPI()
    install_error_handlers(app)
    app.router.routes.clear()
    routes = [Route(APIRoute("/produce", _answer, methods=["POST"]), lane=_answer)]
    app.router.routes.extend(row.route for row in routes)
    instrumentation = http_metrics.default(metric_namespace="t", registry=registry)
    assert instrumentation is not None
    app.add_middleware(PrometheusInstrumentatorMiddleware, registry=registry,
                       instrumentations=[instrumentation], should_group_status_codes=False)
    app.add_middleware(BodyLimitMiddleware, max_bytes=100)
    app.add_middleware(RequestIdMiddleware, max_length=64)
    app.add_middleware(HotLane, routes=routes, served=app)
    # The lane in front of the rest of the app: here ``inner``, which records what reached it.
    lane = HotLane(inner, routes=routes, served=app)

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app  # as Starlette sets it before its middleware runs
        await lane(scope, receive, send)

    transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://lane") as client:
        yield client, inner


async def test_only_posts_to_a_hot_path_take_the_lane() -> None:
    registry = CollectorRegistry()
    async with _lane(registry) as (client, inner):
        served = await client.post("/produce", content=b"abc")
        assert served.json() == {"from": "lane", "bytes": 3}
        for method, path in (("GET", "/produce"), ("POST", "/produce/"),
                             ("POST", "/consume")):
            r = await client.request(method, path)
            assert r.json() == {"from": "app"}, (method, path)
    assert inner.seen == [("GET", "/produce"), ("POST", "/produce/"), ("POST", "/consume")]


async def test_the_lane_keeps_the_edge_errors_and_metrics() -> None:
    registry = CollectorRegistry()
    async with _lane(registry) as (client, _):
        ok = await client.post("/produce", content=b"abc", headers={"X-Request-ID": "r-1"})
        refused = await client.post("/produce", content=b"unknown")
        too_big = await client.post("/produce", content=b"x" * 101)
        bug = await client.post("/produce", content=b"bug")
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "r-1"
    assert refused.status_code == 404
    assert refused.json()["error_type"] == "UnknownTopic"
    assert "x-request-id" in refused.headers
    assert too_big.status_code == 413 and too_big.json()["error_type"] == "PayloadTooLarge"
    assert bug.status_code == 500  # not taken by a handler: the server's error answer
    for status, count in (("200", 1), ("404", 1), ("500", 1),
                          ("413", 0)):  # refused at the edge, as in the stack
        assert _sample(registry, "t_http_requests_total", method="POST", status=status,
                       handler="/produce") == count, status
    assert _sample(registry, "t_http_request_size_bytes_sum", handler="/produce") == 3 + 7 + 3
    assert _sample(registry, "t_http_response_size_bytes_count", handler="/produce") == 3


def _app(registry: CollectorRegistry, *, lane: bool, series: bool = False,
         **instrumentator: Any) -> FastAPI:
    """The unit app, its metrics made by an Instrumentator given ``instrumentator``
    (the instrumentator's ``default()`` series, or with ``series`` the app's own); with
    ``lane``, POST /produce served by the hot lane, else by the framework's route."""
    app = FastAPI()
    install_error_handlers(app)
    app.router.routes.clear()
    routes = [Route(APIRoute("/produce", _answer, methods=["POST"]), lane=_answer)]
    app.router.routes.extend(row.route for row in routes)
    metrics = Instrumentator(registry=registry, **instrumentator)
    metrics.add(HttpSeries(registry, namespace="t") if series
                else http_metrics.default(metric_namespace="t", registry=registry))
    metrics.instrument(app, metric_namespace="t")
    app.add_middleware(BodyLimitMiddleware, max_bytes=100)
    if lane:
        app.add_middleware(HotLane, routes=routes, served=app)
    return app


def _figures(registry: CollectorRegistry) -> dict[tuple[Any, ...], float]:
    """Every HTTP sample but those that depend on how long a request took."""
    timed = ("duration", "latency")
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in registry.collect() for s in family.samples
            if s.name.startswith("t_http") and not s.name.endswith("_created")
            and not (any(t in s.name for t in timed) and not s.name.endswith("_count"))}


async def _recorded(registry: CollectorRegistry, app: FastAPI) -> dict[tuple[Any, ...], float]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        for body in (b"abc", b"unknown", b"bug", b"x" * 101, b"abc"):
            await client.post("/produce", content=body)
        await client.get("/produce")  # 405, through the framework
    return _figures(registry)


@pytest.mark.parametrize("series", [False, True], ids=["default", "own series"])
@pytest.mark.parametrize("options", [
    {"should_group_status_codes": False}, {"should_group_status_codes": True},
    {"excluded_handlers": ["/prod"]}], ids=["statuses", "grouped", "excluded"])
async def test_the_lane_records_what_the_instrumentators_middleware_records(
        options: dict[str, Any], series: bool) -> None:
    figures = []
    for lane in (True, False):
        registry = CollectorRegistry()
        figures.append(await _recorded(registry, _app(registry, lane=lane, series=series,
                                                      **options)))
    assert figures[0] == figures[1]
    assert any(figures[0].values()) != ("excluded_handlers" in options)


async def test_the_apps_series_are_the_instrumentators_default_series() -> None:
    """Names, help, labels, buckets and every figure of the same requests (the lane's
    and the framework's), whichever of the two records them."""
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    got = [await _recorded(mine, _app(mine, lane=True, series=True)),
           await _recorded(theirs, _app(theirs, lane=True))]
    assert got[0] == got[1] and got[0]
    shapes = [{(f.name, f.documentation, f.type, tuple(sorted({
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k == "le")))
        for s in f.samples}))) for f in r.collect() if f.name.startswith("t_http")}
        for r in (mine, theirs)]
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("option", [{"should_round_latency_decimals": True},
                                    {"body_handlers": ["/produce"]}])
def test_the_lane_refuses_metrics_options_it_does_not_implement(
        option: dict[str, Any]) -> None:
    app = _app(CollectorRegistry(), lane=True, **option)
    with pytest.raises(ValueError, match="do not implement"):
        app.build_middleware_stack()


async def test_the_broker_counts_a_produce_and_a_consume_once_with_the_same_labels(
        stack: LocalStack, topic: str) -> None:
    app = create_app(make_settings(stack))
    registry = app.state.service.registry
    counts = [(s, h) for s in ("200", "400") for h in ("/produce", "/consume")]
    before = {(s, h): _sample(registry, "llog_http_requests_total", method="POST", status=s,
                              handler=h) for s, h in counts}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        written = await client.post("/produce", json=produce_body(topic, "a"),
                                    headers={"X-Request-ID": "hot-1"})
        invalid = await client.post("/produce", content=b"{", headers={
            "content-type": "application/json"})
        consumed = await client.post("/consume", json=consume_body(topic),
                                     headers={"X-Request-ID": "hot-2"})
        refused = await client.post("/consume", json={"topic_partitions": []})
    assert written.status_code == 200 and written.headers["x-request-id"] == "hot-1"
    assert invalid.status_code == 400 and invalid.json()["error_type"] == "InvalidRequest"
    assert consumed.status_code == 200 and consumed.headers["x-request-id"] == "hot-2"
    assert consumed.json()["results"][0]["records"][0]["value"] == "a"
    assert refused.status_code == 400 and refused.json()["error_type"] == "InvalidRequest"
    after: dict[Any, Any] = {k: _sample(registry, "llog_http_requests_total", method="POST",
                                        status=k[0], handler=k[1]) for k in before}
    assert {k: after[k] - before[k] for k in before} == {k: 1 for k in before}
