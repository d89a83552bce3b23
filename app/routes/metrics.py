"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition), for any
service (broker or compactor). Under several workers both answer the server's totals,
whichever worker serves the request (app/telemetry/registry.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.observability import Service, json_snapshot
from app.routes.models import MetricsSnapshot
from app.telemetry.registry import Families

router = APIRouter(tags=["metrics"])
PROMETHEUS_EXAMPLE = """# HELP llog_produce_records_total Records appended
# TYPE llog_produce_records_total counter
llog_produce_records_total 2.0
"""


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/metrics", summary="The server's metrics as JSON",
            response_model=MetricsSnapshot,
            responses={200: {"description": "every figure of this server"}})
async def get_metrics(request: Request) -> JSONResponse:
    service = _service(request)
    return JSONResponse(json_snapshot(await service.registry.gather(),
                                      service.metrics_header()))


@router.get("/metrics/prometheus", summary="The server's metrics, Prometheus text format",
            response_class=Response, responses={200: {
                "description": "every figure of this server, for scraping",
                "content": {"text/plain": {"schema": {"type": "string"},
                                           "example": PROMETHEUS_EXAMPLE}}}})
async def get_prometheus_metrics(request: Request) -> Response:
    families = await _service(request).registry.gather()
    return Response(generate_latest(Families(families)), media_type=CONTENT_TYPE_LATEST)
