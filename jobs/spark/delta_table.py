"""The export's Delta table on the driver: create or open it, read what it holds per
topic-partition, commit new data files (delta-rs, the ``deltalake`` package).

**Exactly once.** What the table holds of each topic-partition is recorded in the table
itself, as a Delta *application transaction* (``txn`` action) per topic-partition:
``appId`` ``llog:{topic}:{partition}``, ``version`` the last offset the table holds. A
run starts each partition after its version and commits the new data files *and* the new
versions in one Delta commit (one conditional PUT of the next log entry), so the table
either gains a range and its high-water offset together or neither. A run that
crashed before its commit left only unreferenced files; running it again exports the
same offsets once. Commits are never retried onto a newer table version: if another
export committed first, this one fails (exit 2) and a re-run starts from the new
versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from jobs.spark.delta_files import data_schema
from jobs.spark.delta_location import TableLocation

if TYPE_CHECKING:
    from deltalake import DeltaTable

PARTITION_BY = ["topic", "append_date"]


def app_id(tp: TopicPartition) -> str:
    """The table's transaction id of a topic-partition."""
    return f"llog:{tp.topic}:{tp.partition}"


def table_schema() -> Any:
    """The table's Arrow schema: a data file's columns plus the partition columns."""
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]

    schema = data_schema().insert(0, pa.field("topic", pa.string()))
    return schema.append(pa.field("append_date", pa.date32()))


def open_table(location: TableLocation) -> DeltaTable:
    """The table at ``location``, created (empty) if there is none; refused when it
    exists with other partition columns (not an export's table)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(location.uri, location.storage_options):
        # mode="ignore": a concurrent creation is fine, the table's first commit is a
        # conditional PUT too.
        DeltaTable.create(location.uri, table_schema(), mode="ignore",
                          partition_by=PARTITION_BY, name="llog export",
                          storage_options=location.storage_options)
    table = DeltaTable(location.uri, storage_options=location.storage_options)
    check_table(location.uri, table)
    return table


def check_table(uri: str, table: DeltaTable) -> None:
    """Refuse a table this export does not write: other partition columns or columns,
    or transaction ids that expire (the high-water offsets must never be forgotten)."""
    metadata = table.metadata()
    if list(metadata.partition_columns) != PARTITION_BY:
        raise ValueError(f"{uri} is a Delta table partitioned by "
                         f"{metadata.partition_columns}, not by {PARTITION_BY}: "
                         "not a table this export writes")
    from deltalake import Schema

    if table.schema() != Schema.from_arrow(table_schema()):
        raise ValueError(f"{uri}: the table's columns are not the export's "
                         f"({', '.join(f.name for f in table.schema().fields)})")
    if metadata.configuration.get("delta.setTransactionRetentionDuration"):
        raise ValueError(f"{uri} sets delta.setTransactionRetentionDuration: its per-"
                         "partition high-water offsets could expire and records be "
                         "exported twice; unset it")


def high_waters(table: DeltaTable, partitions: Iterable[TopicPartition]
                ) -> dict[TopicPartition, int]:
    """The last offset the table holds of each partition (0: none)."""
    return {tp: table.transaction_version(app_id(tp)) or 0 for tp in partitions}


def _add_action(row: Mapping[str, Any], modified_ms: int) -> Any:
    from deltalake.transaction import AddAction

    return AddAction(path=row["file"], size=int(row["size"]),
                     partition_values={"topic": row["topic"],
                                       "append_date": row["append_date"]},
                     modification_time=modified_ms, data_change=True, stats=row["stats"])


def commit(table: DeltaTable, files: Sequence[Mapping[str, Any]],
           new_high_waters: Mapping[TopicPartition, int], job: Mapping[str, str]) -> int:
    """Commit ``files`` (rows of the data-file table) with the partitions' new high-water
    offsets, atomically; the table's new version."""
    from deltalake import CommitProperties, Transaction

    at = now_ms()
    table.create_write_transaction(
        [_add_action(row, at) for row in files], mode="append", schema=table_schema(),
        partition_by=PARTITION_BY,
        commit_properties=CommitProperties(
            custom_metadata=dict(job), max_commit_retries=0,
            app_transactions=[Transaction(app_id(tp), offset, at)
                              for tp, offset in sorted(new_high_waters.items())]))
    table.update_incremental()
    return table.version()
