"""GET /metrics (JSON snapshot) and GET /metrics/prometheus (text exposition)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.broker.metrics import json_snapshot
from app.broker.state import BrokerState
from app.routes.deps import broker_state

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Process-local metrics as JSON")
async def metrics_json(state: Annotated[BrokerState, Depends(broker_state)]) -> dict[str, Any]:
    s = state.settings
    header = {
        "broker_id": s.broker_id,
        "roles": list(s.roles),
        "status": state.status,
        "started_at_ms": state.started_at_ms,
        "batch": {"max_bytes": s.batch_max_bytes, "max_delay_ms": s.batch_max_delay_ms,
                  "buffer_max_bytes": s.batch_buffer_max_bytes},
        "s3_prices_note": "S3 cost figures are estimates at S3 Standard us-east-1 list prices",
    }
    return json_snapshot(state.registry, header)


@router.get("/metrics/prometheus", summary="Process-local metrics, Prometheus text format",
            response_class=Response)
async def metrics_prometheus(state: Annotated[BrokerState, Depends(broker_state)]) -> Response:
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
