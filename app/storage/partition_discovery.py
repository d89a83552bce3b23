"""Which topic-partitions exist: discovered from their ``meta/control`` keys.

Oxia sorts keys hierarchically (segment by segment, fewer segments first), so no single
key range holds "everything under the root". Every per-partition key has the same depth,
``{root}/{topic}/partitions/{p}/{a}/{b}``, so one range over exactly that depth covers
all of them; the control keys are picked out of it. The cost is a listing of every
per-partition key (index entries included), which compaction keeps small.
"""

from __future__ import annotations

from app.storage.keys import KeyLayout, TopicPartition
from app.stores.oxia.store import OxiaStore

_PARTITION_KEY_DEPTH = 5  # topic / "partitions" / p / a / b below the root


async def discover_partitions(oxia: OxiaStore, layout: KeyLayout, *,
                              any_key: bool = False) -> list[TopicPartition]:
    """Partitions with a ``meta/control`` key; with ``any_key``, partitions with any
    ``meta/`` or ``index/`` key (a partition that lost its control record still holds
    references: garbage collection must see it)."""
    low = layout.root + "/"
    high = layout.root + "/~" * _PARTITION_KEY_DEPTH
    keys = await oxia.list_keys(low, high)
    parse = layout.parse_partition_key if any_key else layout.parse_control_key
    found = {tp for key in keys if (tp := parse(key)) is not None}
    return sorted(found)
