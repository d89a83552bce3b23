"""The console's routes: its page, its assets, and the reads the API has no route for.

The page and its assets are open (a browser's navigation carries no bearer token, and
they hold no data); everything the page shows it reads through the broker's own API
with the token the person gave it, so the API's rights, limits and pages apply as they
do to any client. What only the console needs comes from here, behind the same access
control as the API: the serving broker's metrics over the last minutes
(:mod:`app.console.series`), the preferred broker of each partition, and the standalone
compactor's health and figures (:mod:`app.console.compactor`).

None of these routes is in the OpenAPI document: the console is a client of the API,
not part of it.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from app.cluster.members import MemberView
from app.console.compactor import CompactorProbe
from app.console.series import MetricsRing
from app.errors import UnknownTopic
from app.routes.access import authorize_describe
from app.routes.models import PathTopic
from app.storage.keys import TopicPartition

ASSETS = Path(__file__).parent / "assets"
PAGE = "/console"
ASSET_PREFIX = "/console/assets/"
# What the page may load and reach: its own origin only (no CDN, no inline script), so
# a record's value rendered in the page can never run as code.
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
_SECURITY = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
             "Referrer-Policy": "no-referrer"}
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
# Only what the page loads is served from the folder (not the type declarations, the
# licences or the type checker's configuration).
_SERVED = frozenset(_TYPES)
# Partitions one placement answer ranks (a page of the topic's partitions table).
PLACEMENT_PAGE_MAX = 1000
_PLACEMENT_THREADS = anyio.CapacityLimiter(1)


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def load_assets(root: Path = ASSETS) -> dict[str, Asset]:
    """Every file the page may load, read once (a few hundred KiB): served from memory,
    revalidated by ETag so a broker of another version is never answered from a stale
    browser cache."""
    assets = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in _SERVED:
            body = path.read_bytes()
            media_type = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] \
                or "application/octet-stream"
            assets[path.relative_to(root).as_posix()] = Asset(
                body, media_type, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return assets


def console_router(ring: MetricsRing, probe: CompactorProbe | None) -> APIRouter:
    """The console's routes, over the assets as they are now, ``ring`` and ``probe``
    (None: no standalone compactor was named)."""
    assets = load_assets()
    page = assets["index.html"]
    router = APIRouter(include_in_schema=False)

    @router.get(PAGE)
    async def console_page(request: Request) -> Response:
        return _answer(request, page)

    @router.get(PAGE + "/")
    async def console_slash() -> RedirectResponse:
        return RedirectResponse(PAGE, status_code=308)

    @router.get(ASSET_PREFIX + "{name:path}")
    async def console_asset(name: str, request: Request) -> Response:
        asset = assets.get(name)
        if asset is None:
            return JSONResponse({"error_type": "NotFound", "error": f"no console asset {name}"},
                                status_code=404, headers=_SECURITY)
        return _answer(request, asset)

    @router.get("/console/api/series")
    async def console_series(request: Request) -> JSONResponse:
        # The serving broker's identity heads its figures: behind a load balancer each
        # reload of the page may be answered by another broker.
        head = request.app.state.service.metrics_header()
        return JSONResponse({"broker": {
            "broker_id": head["broker_id"], "roles": head["roles"], "status": head["status"],
            "started_at_ms": head["started_at_ms"]}, **ring.snapshot()},
            headers={"Cache-Control": "no-store"})

    @router.get("/console/api/compactor")
    async def console_compactor() -> JSONResponse:
        reading = await probe.reading() if probe is not None else None
        return JSONResponse({"configured": probe is not None, "compactor": reading},
                            headers={"Cache-Control": "no-store"})

    router.add_api_route("/console/api/placement/{topic}", console_placement, methods=["GET"])
    return router


async def console_placement(
    topic: PathTopic, request: Request,
    from_partition: Annotated[int, Query(ge=0, le=100_000)] = 0,
    max_partitions: Annotated[int, Query(ge=1, le=PLACEMENT_PAGE_MAX)] = 100,
) -> JSONResponse:
    """The preferred broker of a page of ``topic``'s partitions (none: affinity off)."""
    authorize_describe(request, topic)
    broker = request.app.state.broker  # assembled by the lifespan (app/broker/assembly.py)
    found = await broker.topics.topic(topic)
    if found is None:
        raise UnknownTopic(f"no topic {topic}")
    end = min(from_partition + max_partitions, found.partitions)
    view = broker.members.view()  # no members outside a cluster
    # The ranking reads no storage, but costs a hash per member and partition: a
    # page of it runs in a worker thread, one page at a time per process.
    placed = await anyio.to_thread.run_sync(
        _placement, view, topic, range(from_partition, end), limiter=_PLACEMENT_THREADS)
    return JSONResponse({"topic": topic, "affinity": bool(view.members),
                         "partitions": placed}, headers={"Cache-Control": "no-store"})


def _placement(view: MemberView, topic: str, partitions: range) -> list[dict[str, Any]]:
    placed: list[dict[str, Any]] = []
    for p in partitions:
        member = view.preferred(TopicPartition(topic, p), remember=False)
        placed.append({"partition": p} if member is None else {
            "partition": p, "member_id": member.member_id, "broker_id": member.broker_id,
            "url": member.url})
    return placed


def _answer(request: Request, asset: Asset) -> Response:
    headers = {**_SECURITY, "ETag": asset.etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)

