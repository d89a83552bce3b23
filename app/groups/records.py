"""The JSON records of consumer groups in Oxia (docs/protocol.md, Consumer groups).

Readers keep fields they do not know, and a rewritten record carries them through, so
an older broker never strips what a newer one added.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import CorruptData


class _Json(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def parse(cls, raw: bytes) -> Self:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise CorruptData(f"a consumer group's {cls.__name__} record does not parse: "
                              f"{exc.errors()[0].get('msg')}") from None


class Member(_Json):
    """One member as the group record lists it."""

    member_id: str
    topics: tuple[str, ...]
    session_timeout_ms: int
    joined_at_ms: int
    client_id: str | None = None


class GroupRecord(_Json):
    """``{root}/_groups/{group}``: who is in the group, in which generation, over which
    partition counts (the inputs of the assignment)."""

    group: str
    generation: int = 0
    members: tuple[Member, ...] = ()
    partitions: dict[str, int] = Field(default_factory=dict)
    created_at_ms: int = 0
    updated_at_ms: int = 0

    def member(self, member_id: str) -> Member | None:
        return next((m for m in self.members if m.member_id == member_id), None)


class Lease(_Json):
    """``{root}/_groups/{group}/members/{member_id}``: a member's session, renewed by
    its heartbeats through any broker."""

    member_id: str
    expires_at_ms: int
    renewed_at_ms: int
    broker_id: str | None = None

    def alive(self, now_ms: int) -> bool:
        return now_ms < self.expires_at_ms


class CommittedOffset(_Json):
    """``{root}/_groups/{group}/offsets/{topic}/{partition:010d}``: the last offset the
    group processed, and the generation (and member) that committed it."""

    offset: int
    generation: int
    committed_at_ms: int
    member_id: str | None = None
