"""A JSON request body read into its model as FastAPI reads a route's body parameter, for
routes served outside the framework (app/routes/hot_lane.py): the same model, or the
same :class:`RequestValidationError` (and so the same 400 answer) on a mistake.

FastAPI decodes a body as JSON only when its content type is ``application/json`` or
``application/*+json`` (it is strict about content types by default); any other body
is validated as it came, which the model refuses. An empty body is a missing one.
"""

from __future__ import annotations

import email.message
import json
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

M = TypeVar("M", bound=BaseModel)


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    if content_type == "application/json":
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


def read_body(model: type[M], body: bytes, content_type: str | None) -> M:
    """``body`` as an instance of ``model`` (raises :class:`RequestValidationError`)."""
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    doc: Any = _decoded(body) if is_json(content_type) else body
    try:
        return model.model_validate(doc, from_attributes=True)  # as FastAPI validates
    except ValidationError as exc:
        raise invalid_body(exc) from None


def invalid_body(exc: ValidationError) -> RequestValidationError:
    """A model's refusal of a body, located as FastAPI locates it (under ``body``)."""
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])


def _decoded(body: bytes) -> Any:
    # The standard parser, as FastAPI's: orjson reads big integers as floats and refuses
    # NaN, which would change what the model is given. (Bodies here are small.)
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": exc.msg}}]) from None
    except ValueError:  # not UTF-8, say: FastAPI's answer for a body it cannot read
        raise HTTPException(status_code=400,
                            detail="There was an error parsing the body") from None
