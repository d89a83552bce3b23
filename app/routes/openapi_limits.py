"""This broker's configured limits, stated in its OpenAPI document.

The models bound what never changes (a partition number, a topic name's length); the
limits an operator sets (``LLOG_GROUP_LIST_MAX``, ``LLOG_MAX_WAIT_MS_CEILING``, ...) are
checked by the routes, and written here into the document each broker serves, as
``maximum``/``minimum``/``maxItems`` beside the field they bound. A request the document
admits is then one the broker takes, and one past a limit is one the document refuses
(docs/http-api.md, Limits, lists the same).
"""

from __future__ import annotations

from typing import Any

from app.settings import Settings


def declare_limits(schema: dict[str, Any], settings: Settings) -> None:
    """Write ``settings``' limits into the built document (in place)."""
    s = settings
    schemas = schema.get("components", {}).get("schemas", {})
    _bound(schemas, "ConsumeRequest", "max_wait_ms", maximum=s.max_wait_ms_ceiling)
    _bound(schemas, "ConsumeRequest", "max_bytes", maximum=s.max_fetch_bytes)
    _bound(schemas, "ConsumeTopicPartition", "partition_max_bytes",
           maximum=s.max_fetch_bytes)
    _bound(schemas, "JoinRequest", "session_timeout_ms",
           minimum=s.group_min_session_timeout_ms, maximum=s.group_max_session_timeout_ms)
    for model in ("TopicCreateRequest", "TopicUpdateRequest"):
        _bound(schemas, model, "partitions", maximum=s.max_topic_partitions)
    if s.auto_create_topics:  # a produce may grow a topic, to at most this many
        _bound(schemas, "ProduceTopicPartition", "partition",
               maximum=s.max_topic_partitions - 1)
    # Lists of partitions (each entry names one; 413 past the limit).
    for model, field in (("OffsetsRequest", "topic_partitions"),
                         ("CommitRequest", "offsets"),
                         ("ProduceRequest", "topic_partitions"),
                         ("ConsumeRequest", "topic_partitions")):
        _bound(schemas, model, field, maxItems=s.max_partitions_per_request)
    for path, name, maximum in (("/groups", "limit", s.group_list_max),
                                ("/topics/{topic}/stream", "max_bytes", s.max_fetch_bytes)):
        parameter = _parameter(schema, path, "get", name)
        if parameter is not None:
            parameter["schema"]["maximum"] = maximum


def _bound(schemas: dict[str, Any], model: str, field: str, **keywords: int) -> None:
    """Add ``keywords`` to ``model.field``'s schema: to the branch of its type, when it
    is optional (``anyOf`` with ``null``)."""
    prop = schemas.get(model, {}).get("properties", {}).get(field)
    if prop is None:
        raise KeyError(f"{model}.{field} is not in the document")
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    for branch in branches:
        branch.update(keywords)


def _parameter(schema: dict[str, Any], path: str, method: str, name: str
               ) -> dict[str, Any] | None:
    for parameter in schema.get("paths", {}).get(path, {}).get(method, {}).get(
            "parameters", []):
        if parameter.get("name") == name:
            found: dict[str, Any] = parameter
            return found
    return None
