"""Read acknowledged records back and compare them with what the hammer acknowledged.

With ``hammer.record_acks`` the hammer writes one line per acknowledged record to
``acked.tsv``: topic, partition, offset, FNV-1a 64 of the value (hex) and the broker that
acknowledged it. This module consumes every such partition from its first offset through
one broker's ``POST /consume`` and checks that each acknowledged offset is there with the
same value: an acknowledged record that is missing or different is a lost record.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def read_acked(path: Path) -> dict[tuple[str, int], dict[int, tuple[str, str]]]:
    """(topic, partition) -> offset -> (value hash, broker)."""
    acked: dict[tuple[str, int], dict[int, tuple[str, str]]] = defaultdict(dict)
    with path.open() as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                continue
            topic, partition, offset, digest, broker = parts
            acked[(topic, int(partition))][int(offset)] = (digest, broker)
    return dict(acked)


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def read_partition(broker_url: str, topic: str, partition: int, until: int,
                   max_bytes: int = 4 * 1024 * 1024) -> dict[int, int]:
    """offset -> value hash for offsets 1..until (fewer if the log is shorter)."""
    out: dict[int, int] = {}
    offset = 1
    while offset <= until:
        doc = _post(f"{broker_url}/consume", {
            "topic_partitions": [{"topic": topic, "partition": partition,
                                  "fetch_offset": offset, "partition_max_bytes": max_bytes}],
            "max_wait_ms": 0, "max_bytes": max_bytes, "encoding": "base64"})
        result = doc["results"][0]
        if not result.get("ok"):
            raise RuntimeError(f"{topic}/{partition} at {offset}: {result.get('error_type')} "
                               f"{result.get('error')}")
        records = result.get("records", [])
        if not records:
            break
        for record in records:
            out[int(record["offset"])] = fnv1a64(base64.b64decode(record["base64"]))
        offset = int(result["next_offset"])
    return out


def verify_acked(acked_path: Path, broker_url: str) -> dict[str, Any]:
    started = time.monotonic()
    acked = read_acked(acked_path)
    missing: list[dict[str, Any]] = []
    mismatched: list[dict[str, Any]] = []
    holes: list[dict[str, Any]] = []
    checked = 0
    unacked = 0
    for (topic, partition), offsets in sorted(acked.items()):
        until = max(offsets)
        stored = read_partition(broker_url, topic, partition, until)
        # The log itself must be contiguous from offset 1. Acknowledged offsets need not
        # be: a broker killed between its commit and its answer leaves committed records
        # nobody was told about, which is allowed (at-least-once), a hole is not.
        absent = [o for o in range(1, until + 1) if o not in stored]
        if absent:
            holes.append({"topic": topic, "partition": partition, "first": absent[0],
                          "count": len(absent)})
        unacked += sum(1 for o in stored if o not in offsets)
        for offset, (digest, broker) in sorted(offsets.items()):
            checked += 1
            got = stored.get(offset)
            if got is None:
                missing.append({"topic": topic, "partition": partition, "offset": offset,
                                "acked_by": broker})
            elif f"{got:016x}" != digest:
                mismatched.append({"topic": topic, "partition": partition, "offset": offset,
                                   "acked_by": broker})
    return {
        "broker_url": broker_url,
        "partitions": len(acked),
        "acked_records": checked,
        "missing": len(missing),
        "mismatched": len(mismatched),
        "log_holes": sum(h["count"] for h in holes),
        "committed_unacked": unacked,
        "examples": {"missing": missing[:20], "mismatched": mismatched[:20],
                     "log_holes": holes[:20]},
        "ok": not missing and not mismatched and not holes,
        "seconds": round(time.monotonic() - started, 3),
    }
