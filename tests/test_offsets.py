"""Where a log starts and ends, and the first offset at a time: before and after
compaction, on the real Oxia and MinIO."""

from __future__ import annotations

import httpx
import pytest

from app.errors import Unavailable
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_positions import list_offsets
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.clock import FakeClock
from tests.helpers.compaction import compaction_settings, make_compactor
from tests.helpers.stack import Broker, Engine, open_engine

BASE = 1_700_000_000_000  # in the past: old enough for compaction at once


def _gets(e: Engine) -> float:
    return sum(s.value for m in e.metrics.s3_requests.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels.get("op", "").startswith("get"))


async def test_offsets_for_times_before_and_after_compaction(stack: LocalStack,
                                                             tp: TopicPartition) -> None:
    clock = FakeClock(BASE)
    async with open_engine(compaction_settings(stack, compaction_chunk_bytes=4096),
                           clock=clock) as e:
        empty = await list_offsets(e.reader, tp, BASE)
        assert (empty.log_start, empty.high_watermark, empty.for_time) == (1, 0, 1)
        # 20 appends of 50 records, one second apart: records 1-50 at BASE, 51-100 at +1 s...
        for i in range(20):
            (r,) = await e.writer.append_shared([AppendGroup(tp, [b"x" * 100] * 50)])
            assert isinstance(r, AppendResult) and r.append_time_ms == BASE + 1000 * i
            clock.advance(1000)
        expected = {BASE - 1: 1, BASE: 1, BASE + 1: 51, BASE + 5000: 251,
                    BASE + 5500: 301, BASE + 19_000: 951, BASE + 19_001: 1001}

        async def answers() -> dict[int, int | None]:
            return {at: (await list_offsets(e.reader, tp, at)).for_time for at in expected}

        assert await answers() == expected
        outcome = await make_compactor(e, chunk_bytes=4096).compact_once(tp)
        assert (outcome.start_offset, outcome.end_offset) == (1, 1000)
        assert await answers() == expected  # inside one compacted entry, by its chunks
        # A lookup that reads a chunk asks for room for its bytes first (the broker's
        # answer budget); refused, it reads nothing and fails as the budget said.
        asked: list[int] = []

        async def reserve(n: int) -> None:
            asked.append(n)

        async def refuse(n: int) -> None:
            raise Unavailable("no room in the answer budget")

        inside = await list_offsets(e.reader, tp, BASE + 5500, reserve=reserve)
        assert inside.for_time == 301
        assert len(asked) == 1 and 0 < asked[0] <= 4 * 4096, asked  # one chunk's bytes
        gets = _gets(e)
        with pytest.raises(Unavailable):
            await list_offsets(e.reader, tp, BASE + 7500, reserve=refuse)
        assert _gets(e) == gets
        found = await list_offsets(e.reader, tp)
        assert (found.log_start, found.high_watermark, found.for_time) == (1, 1000, None)


async def test_offsets_endpoint_and_named_positions(broker: Broker, topic: str) -> None:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        r = await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        appended = r.json()["results"][0]["start_offset"]
        assert appended == 1
        r = await http.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0},
            {"topic": topic, "partition": 0, "timestamp_ms": 0},
            {"topic": topic, "partition": 0, "timestamp_ms": 2**53 - 1},
            {"topic": topic, "partition": 7}]})
        assert r.status_code == 200, r.text
        first, by_old_time, by_future, empty = r.json()["results"]
        assert first == {"topic": topic, "partition": 0, "ok": True, "outcome": "success",
                         "log_start_offset": 1, "high_watermark": 3}
        assert by_old_time["offset"] == 1 and by_future["offset"] == 4
        assert (empty["log_start_offset"], empty["high_watermark"]) == (1, 0)
        for position, wanted in (("earliest", [1, 2, 3]), ("latest", [])):
            body = consume_body(topic, max_wait_ms=0)
            body["topic_partitions"][0]["fetch_offset"] = position
            r = await http.post("/consume", json=body)
            res = r.json()["results"][0]
            assert [x["offset"] for x in res["records"]] == wanted, position
            assert res["next_offset"] == 4
        r = await http.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "timestamp_ms": -1}]})
        assert r.status_code == 400
