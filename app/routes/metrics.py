"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition), for any
service (broker or compactor)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.observability import Service, json_snapshot
from app.routes.models import MetricsSnapshot

router = APIRouter(tags=["metrics"])
PROMETHEUS_EXAMPLE = """# HELP llog_produce_records_total Records appended
# TYPE llog_produce_records_total counter
llog_produce_records_total 2.0
"""


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/metrics", summary="Process-local metrics as JSON",
            response_model=MetricsSnapshot,
            responses={200: {"description": "every figure of this process"}})
async def metrics(request: Request) -> JSONResponse:
    service = _service(request)
    return JSONResponse(json_snapshot(service.registry, service.metrics_header()))


@router.get("/metrics/prometheus", summary="Process-local metrics, Prometheus text format",
            response_class=Response, responses={200: {
                "description": "every figure of this process, for scraping",
                "content": {"text/plain": {"schema": {"type": "string"},
                                           "example": PROMETHEUS_EXAMPLE}}}})
async def metrics_prometheus(request: Request) -> Response:
    return Response(generate_latest(_service(request).registry),
                    media_type=CONTENT_TYPE_LATEST)
