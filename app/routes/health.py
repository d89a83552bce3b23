"""Health of any service (broker or compactor): liveness and readiness.

- ``GET /health/live``: the process is alive and its loops are working (503 only when
  a background loop has failed: restart it).
- ``GET /health/ready``: it takes work now (200 only in status ``ok``; 503 while
  starting, draining or failed). Load balancers route on this.
- ``GET /health``: the same as ``/health/ready``, kept for existing checks.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.observability import Service
from app.routes.models import HealthResponse, ServiceStatus

router = APIRouter(tags=["health"])
_NOT_SERVING: dict[int | str, dict[str, Any]] = {
    503: {"model": HealthResponse, "description": "not serving"}}


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _answer(service: Service, ok: bool) -> JSONResponse:
    body = HealthResponse(status=ServiceStatus(service.status), started_at_ms=service.started_at_ms,
                          failure=service.failure, **service.identity())
    return JSONResponse(body.model_dump(exclude_none=True), status_code=200 if ok else 503)


@router.get("/health", response_model=HealthResponse, responses=_NOT_SERVING,
            summary="Readiness (the same as /health/ready)")
async def health(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.status == "ok")


@router.get("/health/ready", response_model=HealthResponse, responses=_NOT_SERVING,
            summary="200 while the service takes work; 503 starting, draining or failed")
async def ready(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.status == "ok")


@router.get("/health/live", response_model=HealthResponse, responses=_NOT_SERVING,
            summary="200 while the process works; 503 once a background loop failed")
async def live(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.status != "failed")
