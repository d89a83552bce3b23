"""The physical limit of the HTTP layer in Python on this machine: the ceiling that
bench/perf.py measures the broker against.

FastAPI under uvicorn, one worker, served exactly as ``llog serve`` serves the broker
(uvloop, httptools), with no middleware, no pydantic model and no storage:

- ``POST /produce`` reads the body, parses it (orjson for JSON; the LLP1 envelope with
  its column tables for binary), walks every record counting its bytes, and answers a
  small JSON body with made-up offsets;
- ``POST /consume`` answers ``max_bytes`` of records held in memory, in the format the
  request's ``Accept`` asks for (JSON with text values, or LLR1 with a bytes-batch-v3
  body), as a broker would for a consumer catching up.

    .venv/bin/python bench/ceiling_app.py --port 8099 --record-bytes 1024
"""

from __future__ import annotations

import argparse
import struct
import sys
from functools import cache
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from app.storage import columnar  # noqa: E402
from app.wire import produce as llp1  # noqa: E402
from app.wire import records as llr1  # noqa: E402

_ENTRY = struct.Struct(">H")
_RESULT = struct.Struct(">qqqqBI")


def _walk_json(body: bytes) -> list[tuple[str, int, int, int]]:
    """(topic, partition, records, bytes) of each entry: every record touched."""
    out = []
    for entry in orjson.loads(body)["topic_partitions"]:
        size = 0
        for record in entry["records"]:
            size += len(record.encode()) if isinstance(record, str) else len(record)
        out.append((entry["topic"], entry.get("partition") or 0, len(entry["records"]), size))
    return out


def _walk_binary(body: bytes) -> list[tuple[str, int, int, int]]:
    return [(e.topic, e.partition or 0, e.records.n_records, e.records.size)
            for e in llp1.parse(body, max_entries=100_000)]


@cache
def _records(count: int, record_bytes: int) -> tuple[bytes, bytes]:
    """The same records as a JSON array body and as a bytes-batch-v3 body."""
    values = [(b"%019d" % i + b"x" * record_bytes)[:record_bytes] for i in range(count)]
    as_json = orjson.dumps([{"offset": i, "value": v.decode()} for i, v in enumerate(values)])
    return as_json, columnar.encode(values)


def create_app(record_bytes: int) -> FastAPI:
    app = FastAPI(title="llog HTTP ceiling")
    end_offsets: dict[tuple[str, int], int] = {}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/produce")
    async def produce(request: Request) -> Response:
        body = await request.body()
        binary = request.headers.get("content-type", "").startswith(llp1.CONTENT_TYPE)
        results = []
        for topic, partition, count, size in (_walk_binary(body) if binary
                                              else _walk_json(body)):
            start = end_offsets.get((topic, partition), 0) + 1
            end_offsets[(topic, partition)] = start + count - 1
            results.append({"topic": topic, "partition": partition, "ok": True,
                            "start_offset": start, "end_offset": start + count - 1,
                            "count": count, "bytes": size})
        return Response(orjson.dumps({"results": results, "success_count": len(results),
                                      "error_count": 0}), media_type="application/json")

    @app.post("/consume")
    async def consume(request: Request) -> Response:
        ask = orjson.loads(await request.body())
        entry = ask["topic_partitions"][0]
        offset = int(entry["fetch_offset"])
        count = max(1, int(ask.get("max_bytes", 4 << 20)) // record_bytes)
        as_json, as_v3 = _records(count, record_bytes)
        topic = entry["topic"].encode()
        if llr1.wants_binary(request.headers.get("accept", "")):
            head = b"".join([b"LLR1", struct.pack(">I", 1), _ENTRY.pack(len(topic)), topic,
                             struct.pack(">IB", int(entry["partition"]), 1),
                             _RESULT.pack(2**62, 1, offset + count, offset, 3, len(as_v3))])
            return Response(head + as_v3, media_type=llr1.CONTENT_TYPE)
        head = orjson.dumps({"topic": entry["topic"], "partition": entry["partition"],
                             "ok": True, "high_watermark": 2**62, "log_start_offset": 1,
                             "next_offset": offset + count})[:-1]
        return Response(b'{"results":[' + head + b',"records":' + as_json + b"}]}",
                        media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--record-bytes", type=int, default=1024,
                        help="size of the records /consume answers with")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()

    import uvicorn

    uvicorn.run(create_app(args.record_bytes), host=args.host, port=args.port,
                log_level=args.log_level, lifespan="on", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
