"""Read acknowledged records back and compare them with what the hammer acknowledged.

With ``hammer.record_acks`` the hammer writes one line per acknowledged record to
``acked.tsv``: topic, partition, offset, FNV-1a 64 of the value (hex) and the broker that
acknowledged it. This module consumes every such partition from its first offset to its
end through one broker's ``POST /consume`` and checks that each acknowledged offset is
there with the same value (an acknowledged record that is missing or different is a
loss) and that no acknowledged value is stored at another offset too (a duplicate: the
hammer's values are unique per record, so a second copy can only come from a retry
written twice).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
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


def read_partition(broker_url: str, topic: str, partition: int,
                   max_bytes: int = 4 * 1024 * 1024) -> dict[int, int]:
    """offset -> value hash of every record of the log, up to its high watermark as the
    first read sees it (a duplicate may lie beyond the highest acknowledged offset)."""
    out: dict[int, int] = {}
    offset = 1
    high_watermark: int | None = None
    while high_watermark is None or offset <= high_watermark:
        doc = _post(f"{broker_url}/consume", {
            "topic_partitions": [{"topic": topic, "partition": partition,
                                  "fetch_offset": offset, "partition_max_bytes": max_bytes}],
            "max_wait_ms": 0, "max_bytes": max_bytes, "encoding": "base64"})
        result = doc["results"][0]
        if not result.get("ok"):
            raise RuntimeError(f"{topic}/{partition} at {offset}: {result.get('error_type')} "
                               f"{result.get('error')}")
        if high_watermark is None:
            high_watermark = int(result["high_watermark"])
        records = result.get("records", [])
        if not records:
            break
        for record in records:
            out[int(record["offset"])] = fnv1a64(base64.b64decode(record["base64"]))
        offset = int(result["next_offset"])
    return out


_KINDS = ("missing", "mismatched", "duplicates", "log_holes")


@dataclass
class Findings:
    """What the read-back found, over all partitions (``examples`` capped per kind)."""

    checked: int = 0
    unacked: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    examples: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {kind: [] for kind in _KINDS})

    def add(self, kind: str, where: dict[str, Any], n: int = 1) -> None:
        self.counts[kind] += n
        if len(self.examples[kind]) < 20:
            self.examples[kind].append(where)

    def check(self, topic: str, partition: int, acked: dict[int, tuple[str, str]],
              stored: dict[int, int]) -> None:
        """Each acknowledged record must be stored at its offset (else it is lost) and
        at no other (else it is duplicated); the log itself must have no hole."""
        tp = {"topic": topic, "partition": partition}
        # Acknowledged offsets need not be contiguous (a broker killed between its commit
        # and its answer leaves records nobody was told about), the log must be.
        absent = [o for o in range(1, max([*acked, *stored]) + 1) if o not in stored]
        if absent:
            self.add("log_holes", {**tp, "first": absent[0], "count": len(absent)},
                     len(absent))
        self.unacked += sum(1 for o in stored if o not in acked)
        for offset, (digest, broker) in sorted(acked.items()):
            self.checked += 1
            got = stored.get(offset)
            if got is None:
                self.add("missing", {**tp, "offset": offset, "acked_by": broker})
            elif f"{got:016x}" != digest:
                self.add("mismatched", {**tp, "offset": offset, "acked_by": broker})
        at: dict[str, list[int]] = defaultdict(list)
        for offset, value in sorted(stored.items()):
            at[f"{value:016x}"].append(offset)
        for digest in sorted({d for d, _ in acked.values()}):
            if len(at[digest]) > 1:
                self.add("duplicates", {**tp, "offsets": at[digest][:10],
                                        "copies": len(at[digest])})


def verify_acked(acked_path: Path, broker_url: str) -> dict[str, Any]:
    started = time.monotonic()
    acked = read_acked(acked_path)
    found = Findings()
    for (topic, partition), offsets in sorted(acked.items()):
        found.check(topic, partition, offsets, read_partition(broker_url, topic, partition))
    c = found.counts
    return {
        "broker_url": broker_url,
        "partitions": len(acked),
        "acked_records": found.checked,
        "missing": c["missing"],
        "mismatched": c["mismatched"],
        # An acknowledged record is lost when missing or different, duplicated when its
        # value is stored at more than one offset.
        "losses": c["missing"] + c["mismatched"],
        "duplicates": c["duplicates"],
        "log_holes": c["log_holes"],
        "committed_unacked": found.unacked,
        "examples": found.examples,
        "ok": not any(c.values()),
        "seconds": round(time.monotonic() - started, 3),
    }
