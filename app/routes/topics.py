"""Topics: create, list, describe, update (retention, partitions), delete."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from app.auth.rights import Right
from app.broker.assembly import Broker
from app.broker.topic_view import default_topic_config
from app.errors import InvalidRequest, PartitionsOnlyGrow
from app.routes.access import authorize, authorize_describe, require, sees_topic
from app.routes.deps import running_broker
from app.routes.models import (
    PartitionInfo,
    PathTopic,
    TopicCreateRequest,
    TopicDeletion,
    TopicDescription,
    TopicInfo,
    TopicList,
    TopicUpdateRequest,
)
from app.routes.openapi import error, errors, store_errors
from app.storage.topic_catalog import DESCRIBE_PAGE_MAX, Topic, TopicConfig

router = APIRouter(tags=["topics"])
# Every topic operation reads the catalog in Oxia, and needs the read role.
_STORE = store_errors()
_NAMED = {**errors(400), **error(404, "UnknownTopic", description="no such topic"), **_STORE}
# Changing or deleting a topic needs the admin right on it (checked before the handler).
_ADMIN = [Depends(require(Right.ADMIN, param="topic"))]


def _info(topic: Topic, *, deleted: bool = False) -> TopicInfo:
    c, d = topic.config, topic.deleting
    return TopicInfo(topic=topic.name, partitions=topic.partitions,
                     retention_ms=c.retention_ms, retention_bytes=c.retention_bytes,
                     max_record_bytes=c.max_record_bytes,
                     compression="zstd" if c.compression == "zstd" else "none",
                     compression_level=c.compression_level,
                     created_at_ms=topic.created_at_ms,
                     status="deleted" if deleted else "active" if d is None else "deleting",
                     deletion=None if d is None or deleted else TopicDeletion(
                         started_at_ms=d.started_ms, partitions_emptied=d.emptied))


@router.post("/topics", status_code=201, response_model=TopicInfo, summary="Create a topic",
             responses={201: {"description": "the topic, created"}, **errors(400),
                        **error(409, "TopicExists", description="a topic of that name exists"),
                        **errors(413), **_STORE})
async def create_topic(body: TopicCreateRequest, request: Request,
                       broker: Annotated[Broker, Depends(running_broker)]) -> JSONResponse:
    authorize(request, Right.ADMIN, [body.topic])
    _check_partitions(body.partitions, broker)
    catalog = broker.admin.catalog  # RoleDisabled without the read role, before all else
    stored = (default_topic_config(broker.settings.topic_default_compression)
              if body.compression is None else
              TopicConfig(compression=body.compression, compression_level=body.compression_level))
    topic = await catalog.create(body.topic, body.partitions, TopicConfig(
        body.retention_ms, body.retention_bytes, body.max_record_bytes,
        stored.compression, stored.compression_level))
    await broker.forget_topic(topic.name)
    return JSONResponse(_info(topic).model_dump(), status_code=201)


@router.get("/topics", response_model=TopicList,
            summary="List the topics (with auth on: those the caller holds a right on)",
            responses={200: {"description": "every topic (with auth on: those the caller "
                                            "holds a right on)"}, **_STORE})
async def list_topics(request: Request, broker: Annotated[Broker, Depends(running_broker)]
                      ) -> TopicList:
    return TopicList(topics=[_info(t) for t in await broker.admin.catalog.list()
                             if sees_topic(request, t.name)])


@router.get("/topics/{topic}", response_model=TopicDescription,
            responses={200: {"description": "the topic and its partitions"}, **_NAMED},
            summary="A topic and its partitions' log start, end and size, a page at a time")
async def describe_topic(
    topic: PathTopic, request: Request,
    broker: Annotated[Broker, Depends(running_broker)],
    from_partition: Annotated[int, Query(ge=0, le=100_000, description=(
        "the first partition of the page"))] = 0,
    max_partitions: Annotated[int, Query(ge=1, le=DESCRIBE_PAGE_MAX, description=(
        "partitions per page"))] = DESCRIBE_PAGE_MAX,
) -> TopicDescription:
    authorize_describe(request, topic)
    found, partitions = await broker.admin.describe(topic, from_partition, max_partitions)
    end = from_partition + max_partitions
    more = found.deleting is None and end < found.partitions
    return TopicDescription(**_info(found).model_dump(), partition_states=[
        PartitionInfo(partition=p.partition, log_start_offset=p.log_start,
                      high_watermark=p.high_watermark, retained_bytes=p.retained_bytes,
                      last_append_ms=p.last_append_ms) for p in partitions],
        next_partition=end if more else None)


@router.patch("/topics/{topic}", response_model=TopicInfo,
              responses={200: {"description": "the topic, changed"}, **_NAMED,
                         **error(409, "PartitionsOnlyGrow", description=(
                             "the topic has more partitions than asked for")),
                         **errors(413)},
              dependencies=_ADMIN,
              summary="Change retention, limits or compression, or add partitions")
async def update_topic(topic: PathTopic, body: TopicUpdateRequest,
                       broker: Annotated[Broker, Depends(running_broker)]) -> TopicInfo:
    _check_partitions(body.partitions, broker)
    changes = {k: getattr(body, k) for k in body.model_fields_set if k != "partitions"}
    if "compression" in changes:
        changes["compression_level"] = body.compression_level  # the two go together
    try:
        updated = await broker.admin.catalog.update(
            topic, partitions=body.partitions, config=changes)
    except InvalidRequest as exc:
        # The body's model checked its shape and bounds: what the catalog refuses
        # still is a count below the topic's own, a conflict with the topic as it
        # stands (which the request alone cannot show), not a malformed request.
        raise PartitionsOnlyGrow(str(exc)) from None
    await broker.forget_topic(topic)
    return _info(updated)


@router.delete("/topics/{topic}", response_model=TopicInfo,
               responses={200: {"description": "deleted: the topic as it was"},
                          202: {"model": TopicInfo, "description": (
                              "being deleted, in the background (status deleting): "
                              "GET /topics/{topic} answers 404 once it is done")},
                          **_NAMED},
               dependencies=_ADMIN,
               summary="Delete a topic: its records are removed, its offsets never reused")
async def delete_topic(topic: PathTopic, broker: Annotated[Broker, Depends(running_broker)]
                       ) -> JSONResponse:
    # Marked first (no broker produces to it or reads it from then on), emptied in the
    # background; the answer waits a bounded time for that to finish.
    marked, run = await broker.deleter.start(topic)
    await broker.forget_topic(topic)
    if run is not None:
        with anyio.move_on_after(broker.settings.topic_delete_wait_ms / 1000):
            await run.done.wait()
    if run is not None and run.deleted:
        return JSONResponse(_info(marked, deleted=True).model_dump(), status_code=200)
    return JSONResponse(_info(marked).model_dump(), status_code=202)


def _check_partitions(partitions: int | None, broker: Broker) -> None:
    """Within LLOG_MAX_TOPIC_PARTITIONS (400 otherwise; the document states it)."""
    limit = broker.settings.max_topic_partitions
    if partitions is not None and partitions > limit:
        raise InvalidRequest(f"partitions {partitions} exceeds LLOG_MAX_TOPIC_PARTITIONS "
                             f"({limit})")

