"""Keyed records land where Kafka's default partitioner would put them."""

from __future__ import annotations

import pytest

from app.storage.partitioner import murmur2, partition_for_key


@pytest.mark.parametrize(("key", "expected"), [
    # Kafka's own test vectors for Utils.murmur2.
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), ("abc", 479470107),
])
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def test_the_same_key_always_lands_on_the_same_partition() -> None:
    assert partition_for_key(b"foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12
    assert {partition_for_key(b"customer-17", 8) for _ in range(5)} == {
        partition_for_key(b"customer-17", 8)}
    assert {partition_for_key(bytes([i]), 4) for i in range(64)} == {0, 1, 2, 3}
