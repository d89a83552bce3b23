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


class GroupMember(_Json):
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
    members: tuple[GroupMember, ...] = ()
    partitions: dict[str, int] = Field(default_factory=dict)
    created_at_ms: int = 0
    updated_at_ms: int = 0

    def member(self, member_id: str) -> GroupMember | None:
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


# The offset and generation of a record that holds a pending commit and no confirmed
# one. A reader of an earlier release takes it for an offset below every log start:
# nothing committed, as it is.
NOTHING_COMMITTED = -1


class PendingCommit(_Json):
    """A commit written and not yet confirmed (docs/protocol.md, Commit). No reader
    takes it for the group's position: it is confirmed (becoming the record's offset),
    dropped by its own refusal, or dropped by the first reader of a newer generation,
    which fences it (its confirmation then fails)."""

    offset: int
    generation: int
    committed_at_ms: int
    member_id: str | None = None


class CommittedOffset(_Json):
    """``{root}/_groups/{group}/offsets/{topic}/{partition:010d}``: the last offset the
    group processed, and the generation (and member) that committed it; and a commit
    in flight, when there is one (``pending``)."""

    offset: int
    generation: int
    committed_at_ms: int
    member_id: str | None = None
    pending: PendingCommit | None = None

    @classmethod
    def holding(cls, confirmed: CommittedOffset | None, pending: PendingCommit
                ) -> CommittedOffset:
        """The record of ``confirmed`` (None: nothing committed yet) with ``pending``."""
        if confirmed is None:
            return cls(offset=NOTHING_COMMITTED, generation=NOTHING_COMMITTED,
                       committed_at_ms=pending.committed_at_ms, pending=pending)
        return confirmed.model_copy(update={"pending": pending})

    @classmethod
    def confirming(cls, pending: PendingCommit) -> CommittedOffset:
        """The record once ``pending`` is confirmed."""
        return cls(offset=pending.offset, generation=pending.generation,
                   committed_at_ms=pending.committed_at_ms, member_id=pending.member_id)

    def confirmed(self) -> CommittedOffset | None:
        """What readers see: the record without its pending commit, or None when no
        commit was ever confirmed."""
        if self.offset == NOTHING_COMMITTED:
            return None
        return self if self.pending is None else self.model_copy(update={"pending": None})
