"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition), for any
service (broker or compactor)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.observability import Service, json_snapshot

router = APIRouter(tags=["metrics"])


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/metrics", summary="Process-local metrics as JSON")
async def metrics_json(request: Request) -> dict[str, Any]:
    service = _service(request)
    return json_snapshot(service.registry, service.metrics_header())


@router.get("/metrics/prometheus", summary="Process-local metrics, Prometheus text format",
            response_class=Response)
async def metrics_prometheus(request: Request) -> Response:
    return Response(generate_latest(_service(request).registry),
                    media_type=CONTENT_TYPE_LATEST)
