"""bench/corpus.py: the records compression is measured on are the same for a seed, and
compress as real logs do (JSON events and access logs 3-15x with zstd; random bytes not
at all, so they are stored raw)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402

from app.storage.compression import Codec, Compression, compress  # noqa: E402

MiB = 1024 * 1024


def _digest(records: list[bytes]) -> str:
    return hashlib.sha256(corpus.pack(records)).hexdigest()


@pytest.mark.parametrize("name", corpus.CORPORA)
def test_a_seed_gives_the_same_records(name: str) -> None:
    first = corpus.records(name, 256 * 1024, seed=7)
    assert _digest(first) == _digest(corpus.records(name, 256 * 1024, seed=7))
    assert _digest(first) != _digest(corpus.records(name, 256 * 1024, seed=8))
    assert sum(map(len, first)) >= 256 * 1024


@pytest.mark.parametrize(("name", "low", "high"),
                         [("json", 3.0, 15.0), ("access", 3.0, 15.0), ("random", 0.0, 1.02)])
def test_compression_ratio_is_that_of_real_logs(name: str, low: float, high: float) -> None:
    body = b"".join(corpus.records(name, MiB))  # a flush's body of many records
    codec, stored = compress(body, Compression(Codec.ZSTD, 3))
    ratio = len(body) / len(stored)
    assert low <= ratio <= high, (name, ratio)
    assert codec is (Codec.NONE if name == "random" else Codec.ZSTD)


def test_records_vary_as_real_ones_do() -> None:
    """Ids are many (no tiny dictionary of whole records), timestamps advance, and the
    random corpus has the json corpus's record sizes."""
    events = corpus.records("json", MiB)
    assert len(set(events)) == len(events)
    parsed = [json.loads(e) for e in events]
    stamps = [p["timestamp"] for p in parsed]
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
    assert len({p["user_id"] for p in parsed}) > len(parsed) // 3
    assert len({p["http"]["status"] for p in parsed}) >= 8
    assert [len(r) for r in corpus.records("random", MiB)] == [len(e) for e in events]
    lines = corpus.records("access", 64 * 1024)
    assert all(b'" 2' in line or b'" 3' in line or b'" 4' in line or b'" 5' in line
               for line in lines)


def test_written_records_read_back(tmp_path: Path) -> None:
    out = tmp_path / "json.records"
    n = corpus.write(out, "json", 64 * 1024)
    data = out.read_bytes()
    got, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        got.append(data[at + 4:at + 4 + size])
        at += 4 + size
    assert got == corpus.records("json", 64 * 1024) and len(got) == n


def test_the_codec_bench_measures_every_codec_on_every_corpus() -> None:
    import codec_bench

    result = codec_bench.run(mib=0.25, repeat=1, body_kib=64, seed=3)
    names = {c.name for c in codec_bench.codecs()[0]}
    assert {(r["corpus"], r["batching"], r["codec"]) for r in result["rows"]} == {
        (c, b, n) for c in corpus.CORPORA for b in ("body", "chunk") for n in names}
    for row in result["rows"]:
        if row["corpus"] == "random" and row["codec"].startswith("zstd"):
            assert row["ratio"] == 1.0 and row["stored_raw"] == row["items"]
        elif row["corpus"] != "random":
            assert row["ratio"] > 2.5, row
    assert codec_bench.summary(result["rows"])
