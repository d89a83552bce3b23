"""The services of a role this broker process does not have refuse when used.

A broker runs the roles LLOG_ROLES names; the services of the others are never built.
In their place the broker holds a stand-in (:func:`disabled`) that raises
:class:`~app.errors.RoleDisabled` with the role's refusal below as soon as anything of
it is used, as a closed stream raises its own error: no handler checks for a missing
service, and the refusal of each role is written once. Where a refusal answers part of
a request rather than the whole (each entry of a produce, each partition of a
consume), the request asks :func:`refusal_of` first.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar, cast

from app.errors import RoleDisabled

T = TypeVar("T")

READ = "this broker does not have the read role"
WRITE = "this broker does not have the write role"
GROUPS = "this broker does not serve consumer groups (it needs the read role)"
ADMIN = "this broker does not serve topic administration (it needs the read role)"


class _Refusing:
    """A service of a role the broker lacks: any attribute, or a call, refuses."""

    __slots__ = ("refusal",)

    def __init__(self, refusal: str) -> None:
        self.refusal = refusal

    def __getattr__(self, name: str) -> NoReturn:
        # Python's own lookups (copy, pickle, hasattr of a protocol, inspect) ask for
        # dunder names and find none, as on any object; the service's names refuse.
        # The refusal is read past this method: on a copy not yet filled in it would
        # come back here for ever.
        if (name.startswith("__") and name.endswith("__")) or name == "refusal":
            raise AttributeError(name)
        raise RoleDisabled(object.__getattribute__(self, "refusal"))

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RoleDisabled(self.refusal)

    def __repr__(self) -> str:
        return f"<refused: {self.refusal}>"


def disabled(kind: type[T], refusal: str) -> T:
    """The stand-in for a service of type ``kind`` on a broker without its role."""
    return cast(T, _Refusing(refusal))


def refusal_of(service: object) -> RoleDisabled | None:
    """What using ``service`` would raise when it is a stand-in; None when it is there."""
    return RoleDisabled(service.refusal) if isinstance(service, _Refusing) else None
