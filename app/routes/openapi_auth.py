"""The OpenAPI document with auth on: the bearer scheme, on every protected operation,
with the 401, 403 and 429 answers it may give (and 503 with JWTs: the issuer's key set
could not be loaded), so a generated client sends the token and knows the refusals.

They are declared only with auth on: with it off no request is ever refused this way,
and the document says only what the broker answers."""

from __future__ import annotations

from typing import Any

from app.routes.access import METRICS_PATHS, OPEN_PATHS
from app.routes.errors import REALM
from app.routes.openapi import JSON, RETRY_AFTER, error_example, named
from app.settings import AuthSettings

SCHEME = "bearerAuth"
METRICS_SCHEME = "metricsToken"
_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
WWW_AUTHENTICATE: dict[str, Any] = {"WWW-Authenticate": {
    "description": "the Bearer challenge (RFC 6750): the realm, and with a token sent "
                   "the error code and its description",
    "required": True, "schema": {"type": "string"},
    "example": f'Bearer realm="{REALM}", error="invalid_token", '
               'error_description="the token has expired"'}}
# status: (description, error type, its example's message, headers)
_REFUSALS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "401": ("no bearer token, or one that does not verify (Unauthenticated); see the "
            "WWW-Authenticate header", "Unauthenticated", "the token has expired",
            WWW_AUTHENTICATE),
    "403": ("the principal lacks the right on a topic or group the request names "
            "(Forbidden); nothing was written", "Forbidden",
            "billing may not produce on topic audit", WWW_AUTHENTICATE),
    "429": ("over the principal's request or produce-bytes quota on this broker "
            "(QuotaExceeded); nothing was written: retry after Retry-After seconds",
            "QuotaExceeded", "billing is over its request quota on this broker; retry in 1 s",
            RETRY_AFTER),
    "503": ("the token issuer's keys could not be loaded (Unavailable); retry after "
            "Retry-After seconds", "Unavailable",
            "the token issuer's keys could not be loaded; retry later", RETRY_AFTER),
}


def refusal(status: str) -> dict[str, Any]:
    """The answer object of one access refusal, with its example and headers."""
    description, error_type, message, headers = _REFUSALS[status]
    example = {**error_example(error_type), "error": message}
    return {"description": description, "headers": headers, "content": {JSON: {
        "schema": _ERROR_SCHEMA, "examples": named({error_type: example})}}}


def declare_bearer_auth(schema: dict[str, Any], settings: AuthSettings) -> None:
    """Add the scheme and mark each protected operation (in place). A status the
    operation declares already (503) keeps its answer and gains the example."""
    open_paths = OPEN_PATHS | (METRICS_PATHS if settings.auth_metrics == "open" else set())
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http", "scheme": "bearer",
        "description": "An API key (llog_…, from `llog auth new-key`) or a JWT from the "
                       "configured issuer (docs/operations.md, Security)"}
    # Only a JWT issuer's key set can fail to load.
    statuses = [s for s in _REFUSALS if s != "503" or settings.jwt_enabled]
    for path, operations in schema.get("paths", {}).items():
        if path in open_paths:
            continue
        for operation in operations.values():
            operation["security"] = [{SCHEME: []}]
            responses = operation.setdefault("responses", {})
            for status in statuses:
                answer = refusal(status)
                declared = responses.setdefault(status, answer)
                if declared is not answer:
                    _add_examples(declared, answer)


def _add_examples(declared: dict[str, Any], answer: dict[str, Any]) -> None:
    examples = declared.get("content", {}).get(JSON, {}).get("examples")
    if examples is not None:
        examples.update(answer["content"][JSON]["examples"])


def declare_metrics_token(schema: dict[str, Any], settings: AuthSettings) -> None:
    """With LLOG_METRICS_TOKEN set: its scheme on the metrics operations, and their 401."""
    if settings.metrics_token is None:
        return
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[METRICS_SCHEME] = {
        "type": "http", "scheme": "bearer",
        "description": "The scrapers' token, LLOG_METRICS_TOKEN (docs/operations.md, "
                       "Security)"}
    answer = {**refusal("401"), "description": "no bearer token, or not the metrics "
                                               "token (Unauthenticated)"}
    for path, operations in schema.get("paths", {}).items():
        if path not in METRICS_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{METRICS_SCHEME: []}]
            operation.setdefault("responses", {})["401"] = answer
