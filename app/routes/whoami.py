"""``GET /whoami``: who the broker takes the caller for, and what it may do.

A client (the web console, a CLI) asks once instead of learning its rights from 403s:
the console hides the actions the principal cannot take. The rights are the auth
file's patterns as written there (exact names, and prefixes ending in ``*``), so a
client can match a name the way the broker does (app/auth/rights.py) without the
broker listing topics the principal may not know of.

Served with access control on or off, so a client need not know which: with it off the
answer says so (``auth: false``) and grants every right on every name (``*``). With it
on, :class:`~app.routes.access.AccessMiddleware` has already authenticated the request
(401 without a valid token) and charged its request quota; a stream ticket never
reaches this path (tickets open only ``GET /topics/{topic}/stream``).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from app.auth.rights import Acl, Names, Right
from app.routes.access import control_of, principal_of
from app.routes.openapi import response

router = APIRouter(tags=["auth"])

EVERYTHING = ["*"]
_OFF: JsonDict = {"auth": False, "principal": None, "method": None, "expires_at_ms": None,
        "rights": {"produce": ["*"], "consume": ["*"], "group": ["*"], "admin": ["*"]}}
_API_KEY: JsonDict = {"auth": True, "principal": "orders-service", "method": "api-key",
            "expires_at_ms": None,
            "rights": {"produce": ["orders", "orders-retry.*"], "consume": ["orders"],
                       "group": ["billing-*"], "admin": []}}
_JWT: JsonDict = {"auth": True, "principal": "alice@example.com", "method": "jwt",
        "expires_at_ms": 1760000305000,
        "rights": {"produce": [], "consume": ["public.*"], "group": [], "admin": []}}


class Rights(BaseModel):
    """Per right, the names it applies to: exact names, and prefixes with a trailing
    ``*`` (``*`` alone: every name). Topics, except ``group``: consumer groups."""

    produce: list[str] = Field(description="topics the principal may produce to")
    consume: list[str] = Field(description="topics it may consume, and read offsets of")
    group: list[str] = Field(description="consumer groups it may join, commit or manage")
    admin: list[str] = Field(description="topics it may create, change and delete")


class WhoAmI(BaseModel):
    """The caller as the broker sees it. With access control off: ``auth`` false, no
    principal, and every right on everything."""

    model_config = ConfigDict(json_schema_extra={"examples": [_OFF, _API_KEY]})

    auth: bool = Field(description="whether access control is on (LLOG_AUTH=on)")
    # Each null field has a default only so that the schema does not require it: the
    # document's examples lose their nulls (FastAPI drops None from it). An answer
    # always carries all of them.
    principal: str | None = Field(None, description="the principal the token names; null "
                                              "with access control off")
    method: Literal["api-key", "jwt"] | None = Field(
        None, description="how the principal proved itself; null with access control off")
    expires_at_ms: int | None = Field(None, description=(
        "when the broker stops accepting the credential (a JWT's exp plus the broker's "
        "leeway), milliseconds since the Unix epoch; null if it does not expire (an "
        "API key, until removed from the auth file) or with access control off"))
    rights: Rights


def patterns(names: Names) -> list[str]:
    """``names`` as auth-file patterns: exact names, then prefixes with ``*``, sorted."""
    return sorted(names.exact) + [f"{prefix}*" for prefix in names.prefixes]


def rights_of(acl: Acl) -> Rights:
    def of(right: Right) -> list[str]:
        names = acl.grants.get(right)
        return patterns(names) if names is not None else []

    return Rights(produce=of(Right.PRODUCE), consume=of(Right.CONSUME),
                  group=of(Right.GROUP), admin=of(Right.ADMIN))


@router.get(
    "/whoami",
    response_model=WhoAmI,
    summary="The caller's principal and its rights",
    responses=response(200, "the caller and its rights", WhoAmI, {
        "access control off": _OFF, "an API key": _API_KEY, "a JWT": _JWT}),
)
async def get_whoami(request: Request, answer: Response) -> WhoAmI:
    # The answer depends on the Authorization header: no shared cache may keep it.
    answer.headers["Cache-Control"] = "no-store"
    control, principal = control_of(request), principal_of(request)
    if control is None:
        return WhoAmI(auth=False, principal=None, method=None, expires_at_ms=None,
                      rights=Rights(produce=EVERYTHING, consume=EVERYTHING,
                                    group=EVERYTHING, admin=EVERYTHING))
    assert principal is not None, "AccessMiddleware authenticates every protected path"
    assert principal.method != "ticket", "a stream ticket opens only a stream"
    expires = principal.expires_at
    return WhoAmI(auth=True, principal=principal.name, method=principal.method,
                  expires_at_ms=round(expires * 1000) if expires is not None else None,
                  rights=rights_of(control.entry(principal).acl))
