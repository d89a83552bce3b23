"""The export's Iceberg table on the driver: create or load it, read what it holds per
topic-partition, commit new data files (pyiceberg).

**Exactly once.** What the table holds of each topic-partition is recorded in the table
itself, as a table property per topic-partition (``llog.high-water:{topic}:{partition}``,
the last offset the table holds). Table properties, unlike snapshot summaries, survive
snapshot expiry and the snapshots other engines write (compaction, deletes). A run starts
each partition after its property and commits the new data files (an append snapshot,
``add_files``) *and* the new properties in one transaction: one new metadata file, swapped
in by the catalog only if the table's current snapshot is still the one the run read
(pyiceberg's ``assert-ref-snapshot-id`` requirement, the catalog's compare-and-swap of the
metadata location). So the table gains a range and its high-water offset together or
neither. A run that crashed before its commit left only data files no snapshot
references, which no reader sees; running it again exports the same offsets once.
Commits are never retried onto a newer table: if another writer committed first, this
one fails (exit 2) and a re-run starts from the new properties.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.storage.keys import TopicPartition

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

HIGH_WATER = "llog.high-water"
COMMIT_RETRIES = "commit.retry.num-retries"
DAY_FIELD = "append_day"


def high_water_key(tp: TopicPartition) -> str:
    """The table property holding the last offset the table holds of ``tp``."""
    return f"{HIGH_WATER}:{tp.topic}:{tp.partition}"


def table_schema() -> Any:
    """The table's Iceberg schema: the export's columns (all of them, as the Parquet and
    Delta exports have them) and ``append_time``, the append time as a timestamp for the
    day partition. Every field is optional, as the Parquet export's are."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    header = StructType(NestedField(12, "name", StringType(), required=False),
                        NestedField(13, "value", BinaryType(), required=False))
    return Schema(
        NestedField(1, "topic", StringType(), required=False),
        NestedField(2, "partition", IntegerType(), required=False),
        NestedField(3, "offset", LongType(), required=False),
        NestedField(4, "value", BinaryType(), required=False),
        NestedField(5, "value_utf8", StringType(), required=False),
        NestedField(6, "key", BinaryType(), required=False),
        NestedField(7, "headers", ListType(11, header, element_required=False),
                    required=False),
        NestedField(8, "timestamp_ms", LongType(), required=False),
        NestedField(9, "append_time_ms", LongType(), required=False),
        NestedField(10, "append_time", TimestamptzType(), required=False),
    )


def partition_spec() -> Any:
    """Identity on ``topic``, and the UTC day of ``append_time``."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, IdentityTransform

    return PartitionSpec(
        PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(),
                       name="topic"),
        PartitionField(source_id=10, field_id=1001, transform=DayTransform(),
                       name=DAY_FIELD))


def identifier(table: str) -> tuple[str, ...]:
    """``namespace.name`` (the namespace may have dots of its own)."""
    parts = tuple(table.split("."))
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"--table {table}: give the table as NAMESPACE.NAME")
    return parts


def open_table(catalog: Catalog, table: str) -> Table:
    """``table`` in ``catalog``, created (empty, with its namespace) if there is none;
    refused when it exists with other columns or partitioning (not an export's table)."""
    from pyiceberg.table.name_mapping import create_mapping_from_schema

    ident = identifier(table)
    catalog.create_namespace_if_not_exists(ident[:-1])
    schema = table_schema()
    loaded = catalog.create_table_if_not_exists(
        ident, schema, partition_spec=partition_spec(),
        # The data files carry no field ids: add_files resolves columns by this mapping.
        properties={"schema.name-mapping.default":
                    create_mapping_from_schema(schema).model_dump_json()})
    check_table(table, loaded)
    return loaded


def check_table(table: str, loaded: Table) -> None:
    from pyiceberg.transforms import DayTransform, IdentityTransform

    schema, expected = loaded.schema(), table_schema()
    if [(f.name, f.field_type) for f in schema.fields] != \
            [(f.name, f.field_type) for f in expected.fields]:
        raise ValueError(f"{table}: the table's columns are not the export's "
                         f"({', '.join(f.name for f in schema.fields)})")
    spec = [(schema.find_column_name(f.source_id), f.transform) for f in loaded.spec().fields]
    if spec != [("topic", IdentityTransform()), ("append_time", DayTransform())]:
        raise ValueError(f"{table} is partitioned by {loaded.spec()}, not by topic and "
                         "day(append_time): not a table this export writes")


def high_waters(table: Table, partitions: Iterable[TopicPartition]
                ) -> dict[TopicPartition, int]:
    """The last offset the table holds of each partition (0: none)."""
    props = table.properties
    return {tp: int(props.get(high_water_key(tp), 0)) for tp in partitions}


def _never_retry(table: Table) -> None:
    """Make pyiceberg give up at the first refused commit of ``table`` (this process's
    copy of its metadata only: nothing of it is committed).

    pyiceberg retries a refused append on the table's new snapshot
    (``commit.retry.num-retries``, 4 by default), keeping the transaction's other
    updates: our high-water offsets, planned from the snapshot we read, would then be
    committed over the ones another export committed meanwhile, and the offsets both
    exported would be in the table twice. Refused, the run fails and a re-run plans
    from the table as it is.
    """
    props = {**table.metadata.properties, COMMIT_RETRIES: "0"}
    table.metadata = table.metadata.model_copy(update={"properties": props})


def commit(table: Table, files: Sequence[str], new_high_waters: Mapping[TopicPartition, int],
           job: Mapping[str, str]) -> int:
    """Commit ``files`` (data file URIs) with the partitions' new high-water offsets,
    atomically; the new snapshot's id. The snapshot's summary carries ``job`` and the
    offsets it brought, for whoever reads the history."""
    offsets = {high_water_key(tp): str(offset) for tp, offset in sorted(new_high_waters.items())}
    _never_retry(table)
    with table.transaction() as tx:
        tx.set_properties(offsets)
        # File names are unique per task attempt, and the high-water offsets keep a
        # range from being planned twice: no need to scan every manifest for duplicates.
        tx.add_files(list(files), snapshot_properties={**job, **offsets},
                     check_duplicate_files=False)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id
