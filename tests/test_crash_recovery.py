"""Writers killed (SIGKILL) between protocol steps, and writers in separate processes.

After every crash a fresh writer and a reader must recover: nothing acknowledged is lost,
offsets stay contiguous from 1, and nothing blocks the next append.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from tests.helpers.stack import make_settings, open_engine

pytestmark = pytest.mark.slow  # chaos: writers killed between steps

WORKER = Path(__file__).parent / "helpers" / "append_worker.py"


def _worker_cmd(topic: str, *args: str) -> list[str]:
    return [sys.executable, str(WORKER), "--topic", topic, *args]


def _parse(stdout: str) -> tuple[list[tuple[int, str]], str | None]:
    acked: list[tuple[int, str]] = []
    crashed = None
    for line in stdout.splitlines():
        msg = json.loads(line)
        if "crashed_at" in msg:
            crashed = msg["crashed_at"]
        elif "start" in msg:
            acked.extend(zip(range(msg["start"], msg["end"] + 1), msg["records"], strict=True))
        elif "error" in msg:
            raise AssertionError(f"worker append failed: {msg}")
    return acked, crashed


def _run_worker(
    stack_env: dict[str, str], topic: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack_env, "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000"}
    return subprocess.run(_worker_cmd(topic, *args), env=env, capture_output=True, text=True,
                          timeout=120, check=False)


async def _read_all(stack: LocalStack, tp: TopicPartition) -> tuple[dict[int, bytes], int]:
    async with open_engine(make_settings(stack)) as e:
        result = await e.reader.read(tp, 1)
        return dict(result.records), result.high_watermark


@pytest.mark.parametrize(
    ("step", "nth", "batches"),
    [
        ("after_blob_put", 1, 2),     # the first blob written, nothing committed yet
        ("after_blob_put", 3, 4),     # a later blob written, earlier appends pending/indexed
        ("after_pending_cas", 1, 2),  # committed as pending, never materialised
        ("after_pending_cas", 3, 4),  # committed; the previous one indexed by the same CAS
    ],
)
async def test_writer_killed_between_steps_loses_nothing(
    stack: LocalStack, stack_env: dict[str, str], topic: str, step: str, nth: int, batches: int
) -> None:
    tp = TopicPartition(topic, 0)
    proc = _run_worker(stack_env, topic, "--batches", str(batches), "--records", "3",
                       "--tag", "crash", "--crash-at", step, "--crash-nth", str(nth))
    acked, crashed = _parse(proc.stdout)
    assert crashed == step, proc.stdout + proc.stderr
    assert proc.returncode == -9

    # A fresh writer appends after the crash; its offsets continue the log.
    async with open_engine(make_settings(stack)) as e:
        (result,) = await e.writer.append_shared([AppendGroup(tp, [b"after-crash"])])
        assert isinstance(result, AppendResult)
    records, hw = await _read_all(stack, tp)
    assert hw == result.end_offset
    assert sorted(records) == list(range(1, hw + 1))  # contiguous, no gap
    for offset, value in acked:
        assert records[offset] == value.encode()
    assert records[result.start_offset] == b"after-crash"
    # Whatever was committed but not acknowledged is whole batches of the worker's.
    unacked = {o for o in records if o not in dict(acked) and o != result.start_offset}
    assert len(unacked) % 3 == 0


@pytest.mark.parametrize("step", ["before_materialise", "after_materialise"])
async def test_repair_killed_around_its_one_request(
    stack: LocalStack, stack_env: dict[str, str], topic: str, step: str
) -> None:
    """Materialising is one Oxia request (index entry, then the CAS clearing pending):
    killed before it, nothing changed; killed after it, it is complete."""
    tp = TopicPartition(topic, 0)
    acked, _ = _parse(_run_worker(stack_env, topic, "--batches", "2").stdout)
    proc = _run_worker(stack_env, topic, "--repair", "--crash-at", step)
    assert _parse(proc.stdout)[1] == step
    async with open_engine(make_settings(stack)) as e:
        control = await e.reader.read_control(tp)
        assert control is not None
        assert (control.pending is not None) == (step == "before_materialise")
        assert await e.writer.materialise_pending(tp) is (step == "before_materialise")
        (result,) = await e.writer.append_shared([AppendGroup(tp, [b"next"])])
        assert isinstance(result, AppendResult) and result.start_offset == 7
    records, hw = await _read_all(stack, tp)
    assert hw == 7
    assert all(records[o] == v.encode() for o, v in acked)


async def test_writers_in_separate_processes_share_one_partition(
    stack: LocalStack, stack_env: dict[str, str], topic: str
) -> None:
    tp = TopicPartition(topic, 0)
    env = {**os.environ, **stack_env}
    writers, batches = 4, 10
    outputs: list[str] = [""] * writers

    async def run(w: int) -> None:
        cmd = _worker_cmd(topic, "--batches", str(batches), "--records", "2", "--tag", f"p{w}")
        async with await anyio.open_process(cmd, env=env) as proc:
            assert proc.stdout is not None
            chunks = [chunk async for chunk in proc.stdout]
            assert await proc.wait() == 0
        outputs[w] = b"".join(chunks).decode()

    with anyio.fail_after(180):
        async with anyio.create_task_group() as tg:
            for w in range(writers):
                tg.start_soon(run, w)
    acked = [pair for out in outputs for pair in _parse(out)[0]]
    total = writers * batches * 2
    assert sorted(o for o, _ in acked) == list(range(1, total + 1))
    records, hw = await _read_all(stack, tp)
    assert hw == total
    assert {o: v.encode() for o, v in acked} == records
