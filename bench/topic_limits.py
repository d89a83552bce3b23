"""What one topic request costs by the topic's partitions: the measurement behind the
default ``LLOG_MAX_TOPIC_PARTITIONS``.

For each size, on real Oxia and MinIO with a broker in this process (no HTTP server
between, so the figures are the broker's own work): ``POST /topics`` with N partitions,
one record produced to every partition (requests of ``LLOG_MAX_PARTITIONS_PER_REQUEST``
entries: the worst case for a delete, which then has a log to empty in each), ``GET
/topics/{topic}`` (its first page of partition states, and every page in turn), and
``DELETE /topics/{topic}``: how long its answer took (200 deleted, or 202 after
``LLOG_TOPIC_DELETE_WAIT_MS`` while the deletion goes on in the background) and when the
topic was gone (``GET`` answering 404). The baseline, in the same run, is the smallest
size; the bound every request must stay under is schemathesis' response-time check, 10 s,
on a machine that may be loaded.

    .venv/bin/python bench/topic_limits.py [--sizes 1000,10000,30000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import httpx

from app.factory import create_app
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings

BUDGET_S = 10.0  # schemathesis' default response-time check


@dataclass
class Row:
    partitions: int
    create_s: float
    produce_all_s: float
    describe_s: float  # the first page
    describe_all_s: float  # every page, one after the other
    delete_s: float  # the DELETE's answer
    delete_status: int
    gone_s: float  # from the DELETE until GET /topics/{topic} answered 404

    def worst(self) -> float:
        """The longest single request."""
        return max(self.create_s, self.describe_s, self.delete_s)


async def _timed(call: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await call  # type: ignore[misc]
    return response, time.monotonic() - started


async def measure(settings: Settings, sizes: list[int]) -> list[Row]:
    app = create_app(settings)
    rows = []
    per_request = settings.max_partitions_per_request
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench",
            timeout=600) as http:
        for n in sizes:
            topic = f"limits-{n}-{uuid.uuid4().hex[:6]}"
            r, create_s = await _timed(http.post("/topics", json={"topic": topic,
                                                                  "partitions": n}))
            assert r.status_code == 201, r.text
            started = time.monotonic()
            for first in range(0, n, per_request):
                r = await http.post("/produce", json={"topic_partitions": [
                    {"topic": topic, "partition": p, "records": ["x"]}
                    for p in range(first, min(n, first + per_request))]})
                assert r.status_code == 200, r.text
            produce_all_s = time.monotonic() - started
            r, describe_s = await _timed(http.get(f"/topics/{topic}"))
            assert r.status_code == 200, r.text
            describe_all_s = await _describe_all(http, topic)
            started = time.monotonic()
            r, delete_s = await _timed(http.delete(f"/topics/{topic}"))
            assert r.status_code in (200, 202), r.text
            # Polled as a client would: the API's way to see a deletion end.
            while (await http.get(f"/topics/{topic}")).status_code != 404:  # noqa: ASYNC110
                await anyio.sleep(0.2)
            row = Row(n, create_s, produce_all_s, describe_s, describe_all_s, delete_s,
                      r.status_code, time.monotonic() - started)
            print(f"{n:>7} partitions: create {create_s:6.2f} s, produce to all "
                  f"{produce_all_s:6.2f} s, describe {describe_s:6.2f} s (all pages "
                  f"{describe_all_s:6.2f} s), delete answered {r.status_code} in "
                  f"{delete_s:6.2f} s, gone after {row.gone_s:6.2f} s", flush=True)
            rows.append(row)
    return rows


async def _describe_all(http: httpx.AsyncClient, topic: str) -> float:
    started, first = time.monotonic(), 0
    while True:
        r = await http.get(f"/topics/{topic}", params={"from_partition": first})
        assert r.status_code == 200, r.text
        if r.json().get("next_partition") is None:
            return time.monotonic() - started
        first = r.json()["next_partition"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="llog-topic-limits-") as tmp, \
            LocalStack(StackConfig.ephemeral(Path(tmp))) as stack:
        env = stack.settings_env()
        settings = Settings(**{k[5:].lower(): v for k, v in env.items()},
                            broker_id="topic-limits", loop_stall_s=0,
                            max_topic_partitions=max(sizes))
        rows = anyio.run(measure, settings, sizes)
    base = rows[0]
    print(f"\nbaseline ({base.partitions} partitions): worst request "
          f"{base.worst():.2f} s; budget per request {BUDGET_S:.0f} s")
    for row in rows:
        per_1000 = row.gone_s / row.partitions * 1000
        print(f"{row.partitions:>7}: worst request {row.worst():6.2f} s "
              f"({row.worst() / BUDGET_S:5.1%} of the budget); delete {per_1000:.2f} s "
              "per 1,000 partitions")
    out = Path(".llog/bench/topic_limits.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
