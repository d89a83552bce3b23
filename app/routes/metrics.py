"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition), for any
service (broker or compactor). Under several workers both answer the server's totals,
whichever worker serves the request (app/telemetry/registry.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.observability import Service, json_snapshot
from app.telemetry.registry import Families

router = APIRouter(tags=["metrics"])


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/metrics", summary="The server's metrics as JSON")
async def metrics_json(request: Request) -> dict[str, Any]:
    service = _service(request)
    return json_snapshot(await service.registry.gather(), service.metrics_header())


@router.get("/metrics/prometheus", summary="The server's metrics, Prometheus text format",
            response_class=Response)
async def metrics_prometheus(request: Request) -> Response:
    families = await _service(request).registry.gather()
    return Response(generate_latest(Families(families)), media_type=CONTENT_TYPE_LATEST)
