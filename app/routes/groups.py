"""Consumer groups: join, heartbeat, leave, commit, list, describe, reset offsets."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from app.auth.rights import Right
from app.broker.assembly import Broker
from app.errors import (
    InvalidRequest,
    LlogError,
    PayloadTooLarge,
    UnknownGroup,
    UnknownTopic,
)
from app.groups.committed_offsets import ResetTarget
from app.groups.group_records import GroupMember
from app.groups.membership import GroupView
from app.groups.service import GroupService, PartitionLag
from app.routes.access import authorize, holds, require
from app.routes.deps import running_broker
from app.routes.group_models import (
    COMMITTED,
    STALE,
    AssignedTopic,
    CommitRequest,
    GroupDescription,
    GroupList,
    GroupName,
    GroupPartition,
    GroupSummary,
    JoinRequest,
    LeaveResponse,
    MemberAssignment,
    MemberInfo,
    MemberRequest,
    OffsetFailure,
    OffsetResults,
    OffsetSuccess,
    ResetEntry,
    ResetRequest,
)
from app.routes.models import ErrorResponse
from app.routes.openapi import (
    COMMIT_REFUSALS,
    Responses,
    error,
    error_example,
    errors,
    response,
    store_errors,
)
from app.storage.keys import TopicPartition

router = APIRouter(tags=["groups"])
PathGroup = Annotated[GroupName, Path(description="the consumer group's name")]
Running = Annotated[Broker, Depends(running_broker)]
DEFAULT_PAGE = 100
# Every route on one group needs the group right on it (403 before any storage work);
# those that name topics need the consume right on them too, as reading does.
GROUP_RIGHT = [Depends(require(Right.GROUP, param="group"))]


# Every group operation reads and writes the group in Oxia, and needs the read role.
_STORE = store_errors()
_UNKNOWN = error(404, "UnknownGroup", description="no such group")


def _partly(description: str, *error_type: str) -> Responses:
    """A 409 that refuses the whole request (error body) or reports partitions
    (results), with an example of each."""
    return response(409, description, OffsetResults | ErrorResponse, {
        "a partition failed": {"results": [COMMITTED, STALE]},
        **{name: error_example(name) for name in error_type}})

def _by_topic(tps: Iterable[TopicPartition]) -> list[AssignedTopic]:
    topics: dict[str, list[int]] = {}
    for tp in sorted(tps):
        topics.setdefault(tp.topic, []).append(tp.partition)
    return [AssignedTopic(topic=t, partitions=ps) for t, ps in topics.items()]


def _assignment(service: GroupService, view: GroupView, member: GroupMember) -> MemberAssignment:
    return MemberAssignment(
        group=view.record.group, member_id=member.member_id, generation=view.generation,
        assignment=_by_topic(service.membership.owned(view, member.member_id)),
        members=len(view.record.members), session_timeout_ms=member.session_timeout_ms,
        heartbeat_interval_ms=max(1, member.session_timeout_ms // 3))


@router.post("/groups/{group}/join", dependencies=GROUP_RIGHT, response_model=MemberAssignment,
             responses={200: {"description": "this member's id, generation and partitions"},
                        **errors(400), **error(409, "GroupFull", description="the group is full"),
                        **errors(413), **_STORE},
             summary="Join a group: a member id, the generation and this member's partitions")
async def join_group(group: PathGroup, body: JoinRequest, request: Request, broker: Running
                     ) -> MemberAssignment:
    authorize(request, Right.CONSUME, body.topics)
    service = broker.groups
    view, member = await service.membership.join(
        group, body.topics, client_id=body.client_id,
        session_timeout_ms=body.session_timeout_ms)
    return _assignment(service, view, member)


@router.post("/groups/{group}/heartbeat", dependencies=GROUP_RIGHT, response_model=MemberAssignment,
             responses={200: {"description": "the current generation and this member's "
                                             "partitions"},
                        **errors(400), **error(
                            409, "UnknownMember", description=(
                                "not a member (it left, or its session expired): join "
                                "again")), **errors(413), **_STORE},
             summary="Keep a member's session; the current generation and its partitions")
async def heartbeat(group: PathGroup, body: MemberRequest, broker: Running) -> MemberAssignment:
    service = broker.groups
    view, member = await service.membership.heartbeat(group, body.member_id)
    return _assignment(service, view, member)


@router.post("/groups/{group}/leave", dependencies=GROUP_RIGHT, response_model=LeaveResponse,
             responses={200: {"description": "whether the member was in the group"},
                        **errors(400), **_UNKNOWN, **errors(413), **_STORE},
             summary="Leave a group: its partitions move now")
async def leave_group(group: PathGroup, body: MemberRequest, broker: Running) -> LeaveResponse:
    view, left = await broker.groups.membership.leave(group, body.member_id)
    if view is None:
        raise UnknownGroup(f"group {group!r} does not exist")
    return LeaveResponse(group=group, member_id=body.member_id, left=left,
                         generation=view.generation)


def _results(entries: Sequence[tuple[TopicPartition, int | LlogError]]) -> JSONResponse:
    """200 when every partition succeeded, 409 otherwise (each result says how)."""
    results: list[OffsetSuccess | OffsetFailure] = [
        OffsetSuccess(topic=tp.topic, partition=tp.partition, ok=True, offset=o)
        if isinstance(o, int) else
        OffsetFailure(topic=tp.topic, partition=tp.partition, ok=False,
                      error_type=o.error_type, error=str(o), retriable=o.retriable)
        for tp, o in entries]
    status = 200 if all(r.ok for r in results) else 409
    return JSONResponse(OffsetResults(results=results).model_dump(exclude_none=True),
                        status_code=status)


@router.post("/groups/{group}/commit", dependencies=GROUP_RIGHT, response_model=OffsetResults,
             responses={200: {"description": "every partition's offset is committed"},
                        **errors(400), **_partly(
                            "refused as a whole, nothing written (error body), or a "
                            "partition failed (results)", *COMMIT_REFUSALS,
                            "OffsetBeyondHighWatermark"),
                        **errors(413), **_STORE},
             summary="Commit the last offset processed of partitions")
async def commit_offsets(group: PathGroup, body: CommitRequest, request: Request,
                         broker: Running) -> JSONResponse:
    authorize(request, Right.CONSUME, (e.topic for e in body.offsets))
    PayloadTooLarge.unless_within(len(body.offsets),
                                  broker.settings.max_partitions_per_request)
    offsets = [(TopicPartition(e.topic, e.partition), e.offset) for e in body.offsets]
    done = await broker.groups.offsets.commit(group, body.member_id,
                                                      body.generation, offsets)
    return _results([(tp, o) for (tp, _), o in zip(offsets, done, strict=True)])


@router.get("/groups", response_model=GroupList,
            responses={200: {"description": "a page of groups (with auth on: those the "
                                            "caller holds the group right on)"},
                       **errors(400), **_STORE},
            summary="List the groups, a page at a time")
async def list_groups(
    request: Request,
    broker: Running,
    after: Annotated[GroupName | None, Query(description="the last group of the page before")
                     ] = None,
    limit: Annotated[int, Query(ge=1, description="groups per page, at most "
                                "LLOG_GROUP_LIST_MAX")] = DEFAULT_PAGE,
) -> GroupList:
    if limit > broker.settings.group_list_max:
        raise InvalidRequest(f"limit {limit} exceeds LLOG_GROUP_LIST_MAX "
                             f"({broker.settings.group_list_max})")
    page, next_after = await broker.groups.page(after, limit)
    return GroupList(next_after=next_after, groups=[GroupSummary(
        group=r.group, generation=r.generation, members=len(r.members),
        topics=sorted({t for m in r.members for t in m.topics}),
        created_at_ms=r.created_at_ms, updated_at_ms=r.updated_at_ms)
        for r in page if holds(request, Right.GROUP, r.group)])


def _partition(p: PartitionLag) -> GroupPartition:
    c = p.committed
    return GroupPartition(
        topic=p.tp.topic, partition=p.tp.partition, owner=p.owner,
        committed_offset=c.offset if c else None,
        committed_generation=c.generation if c else None,
        committed_at_ms=c.committed_at_ms if c else None,
        log_start_offset=p.log_start, high_watermark=p.high_watermark, lag=p.lag)


@router.get("/groups/{group}", dependencies=GROUP_RIGHT, response_model=GroupDescription,
            responses={200: {"description": "the group settled now"}, **errors(400),
                       **_UNKNOWN, **_STORE},
            summary="A group: members, assignment, generation, committed offsets and lag")
async def describe_group(group: PathGroup, broker: Running) -> GroupDescription:
    found = await broker.groups.describe(group)
    record, leases = found.view.record, found.view.leases or {}
    return GroupDescription(
        group=record.group, generation=record.generation, created_at_ms=record.created_at_ms,
        updated_at_ms=record.updated_at_ms,
        members=[MemberInfo(
            member_id=m.member_id, client_id=m.client_id, topics=list(m.topics),
            session_timeout_ms=m.session_timeout_ms, joined_at_ms=m.joined_at_ms,
            expires_at_ms=lease.value.expires_at_ms if (lease := leases.get(m.member_id))
            else None, assignment=_by_topic(found.assignment.get(m.member_id, ())))
            for m in record.members],
        partitions=[_partition(p) for p in found.partitions])


async def _targets(broker: Broker, entries: list[ResetEntry]) -> list[ResetTarget]:
    """One target per partition; an entry without a partition names them all."""
    out: list[ResetTarget] = []
    for e in entries:
        if e.partition is not None:
            partitions = [e.partition]
        else:
            topic = await broker.topics.topic(e.topic)
            if topic is None:
                raise UnknownTopic(f"topic {e.topic!r} does not exist")
            partitions = list(range(topic.partitions))
        out.extend(ResetTarget(TopicPartition(e.topic, p), e.to, e.timestamp_ms, e.offset)
                   for p in partitions)
        # Checked as the topics expand: a reset of whole topics is bounded as it grows.
        PayloadTooLarge.unless_within(len(out), broker.settings.max_partitions_per_request)
    return out


@router.post("/groups/{group}/reset-offsets", dependencies=GROUP_RIGHT,
             response_model=OffsetResults,
             responses={200: {"description": "every partition's offset is set"},
                        **errors(400),
                        **error(404, "UnknownTopic", description=(
                            "an entry without a partition names an unknown topic")),
                        **_partly("the group has live members or an offset is beyond "
                                  "the high watermark, nothing written (error body), or a "
                                  "member joined while it was reset (results)",
                                  "GroupNotEmpty", "OffsetBeyondHighWatermark"),
                        **errors(413), **_STORE},
             summary="Set a group's committed offsets (no member may be live)")
async def reset_offsets(group: PathGroup, body: ResetRequest, request: Request, broker: Running
                        ) -> JSONResponse:
    authorize(request, Right.CONSUME, (e.topic for e in body.topic_partitions))
    offsets = broker.groups.offsets  # RoleDisabled without the read role, before all else
    targets = await _targets(broker, body.topic_partitions)
    done = await offsets.reset(group, targets)
    return _results([(t.tp, o) for t, o in zip(targets, done, strict=True)])
