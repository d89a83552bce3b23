"""GET /health."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.broker.state import BrokerState
from app.routes.deps import broker_state
from app.routes.models import HealthResponse

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthResponse,
            responses={503: {"model": HealthResponse, "description": "not serving"}})
async def health(state: Annotated[BrokerState, Depends(broker_state)]) -> JSONResponse:
    s = state.settings
    body = HealthResponse(status=state.status, broker_id=s.broker_id, host=s.host, port=s.port,
                          started_at_ms=state.started_at_ms)
    return JSONResponse(body.model_dump(), status_code=200 if state.status == "ok" else 503)
