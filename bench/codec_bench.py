"""Codecs on the corpora: what each compresses to and what it costs, without a broker.

For each corpus of bench/corpus.py (JSON events, access-log lines, random bytes) and
each codec (zstd levels 1, 3, 6, 9 and 19 through app/storage/compression.py, as the
broker stores; lz4's frame format when the ``lz4`` package is importable; gzip level 6,
the wire's other encoding), the records are cut into bodies as the broker stores them
and each body is compressed and decompressed on its own:

- ``body``: one partition's part of a flush, ``--body-kib`` (default 256 KiB) of
  consecutive records: what a WAL slice holds;
- ``chunk``: 1 MiB of consecutive records: a compacted chunk, one independent frame each.

Figures per row: ratio (raw bytes over stored; zstd stores raw a body it would not
shrink by a tenth, as the broker does, so random bytes show 1.00), compress and
decompress MiB/s of raw bytes (one thread, wall clock), CPU ms per raw MiB each way.
It answers "lz4, if measured worth it" and "which level for compaction"; on a shared
machine the speeds are indicative (best of ``--repeat`` passes).

    .venv/bin/python bench/codec_bench.py [--mib 4] [--repeat 2] [--body-kib 256]

Prints a table and writes .llog/bench/codecs-<time>.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import corpus  # noqa: E402

from app.storage import compression as cz  # noqa: E402

MiB = 1024 * 1024
OUT_DIR = ROOT / ".llog" / "bench"
ZSTD_LEVELS = (1, 3, 6, 9, 19)


@dataclass(frozen=True)
class Codec:
    name: str
    # raw -> (how it is stored, the stored bytes), as the broker records a body's codec
    compress: Callable[[bytes], tuple[str, bytes]]
    decompress: Callable[[str, bytes, int], bytes]  # (how, stored, raw size) -> raw


def _zstd(level: int) -> Codec:
    setting = cz.Compression(cz.Codec.ZSTD, level)

    def pack(raw: bytes) -> tuple[str, bytes]:
        codec, stored = cz.compress(raw, setting)  # raw when zstd would not pay
        return codec.value, stored

    def unpack(how: str, stored: bytes, size: int) -> bytes:
        return cz.decompress(cz.Codec(how), stored, max_size=size)

    return Codec(f"zstd-{level}", pack, unpack)


def _always(name: str, pack: Callable[[bytes], bytes], unpack: Callable[[bytes], bytes]
            ) -> Codec:
    return Codec(name, lambda raw: (name, pack(raw)), lambda _how, data, _size: unpack(data))


def codecs() -> tuple[list[Codec], str]:
    """The codecs measured, and a note on lz4 (measured, or why not)."""
    found = [_zstd(level) for level in ZSTD_LEVELS]
    try:
        import lz4.frame  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        note = "lz4: not measured (the `lz4` package is not installed; not a dependency)"
    else:
        version = getattr(sys.modules.get("lz4"), "__version__", "?")
        note = f"lz4: lz4.frame of the `lz4` package {version}, default (fast) level"
        found.append(_always("lz4", lz4.frame.compress, lz4.frame.decompress))
    found.append(_always("gzip-6", lambda raw: gzip.compress(raw, 6, mtime=0),
                         gzip.decompress))
    return found, note


def bodies(records: list[bytes], body_bytes: int) -> list[bytes]:
    """Consecutive records joined into bodies of at least ``body_bytes`` (the last may be
    smaller)."""
    out: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for record in records:
        part.append(record)
        size += len(record)
        if size >= body_bytes:
            out.append(b"".join(part))
            part, size = [], 0
    if part:
        out.append(b"".join(part))
    return out


def measure(codec: Codec, items: list[bytes], repeat: int) -> dict[str, float]:
    """Best of ``repeat`` passes over ``items``, each compressed and decompressed alone."""
    raw = sum(map(len, items))
    best: dict[str, float] = {}
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        packed = [codec.compress(item) for item in items]
        w1, c1 = time.perf_counter(), time.process_time()
        back = [codec.decompress(how, data, len(item))
                for (how, data), item in zip(packed, items, strict=True)]
        w2, c2 = time.perf_counter(), time.process_time()
        if back != items:
            raise AssertionError(f"{codec.name} did not give the records back")
        mib = raw / MiB
        stored = [data for _, data in packed]
        run = {"ratio": raw / sum(map(len, stored)),
               "compress_mib_per_s": mib / (w1 - w0),
               "decompress_mib_per_s": mib / (w2 - w1),
               "compress_cpu_ms_per_mib": (c1 - c0) * 1e3 / mib,
               "decompress_cpu_ms_per_mib": (c2 - c1) * 1e3 / mib,
               "stored_raw": sum(how == cz.Codec.NONE.value for how, _ in packed),
               "items": len(items), "raw_bytes": raw}
        if not best or run["compress_mib_per_s"] > best["compress_mib_per_s"]:
            best = run
    return best


def run(mib: float, repeat: int, body_kib: int, seed: int) -> dict[str, Any]:
    found, note = codecs()
    rows = []
    for name in corpus.CORPORA:
        records = corpus.records(name, int(mib * MiB), seed)
        for batching, size in (("body", body_kib * 1024), ("chunk", MiB)):
            items = bodies(records, size)
            for codec in found:
                rows.append({"corpus": name, "batching": batching, "codec": codec.name,
                             **measure(codec, items, repeat)})
    return {"settings": {"mib": mib, "repeat": repeat, "body_kib": body_kib, "seed": seed},
            "lz4": note, "rows": rows}


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The two questions answered from the rows (the JSON corpus, WAL bodies)."""
    by = {(r["corpus"], r["batching"], r["codec"]): r for r in rows}
    lines = []
    z1 = by.get(("json", "body", "zstd-1"))
    lz = by.get(("json", "body", "lz4"))
    if z1 and lz:
        lines.append(
            f"lz4 against zstd-1 (JSON events, WAL bodies): compress "
            f"{lz['compress_mib_per_s']:.0f} vs {z1['compress_mib_per_s']:.0f} MiB/s, "
            f"decompress {lz['decompress_mib_per_s']:.0f} vs "
            f"{z1['decompress_mib_per_s']:.0f} MiB/s, ratio {lz['ratio']:.2f} vs "
            f"{z1['ratio']:.2f}: lz4 stores {z1['ratio'] / lz['ratio']:.2f}x the bytes")
    for name in ("json", "access"):
        chunk = [by[(name, "chunk", f"zstd-{lv}")] for lv in ZSTD_LEVELS
                 if (name, "chunk", f"zstd-{lv}") in by]
        if chunk:
            lines.append(f"compaction ({name}, 1 MiB chunks): " + ", ".join(
                f"zstd-{lv} {r['ratio']:.2f}x at {r['compress_mib_per_s']:.0f} MiB/s"
                for lv, r in zip(ZSTD_LEVELS, chunk, strict=False)))
    return lines


def print_table(result: dict[str, Any]) -> None:
    s = result["settings"]
    print(f"codecs on bench/corpus.py ({s['mib']:g} MiB per corpus, seed {s['seed']}; "
          f"body = {s['body_kib']} KiB of records, chunk = 1 MiB; one thread; best of "
          f"{s['repeat']})")
    print(f"{'corpus':>7} {'batch':>5} {'codec':>7} {'ratio':>6} {'comp MiB/s':>10} "
          f"{'dec MiB/s':>9} {'comp ms/MiB':>11} {'dec ms/MiB':>10} {'raw':>5}")
    for r in result["rows"]:
        print(f"{r['corpus']:>7} {r['batching']:>5} {r['codec']:>7} {r['ratio']:>6.2f} "
              f"{r['compress_mib_per_s']:>10.0f} {r['decompress_mib_per_s']:>9.0f} "
              f"{r['compress_cpu_ms_per_mib']:>11.1f} {r['decompress_cpu_ms_per_mib']:>10.1f} "
              f"{r['stored_raw']:>2}/{r['items']:<2}")
    print(f"raw = bodies stored raw (zstd saved less than {cz.MIN_SAVING:.0%}); "
          f"{result['lz4']}")
    for line in summary(result["rows"]):
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=4.0, help="MiB of each corpus")
    parser.add_argument("--repeat", type=int, default=2, help="passes; the best is kept")
    parser.add_argument("--body-kib", type=int, default=256,
                        help="a WAL body: one partition's records of a flush")
    parser.add_argument("--seed", type=int, default=corpus.DEFAULT_SEED)
    args = parser.parse_args(argv)
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = run(args.mib, args.repeat, args.body_kib, args.seed)
    result["machine"] = {"platform": platform.platform(), "python": platform.python_version(),
                         "started": started}
    print_table(result)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"codecs-{started}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
