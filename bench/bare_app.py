"""The ceiling of the broker's HTTP layer: POST /produce without storage.

A bare FastAPI app served by uvicorn exactly as ``llog serve`` serves the broker (one
worker, same event loop and HTTP implementation, log level warning). Its one POST
/produce parses the body with the broker's own ``ProduceRequest`` model, decodes every
record to bytes, and answers a response of the broker's shape (``ProduceResults``,
``exclude_none``) with made-up offsets, without batching, Oxia or S3. No middleware
(body limit, Prometheus instrumentation) and no dependency injection: it is the floor of
the HTTP cost, so the broker's throughput divided by this one says how much of the
ceiling the storage path leaves.

    .venv/bin/python bench/bare_app.py --port 8099
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: import the project's models
    sys.path.insert(0, str(ROOT))

from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from app.routes.models import (  # noqa: E402
    ProduceRequest,
    ProduceResults,
    ProduceSuccess,
)
from app.storage.log_record import payload_size  # noqa: E402

WAL_URI = "s3://leaderless-log-wal/llog/wal-shared/00000000-0000-0000-0000-000000000000"


def create_app() -> FastAPI:
    app = FastAPI(title="llog bare produce baseline")
    end_offsets: dict[tuple[str, int], int] = {}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/produce", response_model=ProduceResults)
    async def produce(body: ProduceRequest) -> JSONResponse:
        results: list[ProduceSuccess] = []
        for entry in body.topic_partitions:
            values = entry.payloads()
            size = sum(map(payload_size, values))  # touch the decoded bytes like the broker
            key = (entry.topic, entry.partition or 0)
            start = end_offsets.get(key, 0) + 1
            end = start + len(values) - 1
            end_offsets[key] = end
            results.append(ProduceSuccess(
                topic=entry.topic, partition=key[1], ok=True,
                start_offset=start, end_offset=end, count=len(values),
                index_key=f"llog/{entry.topic}/partitions/{key[1]}/index/{end:020d}",
                wal_uri=WAL_URI if size >= 0 else "",
            ))
        response = ProduceResults(results=results, success_count=len(results), error_count=0)
        return JSONResponse(response.model_dump(exclude_none=True), status_code=200)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()

    import uvicorn

    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level,
                lifespan="on", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
