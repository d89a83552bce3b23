"""The OpenAPI document's conventions, kept in one place so that every route follows them
without thinking about it:

- an operation's id is its handler's name (``produce``, ``describe_topic``), so a
  generated client has ``produce(...)``, not ``produce_produce_post(...)``;
- an error status is declared in one line, ``**errors(400, 413)`` (or
  ``**error(404, "UnknownTopic", description=...)`` to name its error types), with the
  ``ErrorResponse`` body, an example for each error type that answers it (taken from the
  error tree, so a new class appears by itself) and, for 429 and 503, ``Retry-After``;
- FastAPI's 422, which this API never answers (validation failures are 400), is left out.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.models import Example
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.errors import AppendError, ForwardExpired, OffsetOutOfRange, error_types
from app.routes.error_types import ERROR_TYPE_NAMES, ERROR_TYPES
from app.routes.models import ErrorResponse

JSON = "application/json"
Responses = dict[int | str, dict[str, Any]]

# Statuses whose answers say when to come back.
RETRY_AFTER_STATUSES = frozenset({429, 503})
RETRY_AFTER: dict[str, Any] = {"Retry-After": {
    "description": "seconds to wait before sending the request again",
    "required": True, "schema": {"type": "integer", "minimum": 0}, "example": 1}}

DEFAULT_DESCRIPTIONS = {
    400: "invalid request (malformed JSON, wrong shape or types, a value out of range); "
         "nothing was written",
    401: "no valid credentials",
    403: "the credentials do not allow this",
    404: "not found",
    409: "conflicts with what exists",
    413: "over a size or count limit; nothing was written",
    429: "too many requests; retry after Retry-After",
    500: "stored data failed to verify (corrupt, missing or a gap); nothing was written",
    503: "refused before anything was written; retry after Retry-After, or on another "
         "broker",
}
# Error types that only ever describe one entry of a result, never a whole request
# (their class's status does not apply), so no error status is exemplified with them.
ENTRY_ONLY = frozenset(c for c in error_types()
                       if issubclass(c, AppendError) or c in (OffsetOutOfRange,
                                                              ForwardExpired))
# Why a consumer group refuses a commit (409), nothing written: the caller's view of it
# is out of date, or it has live members and the caller is none of them.
COMMIT_REFUSALS = ("UnknownMember", "StaleGeneration", "PartitionNotAssigned",
                   "GroupNotEmpty")
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")

_MEANING = {info.name: info.meaning for info in ERROR_TYPES}
_INVALID_EXAMPLE = {"error_type": "InvalidRequest", "error": "invalid request body",
                    "details": [{"loc": "topic_partitions.0.partition",
                                 "msg": "Input should be a valid integer"}]}


def named(bodies: dict[str, Any]) -> dict[str, Example]:
    """``{name: body}`` as OpenAPI examples: keyed by a slug of the name, which is their
    summary."""
    return {re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-"):
            Example(summary=name, value=body) for name, body in bodies.items()}


def response(status: int, description: str, model: Any,
             examples: dict[str, Any] | None = None, *, retry_after: bool | None = None,
             headers: dict[str, Any] | None = None) -> Responses:
    """One declared status with its body's model, named examples (``{name: body}``), the
    ``Retry-After`` header (by default for 429 and 503) and any other ``headers``."""
    entry: dict[str, Any] = {"model": model, "description": description}
    if examples:
        entry["content"] = {JSON: {"examples": named(examples)}}
    declared = dict(headers or {})
    if retry_after or (retry_after is None and status in RETRY_AFTER_STATUSES):
        declared = {**RETRY_AFTER, **declared}
    if declared:
        entry["headers"] = declared
    return {status: entry}


def error(status: int, *error_type: str, description: str | None = None) -> Responses:
    """An error status with the ``ErrorResponse`` body and an example for each of
    ``error_type`` (by default: every error type whose whole-request status it is)."""
    names = error_type or tuple(c.__name__ for c in error_types()
                                if c.http_status == status and c not in ENTRY_ONLY)
    unknown = set(names) - ERROR_TYPE_NAMES
    if unknown:
        raise ValueError(f"not error types: {sorted(unknown)}")
    return response(status, description or DEFAULT_DESCRIPTIONS[status], ErrorResponse,
                    {name: error_example(name) for name in names or ("HTTPError",)})


def store_errors() -> Responses:
    """The 500 and 503 of an operation that reads or writes Oxia (and needs the read
    role): a stored record that does not verify; no role, or the store unreachable."""
    return {**error(500, "CorruptData"), **error(503, "RoleDisabled", "StorageUnavailable")}


def errors(*statuses: int) -> Responses:
    """Several error statuses, each as :func:`error` declares it by default."""
    out: Responses = {}
    for status in statuses:
        out.update(error(status))
    return out


def error_example(error_type: str) -> dict[str, Any]:
    """An ``ErrorResponse`` body for this error type."""
    if error_type == "InvalidRequest":
        return dict(_INVALID_EXAMPLE)
    return {"error_type": error_type, "error": _MEANING[error_type]}


def name_operations(routes: list[Any]) -> None:
    """Each API route without an explicit ``operation_id`` is named after its handler;
    two operations of one name are refused here rather than renamed silently.

    This covers routes however they were added (``app.router.routes.extend``, which a
    ``generate_unique_id_function`` never sees, included routers, decorators)."""
    seen: dict[str, str] = {}
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        route.operation_id = route.operation_id or route.name
        if not SNAKE_CASE.match(route.operation_id):
            raise ValueError(f"operation id {route.operation_id!r} of {route.path} is not "
                             "snake_case: rename its handler or give operation_id=")
        for method in sorted(route.methods or ()):
            where = f"{method} {route.path}"
            other = seen.setdefault(route.operation_id, where)
            if other != where:
                raise ValueError(f"{where} and {other} are both {route.operation_id!r}: "
                                 "rename one handler or give operation_id=")


def install_openapi(app: FastAPI, *, extra_models: Sequence[type[BaseModel]] = (),
                    finish: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Serve the document by these conventions (built once, on first request).

    ``extra_models``: bodies a route parses itself, which FastAPI does not see, added to
    the named schemas; ``finish`` changes the built document in place (the bearer
    scheme with auth on)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            name_operations(app.routes)
            # A copy: FastAPI's document shares objects with the routes' declarations,
            # which every app of this process shares, and the steps below change it.
            schema = copy.deepcopy(get_openapi(title=app.title, version=app.version,
                                               description=app.description,
                                               routes=app.routes))
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    _tidy(operation.get("responses", {}))
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            _, extra = models_json_schema([(m, "validation") for m in extra_models],
                                          ref_template="#/components/schemas/{model}")
            for name, model_schema in extra.get("$defs", {}).items():
                schemas.setdefault(name, model_schema)
            nullable_as_type_lists(schema)
            if finish is not None:
                finish(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _tidy(responses: dict[str, Any]) -> None:
    """Drop the 422 and the titles FastAPI makes up for inline response schemas (from
    the path and method: "Response 503 Produce Produce Post")."""
    responses.pop("422", None)
    for answer in responses.values():
        for media in answer.get("content", {}).values():
            if media.get("schema", {}).get("title", "").startswith("Response "):
                del media["schema"]["title"]


_NULL = {"type": "null"}


def nullable_as_type_lists(node: Any) -> Any:
    """Rewrite, in place, each ``anyOf: [{type: T, ...}, {type: null}]`` (pydantic's
    ``T | None``) as ``{type: [T, "null"], ...}``: the same values, in OpenAPI 3.1's own
    spelling of "nullable". openapi-generator's Python client generator cannot build a
    client from the ``anyOf`` form when the branch has bounds or examples of its own (it
    makes a model of the union and fails on its null member). Unions with a ``$ref``
    or more members, and constants, are left as they are."""
    if isinstance(node, list):
        for item in node:
            nullable_as_type_lists(item)
    elif isinstance(node, dict):
        for value in node.values():
            nullable_as_type_lists(value)
        branches = node.get("anyOf")
        if (isinstance(branches, list) and len(branches) == 2 and _NULL in branches):
            (typed,) = [b for b in branches if b != _NULL]
            if isinstance(typed.get("type"), str) and not {"$ref", "const"} & set(typed):
                del node["anyOf"]
                for key, value in typed.items():
                    node.setdefault(key, value)
                node["type"] = [typed["type"], "null"]
                if "enum" in node:
                    node["enum"] = [*node["enum"], None]
    return node
