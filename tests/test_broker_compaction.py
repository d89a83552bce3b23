"""A broker with the compact role compacts what it serves, invisibly to consumers."""

from __future__ import annotations

import time

import anyio
import httpx

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import BrokerFactory, make_settings, open_engine


async def test_broker_compaction_role_compacts_and_reads_stay_identical(
    brokers: BrokerFactory, stack: LocalStack, topic: str
) -> None:
    b = brokers.start(roles="write,read,compact", compaction_min_entry_age_ms="0",
                      compaction_interval_s="0.2", compaction_discovery_interval_s="0.2",
                      batch_max_delay_ms="0")
    tp = TopicPartition(topic, 0)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        for i in range(6):  # six appends: six WAL entries to compact
            r = await http.post("/produce", json=produce_body(topic, f"r{i}a", f"r{i}b"))
            assert r.status_code == 200
        before = (await http.post("/consume", json=consume_body(topic, 1))).json()["results"][0]

        # No event tells us when a background pass has run: watch the index, bounded.
        async with open_engine(make_settings(stack)) as e:
            deadline = time.monotonic() + 60
            compacted = None
            while compacted is None and time.monotonic() < deadline:
                records = await e.oxia.range_scan(e.layout.index(tp, 0),
                                                  e.layout.index_scan_end(tp), tp.partition_key)
                entries = [IndexEntry.from_json(r.value) for r in records]
                compacted = next((x for x in entries if x.type == "COMPACTED"), None)
                if compacted is None:
                    await anyio.sleep(0.1)  # pacing of the poll, not synchronisation
            assert compacted is not None, "the broker never compacted the partition"

        after = (await http.post("/consume", json=consume_body(topic, 1))).json()["results"][0]
        assert after["records"] == before["records"]
        assert [rec["offset"] for rec in after["records"]] == list(range(1, 13))
        metrics = (await http.get("/metrics")).json()["metrics"]
        assert metrics["llog_compaction_successes_total"][""] >= 1
