"""Oxia puts started together share one request (group commit), on the real Oxia: the
partitions of one produce flush commit in one Write, and each keeps its own outcome."""

from __future__ import annotations

import uuid

import anyio

from app.errors import VersionMismatch
from app.localstack.stack import LocalStack
from app.storage.metrics import StoreMetrics
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from tests.helpers.stack import make_settings


def _writes(metrics: StoreMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "llog_oxia_requests_total", {"op": "write_batch", "outcome": "ok"})
    return value or 0.0


async def test_puts_started_together_share_one_request(stack: LocalStack) -> None:
    metrics = StoreMetrics()
    prefix = f"/group-commit/{uuid.uuid4().hex}"
    async with OxiaStore(make_settings(stack), metrics) as store:
        taken = f"{prefix}/taken"
        await store.put_group([PutSpec(taken, b"first", taken, EXPECT_NOT_EXISTS)])
        before = _writes(metrics)
        outcomes: dict[int, list[int | Exception]] = {}

        async def put(i: int) -> None:
            key = taken if i == 0 else f"{prefix}/{i}"
            outcomes[i] = await store.put_group([PutSpec(key, b"v", key, EXPECT_NOT_EXISTS)])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(put, i)
        assert _writes(metrics) - before == 1, "the four puts took several requests"
        assert isinstance(outcomes[0][0], VersionMismatch)  # its own outcome, not shared
        assert all(isinstance(outcomes[i][0], int) for i in (1, 2, 3))
