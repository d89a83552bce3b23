"""The ``error_type`` enum of the HTTP API, generated from the error tree (app/errors.py)
so that the document cannot drift from the code.

Each name carries, in the OpenAPI document, what a client needs to act on it:
``x-retriable`` (sending the same request again may succeed) and ``x-maybe-written`` (a
failed produce entry's records may have been committed anyway), and in
``x-enum-descriptions`` what it means (``x-enum-varnames``: the members' names in a
generated client). docs/http-api.md's table lists the same.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import GetJsonSchemaHandler
from pydantic_core import CoreSchema

from app.errors import LlogError, error_types


@dataclass(frozen=True)
class ErrorTypeInfo:
    name: str
    retriable: bool
    maybe_written: bool
    meaning: str


def _meaning(cls: type[LlogError]) -> str:
    """The first paragraph of the class's docstring, on one line."""
    return " ".join((cls.__doc__ or cls.__name__).strip().split("\n\n")[0].split())


# Names only the HTTP edge gives (app/routes/errors.py): requests that reach no route.
EDGE_ERROR_TYPES = (
    ErrorTypeInfo("NotFound", False, False, "No route serves this path."),
    ErrorTypeInfo("MethodNotAllowed", False, False, "The path does not take this method."),
    ErrorTypeInfo("HTTPError", False, False, "Any other refusal by the HTTP layer."),
)
ERROR_TYPES: tuple[ErrorTypeInfo, ...] = (
    *(ErrorTypeInfo(c.__name__, c.retriable, c.maybe_written, _meaning(c))
      for c in error_types()),
    *EDGE_ERROR_TYPES,
)
ERROR_TYPE_NAMES = frozenset(info.name for info in ERROR_TYPES)

DESCRIPTION = (
    "A stable name for what went wrong (docs/http-api.md, Errors). Clients may switch on "
    "it; names may be added, existing ones keep their meaning. `x-retriable` says for each "
    "name whether sending the same request again may succeed, `x-maybe-written` whether "
    "a failed produce entry's records may have been committed although the broker could "
    "not confirm it (retry with the same idempotency_key to be sure of one copy), and "
    "`x-enum-descriptions` what each name means, in the order of `enum`. Retriable: "
    + ", ".join(i.name for i in ERROR_TYPES if i.retriable) + ". May have written: "
    + ", ".join(i.name for i in ERROR_TYPES if i.maybe_written) + ".")


def constant_name(name: str) -> str:
    """``InvalidRequest`` -> ``INVALID_REQUEST``, ``HTTPError`` -> ``HTTP_ERROR``: the
    enum members' names in generated clients (``x-enum-varnames``)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


class _DocumentedErrorType(enum.StrEnum):
    """The base of ``ErrorType``: documents every member in its JSON schema."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        target["description"] = DESCRIPTION
        target["x-enum-descriptions"] = [i.meaning for i in ERROR_TYPES]
        target["x-enum-varnames"] = [constant_name(i.name) for i in ERROR_TYPES]
        target["x-retriable"] = {i.name: i.retriable for i in ERROR_TYPES}
        target["x-maybe-written"] = {i.name: i.maybe_written for i in ERROR_TYPES}
        return schema


if TYPE_CHECKING:
    # The members are made from the error tree when the module loads, which a type
    # checker cannot follow: to it an error type is the string it is on the wire.
    ErrorType = str
else:
    ErrorType = _DocumentedErrorType("ErrorType", [(i.name, i.name) for i in ERROR_TYPES])
