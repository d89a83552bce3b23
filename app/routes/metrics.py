"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition), for any
service (broker or compactor). Under several workers both answer the server's totals,
whichever worker serves the request (app/telemetry/registry.py)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr

from app.errors import Unauthenticated
from app.observability import Service, json_snapshot
from app.routes.errors import error_response
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


def _refused(request: Request) -> Response | None:
    """With LLOG_METRICS_TOKEN set (``app.state.metrics_token``), a 401 unless the request
    carries it as its bearer token: the metrics name topics and principals."""
    token: SecretStr | None = getattr(request.app.state, "metrics_token", None)
    if token is None:
        return None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip()
    if scheme.lower() == "bearer" and given and hmac.compare_digest(
            given.encode(), token.get_secret_value().encode()):
        return None
    if scheme.lower() == "bearer" and given:
        return error_response(Unauthenticated("not the metrics token"))
    return error_response(Unauthenticated(
        "the metrics need Authorization: Bearer <LLOG_METRICS_TOKEN>", code=None))


@router.get("/metrics", summary="The server's metrics as JSON",
            response_model=MetricsSnapshot,
            responses={200: {"description": "every figure of this server"}})
async def get_metrics(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    service = _service(request)
    return JSONResponse(json_snapshot(await service.registry.gather(),
                                      service.metrics_header()))


@router.get("/metrics/prometheus", summary="The server's metrics, Prometheus text format",
            response_class=Response, responses={200: {
                "description": "every figure of this server, for scraping",
                "content": {"text/plain": {"schema": {"type": "string"},
                                           "example": PROMETHEUS_EXAMPLE}}}})
async def get_prometheus_metrics(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    families = await _service(request).registry.gather()
    return Response(generate_latest(Families(families)), media_type=CONTENT_TYPE_LATEST)
