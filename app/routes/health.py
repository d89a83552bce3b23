"""Health of any service (broker or compactor): liveness and readiness.

- ``GET /health/live``: the process is alive and its loops are working (503 only when
  a background loop has failed: restart it).
- ``GET /health/ready``: it takes work now (200 only in status ``ok``; 503 while
  starting, draining or failed). Load balancers route on this.
- ``GET /health``: the same as ``/health/ready``, kept for existing checks.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.observability import Service
from app.routes.models import HealthResponse, ServiceStatus
from app.routes.openapi import Responses, response

router = APIRouter(tags=["health"])
_SERVING = {"broker_id": "broker-1", "host": "127.0.0.1", "port": 8080,
            "started_at_ms": 1760000000000}
_STATES = {
    "ok": {"status": "ok", **_SERVING},
    "starting": {"status": "starting", **_SERVING},
    "draining for shutdown": {"status": "stopping", **_SERVING},
    "failed": {"status": "failed", **_SERVING,
               "failure": "the produce batcher stopped: StorageUnavailable(...)"},
}


def _answers(serving: str, not_serving: str, *down: str) -> Responses:
    """The 200 and 503 of a health endpoint, with an example of each state it covers."""
    return {**response(200, serving, HealthResponse,
                       {k: v for k, v in _STATES.items() if k not in down}),
            **response(503, not_serving, HealthResponse, {k: _STATES[k] for k in down},
                       retry_after=False)}


_READINESS = _answers("taking work", "starting, draining or failed", "starting",
                      "draining for shutdown", "failed")


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _answer(service: Service, ok: bool) -> JSONResponse:
    health = service.health
    body = HealthResponse(status=ServiceStatus(health.status), started_at_ms=health.started_at_ms,
                          failure=health.failure, **service.identity())
    return JSONResponse(body.model_dump(exclude_none=True), status_code=200 if ok else 503)


@router.get("/health", response_model=HealthResponse,
            responses=_READINESS,
            summary="Readiness (the same as /health/ready)")
async def check_health(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.health.ready)


@router.get("/health/ready", response_model=HealthResponse,
            responses=_READINESS,
            summary="200 while the service takes work; 503 starting, draining or failed")
async def check_readiness(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.health.ready)


@router.get("/health/live", response_model=HealthResponse,
            responses=_answers("the process works", "a background loop failed: restart it",
                               "failed"),
            summary="200 while the process works; 503 once a background loop failed")
async def check_liveness(request: Request) -> JSONResponse:
    service = _service(request)
    return _answer(service, service.health.status != "failed")
