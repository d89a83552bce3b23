"""A consumer-group member process for the group tests.

Joins ``--group`` on ``--topic`` through ``--brokers`` (comma separated, the first used
first), and for every record it polls appends ``partition offset value`` to ``--out``,
flushed before the next poll (which commits them: at-least-once). Prints one JSON line
when it has joined. SIGTERM ends it cleanly: it commits what it processed and leaves the
group. SIGKILL is a crash: it simply stops heartbeating.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType

from llog_client import LlogClient, RetryPolicy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--session-ms", type=int, default=2000)
    parser.add_argument("--max-wait-ms", type=int, default=300)
    args = parser.parse_args()
    stopping = {"now": False}

    def stop(_: int, __: FrameType | None) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, stop)
    retry = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.5)
    with LlogClient(args.brokers, retry=retry, timeout_s=30) as llog, \
            open(args.out, "a", encoding="utf-8") as out, \
            llog.group_consumer(args.group, [args.topic], client_id=args.out,
                                session_timeout_ms=args.session_ms,
                                max_wait_ms=args.max_wait_ms) as consumer:
        assert consumer.membership is not None
        print(json.dumps({"member_id": consumer.membership.member_id}), flush=True)
        while not stopping["now"]:
            for record in consumer.poll():
                out.write(f"{record.partition} {record.offset} {record.text()}\n")
            out.flush()
    print(json.dumps({"stopped": True}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
