"""The OpenAPI document with auth on: the bearer scheme, on every protected operation,
with the 401, 403 and 429 answers it may give, so a generated client sends the token."""

from __future__ import annotations

from typing import Any

from app.routes.access import METRICS_PATHS, OPEN_PATHS
from app.settings import Settings

SCHEME = "bearerAuth"
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
_REFUSALS = {
    "401": "no bearer token, or one that does not verify (Unauthenticated); see the "
           "WWW-Authenticate header",
    "403": "the principal lacks the right on a topic or group the request names "
           "(Forbidden)",
    "429": "over the principal's request or produce-bytes quota on this broker "
           "(QuotaExceeded); retry after Retry-After seconds",
}


def declare_bearer_auth(schema: dict[str, Any], settings: Settings) -> None:
    """Add the scheme and mark each protected operation (in place)."""
    open_paths = OPEN_PATHS | (METRICS_PATHS if settings.auth_metrics == "open" else set())
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http", "scheme": "bearer",
        "description": "An API key (llog_…, from `llog auth new-key`) or a JWT from the "
                       "configured issuer (docs/operations.md, Security)"}
    for path, operations in schema.get("paths", {}).items():
        if path in open_paths:
            continue
        for operation in operations.values():
            operation["security"] = [{SCHEME: []}]
            responses = operation.setdefault("responses", {})
            for status, description in _REFUSALS.items():
                responses.setdefault(status, {"description": description, "content": _ERROR})
