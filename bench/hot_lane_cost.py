"""What the hot lane's chain costs per request, in process.

The broker's app as ``create_app`` builds it (its middlewares, their arguments, its
routes), with a trivial handler in place of produce and consume, called directly (no
server, no storage): µs of CPU per ``POST /produce`` and ``POST /consume``, with

- ``lane``: the hot lane as the broker has it (app/routes/hot_lane.py);
- ``lane+instrumentator``: the same with the instrumentator's own middleware where the
  lane has its copy (``HttpMetrics``: the figure that keeps that copy is this row);
- ``stack``: the hot lane taken out, the framework's whole stack and router.

Rows alternate, ``--rounds`` of ``--requests`` each. It measures and prints; it asserts
nothing. On a shared machine, compare rows of the same run only.

    .venv/bin/python bench/hot_lane_cost.py [--rounds 7] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastapi import FastAPI  # noqa: E402
from fastapi.routing import APIRoute  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.types import Message, Receive  # noqa: E402

from app.factory import create_app  # noqa: E402
from app.routes.hot_lane import HotLane, HttpMetrics  # noqa: E402
from app.routes.table import Route  # noqa: E402
from app.settings import Settings  # noqa: E402

PATHS = ("/produce", "/consume")
ANSWER = b'{"results":[{"topic":"t","partition":0,"ok":true}],"success_count":1,"error_count":0}'
BODY = b"x" * 1024


async def trivial(request: Request) -> Response:
    await request.body()
    return Response(ANSWER, media_type="application/json")


def broker_app(kind: str) -> FastAPI:
    """The broker's app, its hot routes answered by :func:`trivial`, its stack built."""
    app = create_app(Settings())
    app.router.routes[:] = [
        APIRoute(r.path, trivial, methods=sorted(r.methods or ()))
        if isinstance(r, APIRoute) and r.path in PATHS else r for r in app.router.routes]
    entries = []
    for entry in app.user_middleware:
        cls: object = entry.cls
        if cls is HotLane:
            if kind == "stack":
                continue
            rows = [Route(r, trivial) for r in app.router.routes
                    if isinstance(r, APIRoute) and r.path in PATHS]
            entry = Middleware(HotLane, routes=rows, served=app)
        entries.append(entry)
    app.user_middleware = entries
    standing_in = HttpMetrics.__dict__["standing_in"]
    if kind == "lane+instrumentator":  # the entry itself, not the copy
        HttpMetrics.standing_in = classmethod(  # type: ignore[method-assign,assignment]
            lambda cls, entry, route: entry)
    try:
        app.middleware_stack = app.build_middleware_stack()
    finally:
        HttpMetrics.standing_in = standing_in  # type: ignore[method-assign]
    return app


def _scope(path: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "root_path": "", "query_string": b"", "client": ("127.0.0.1", 50000),
            "server": ("broker", 80),
            "headers": [(b"host", b"broker"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(BODY)).encode())]}


def _body() -> Receive:
    messages: list[Message] = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> Message:
        return messages.pop()

    return receive


async def cpu_per_request(app: FastAPI, path: str, requests: int) -> float:
    statuses: set[int] = set()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    started = time.process_time()
    for _ in range(requests):
        await app(_scope(path), _body(), send)
    spent = time.process_time() - started
    if statuses != {200}:
        raise SystemExit(f"{path} answered {sorted(statuses)}, not 200")
    return spent / requests * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    kinds = ("lane", "lane+instrumentator", "stack")
    for path in PATHS:
        apps = {kind: broker_app(kind) for kind in kinds}
        for app in apps.values():
            await cpu_per_request(app, path, 200)  # warm
        rows: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind, app in apps.items():
                rows[kind].append(await cpu_per_request(app, path, args.requests))
        for kind, figures in rows.items():
            print(f"POST {path:9} {kind:20} µs of CPU per request: "
                  f"{min(figures):6.1f}-{max(figures):6.1f}, "
                  f"median {statistics.median(figures):6.1f}")


if __name__ == "__main__":
    asyncio.run(main())
