"""POST /topics/{topic}/stream/tickets: a short-lived, single-use ticket that opens one
event stream of the topic as the caller, for browsers (``EventSource`` cannot send an
``Authorization`` header). Served only with access control on (app/auth/tickets.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app.routes.access import control_of, principal_of
from app.routes.models import PathTopic
from app.routes.openapi import errors, response
from app.storage.keys import validate_topic

router = APIRouter(tags=["consume"])


class StreamTicket(BaseModel):
    ticket: str = Field(description="pass as ?ticket= on GET /topics/{topic}/stream; "
                                    "opaque, for this topic and caller, usable once")
    expires_in_s: float = Field(description="the ticket is refused after this long")


@router.post(
    "/topics/{topic}/stream/tickets",
    response_model=StreamTicket,
    summary="A single-use ticket that opens one event stream of the topic (for browsers)",
    responses={**response(200, "the ticket", StreamTicket, {"ticket": {
                   "ticket": "llogt_eyJwIjoicmVhZGVyIiwidCI6Im9yZGVycyJ9.bWFjX29mX3RoZV9wYXlsb2Fk",
                   "expires_in_s": 30.0}}), **errors(400)},
)
async def issue_stream_ticket(
    request: Request, topic: PathTopic,
) -> StreamTicket:
    validate_topic(topic)
    control, principal = control_of(request), principal_of(request)
    assert control is not None and principal is not None, "served only with auth on"
    return StreamTicket(ticket=control.mint_ticket(principal, topic),
                        expires_in_s=control.tickets.ttl_s)
