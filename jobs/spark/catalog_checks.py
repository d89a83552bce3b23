"""The audit's check of the topic catalog against storage.

Every partition with data (``meta/control`` or index keys) must belong to a catalog
topic whose partition count is above its number: writers register a partition before
their first commit to it (``LogWriter.ensure_partition``), and compaction, retention and
consumers find partitions through the catalog. Catalog topics whose partitions hold no
data are fine.

The driver reads the catalog once before the partition scan; a task that finds a
partition the driver's read does not cover reads that topic's record again after the
partition's snapshot, so a topic created or grown during the audit is not reported,
and neither is one deleted during it (the first read still had it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.errors import CorruptData
from app.settings import Settings
from app.storage.keys import KeyLayout
from app.storage.topic_catalog import PARTITION_KEY, Topic
from app.stores.oxia.store import OxiaStore
from jobs.spark.findings import CORRUPTION, INFO, Finding
from jobs.spark.job_settings import settings_payload
from jobs.spark.snapshot import PartitionSnapshot
from jobs.spark.stores import open_stores
from jobs.spark.tasks import run_async, task_identity


@dataclass
class CatalogView:
    """Partition counts by topic, and the findings about records that do not parse."""

    partitions: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[Any, ...]] = field(default_factory=list)  # rows of FINDING_COLUMNS


def _parse(layout: KeyLayout, key: str, value: bytes, version: int) -> Topic:
    name = key.removeprefix(layout.topic_record(""))
    topic = Topic.from_json(value, version)
    if topic.name != name:
        raise CorruptData(f"the record of topic {name!r} names topic {topic.name!r}")
    return topic


async def read_catalog(oxia: OxiaStore, layout: KeyLayout) -> CatalogView:
    """Every catalog record: its partition count, or a ``bad_topic_record`` finding."""
    prefix = layout.topic_record("")
    view = CatalogView()
    for record in await oxia.range_scan(prefix, prefix + "~", PARTITION_KEY):
        if not record.key.startswith(prefix):
            continue  # Oxia orders keys by segments: the range may hold others
        try:
            topic = _parse(layout, record.key, record.value, record.version_id)
        except CorruptData as exc:
            view.bad.append(Finding("bad_topic_record", CORRUPTION, str(exc),
                                    index_key=record.key).row_at(
                record.key.removeprefix(prefix), None))
            continue
        view.partitions[topic.name] = topic.partitions
    return view


def read_catalog_on_driver(settings: Settings, job: str) -> CatalogView:
    payload = settings_payload(settings)

    async def run() -> CatalogView:
        async with open_stores(payload, task_identity(job)) as stores:
            return await read_catalog(stores.oxia, stores.layout)

    return run_async(run)


async def topic_partitions(oxia: OxiaStore, layout: KeyLayout, topic: str) -> int:
    """The topic's partition count now (0: no record, or one that does not parse)."""
    found = await oxia.get(layout.topic_record(topic), PARTITION_KEY)
    if found is None:
        return 0
    try:
        return _parse(layout, found.key, found.value, found.version_id).partitions
    except CorruptData:
        return 0  # reported once, by the driver's read


def has_data(snap: PartitionSnapshot) -> bool:
    return snap.control_present or bool(snap.index)


def retains_data(snap: PartitionSnapshot) -> bool:
    """Whether offsets are still readable, or index entries exist without a control
    record; a deleted topic's partitions keep an empty log (log start past the high
    watermark) and their control record."""
    if snap.control is None:
        return bool(snap.index)
    return snap.control.log_start <= snap.high_watermark


def catalog_finding(snap: PartitionSnapshot, partitions: int) -> Finding | None:
    """The finding for a partition with data that ``partitions`` (its topic's count in
    the catalog, 0 for none) does not cover; None when it is covered or holds nothing."""
    tp = snap.tp
    if not has_data(snap) or tp.partition < partitions:
        return None
    where = (f"the catalog has no topic {tp.topic!r}" if partitions == 0 else
             f"topic {tp.topic!r} has {partitions} partitions in the catalog")
    if retains_data(snap):
        start = snap.control.log_start if snap.control is not None else None
        return Finding("uncatalogued_partition", CORRUPTION,
                       f"the partition holds data but {where}", start,
                       snap.high_watermark if snap.control is not None else None)
    return Finding("uncatalogued_empty_partition", INFO,
                   f"the partition holds no readable data (a deleted topic's, or never "
                   f"written) and {where}")
