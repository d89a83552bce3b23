"""Records that look like real logs, generated reproducibly: what compression is measured on.

A log of ``"x" * 1024`` compresses a thousandfold and says nothing. Real logs repeat
field names, hosts, URL templates and user agents, while ids, timestamps and numbers
vary with realistic cardinality; that mix sets what zstd can do. Three corpora, each a
list of records, the same for a given seed on every machine and Python version (only
``random.Random``'s documented generators are used, never ``hash()`` or the clock):

- ``json``: JSON events of a web service, about 0.7 KiB each: epoch-ms timestamps that
  advance, request ids (uuid4), trace and span ids, 50,000 users (skewed: a few are most
  active), their sessions, URLs from templated routes with path parameters and query
  strings, real user agents, an HTTP status distribution, latencies from a lognormal
  distribution, country codes, hosts and amounts.
- ``access``: traffic of the same kind as access-log lines (Apache/nginx combined log format),
  about 0.25 KiB each.
- ``random``: random bytes in records of the ``json`` corpus's sizes: the worst case,
  where compression must cost little and store raw.

    .venv/bin/python bench/corpus.py --corpus json --mib 16 --out json.records
    .venv/bin/python bench/corpus.py --corpus access --mib 1 --print 3

``--out`` writes the records length-prefixed (a 4-byte big-endian length, then the
bytes), the form the load generator reads (``httpload -records-file``).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
DEFAULT_SEED = 29
CORPORA = ("json", "access", "random")
# 2026-11-01T00:00:00Z: the corpus's first timestamp.
START_MS = 1_793_491_200_000

USERS = 50_000
SESSIONS_PER_USER = 4
HOSTS = [f"ip-10-{a}-{b}-{c}" for a, b, c in ((0, 12, 34), (0, 12, 35), (0, 13, 7),
                                             (1, 4, 201), (1, 4, 202), (1, 9, 18),
                                             (2, 0, 77), (2, 0, 78))]
SERVICES = [("checkout-api", "3.14.2"), ("catalog-api", "7.2.0"), ("search-api", "1.48.5"),
            ("accounts-api", "2.9.11"), ("edge-gateway", "0.31.4")]
REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "ap-southeast-2"]
# (method, template, weight): {id} a product, {uid} the user, {oid} an order, {q} a term.
ROUTES = [
    ("GET", "/api/v1/products/{id}", 30),
    ("GET", "/api/v1/products/{id}/reviews?page={page}&sort={sort}", 8),
    ("GET", "/api/v1/search?q={q}&limit={limit}&offset={offset}", 15),
    ("GET", "/api/v1/users/{uid}/cart", 10),
    ("POST", "/api/v1/users/{uid}/cart/items", 6),
    ("DELETE", "/api/v1/users/{uid}/cart/items/{id}", 2),
    ("POST", "/api/v1/checkout", 3),
    ("GET", "/api/v1/orders/{oid}", 4),
    ("GET", "/api/v1/users/{uid}/orders?status={ostatus}&page={page}", 3),
    ("POST", "/api/v1/auth/token", 5),
    ("GET", "/static/js/app.{hash}.js", 6),
    ("GET", "/static/img/products/{id}/{size}.webp", 7),
    ("GET", "/healthz", 1),
]
USER_AGENTS = [
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.0.0 Safari/537.36", 30),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like "
     "Gecko) Version/18.1 Safari/605.1.15", 12),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, "
     "like Gecko) Version/18.1 Mobile/15E148 Safari/604.1", 18),
    ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.6778.81 Mobile Safari/537.36", 14),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:132.0) Gecko/20100101 Firefox/132.0", 7),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/130.0.0.0 Safari/537.36", 3),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0", 6),
    ("okhttp/4.12.0", 4),
    ("python-requests/2.32.3", 2),
    ("Googlebot/2.1 (+http://www.google.com/bot.html)", 2),
    ("curl/8.10.1", 1),
]
STATUSES = [(200, 820), (201, 40), (204, 25), (301, 8), (304, 30), (400, 18), (401, 12),
            (403, 5), (404, 28), (409, 3), (429, 4), (500, 4), (502, 2), (503, 1)]
COUNTRIES = [("US", 38), ("GB", 8), ("DE", 8), ("FR", 5), ("IN", 9), ("BR", 6), ("JP", 5),
             ("CA", 4), ("AU", 3), ("NL", 2), ("ES", 3), ("IT", 3), ("MX", 3), ("PL", 2),
             ("SE", 1), ("KR", 2), ("SG", 1), ("ZA", 1)]
TERMS = ["running shoes", "laptop", "usb-c cable", "coffee grinder", "headphones",
         "winter jacket", "desk lamp", "yoga mat", "backpack", "phone case", "monitor 27",
         "mechanical keyboard", "water bottle", "air fryer", "sunglasses", "board games"]
REFERRERS = ["-", "https://www.google.com/", "https://shop.example.com/",
             "https://shop.example.com/cart", "https://www.bing.com/",
             "https://t.co/", "https://www.facebook.com/"]
LEVEL_OF = {2: "info", 3: "info", 4: "warn", 5: "error"}


class _Traffic:
    """One stream of requests; the json and access corpora render the same stream."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now_ms = START_MS
        self._routes = _Weighted([(m, t) for m, t, _ in ROUTES], [w for *_, w in ROUTES])
        self._agents = _Weighted([a for a, _ in USER_AGENTS], [w for _, w in USER_AGENTS])
        self._statuses = _Weighted([s for s, _ in STATUSES], [w for _, w in STATUSES])
        self._countries = _Weighted([c for c, _ in COUNTRIES], [w for _, w in COUNTRIES])
        # A user keeps an agent, a country and an IP address (a stable attribute each).
        self._user_seed = self.rng.getrandbits(32)

    def hexid(self, bits: int) -> str:
        return f"{self.rng.getrandbits(bits):0{bits // 4}x}"

    def _user(self) -> int:
        # Skewed: the most active users account for most requests (about a Zipf law).
        return int(USERS * self.rng.random() ** 2.2)

    def _user_traits(self, user: int) -> tuple[str, str, str]:
        own = random.Random(self._user_seed * 1_000_003 + user)
        ip = (f"{own.choice((23, 45, 66, 73, 98, 104, 142, 172, 185, 203))}."
              f"{own.randrange(256)}.{own.randrange(256)}.{own.randrange(1, 255)}")
        return self._agents.pick(own), self._countries.pick(own), ip

    def next(self) -> _Request:
        rng = self.rng
        self.now_ms += max(1, int(rng.expovariate(1 / 3.0)))  # about 330 requests/s
        user = self._user()
        agent, country, ip = self._user_traits(user)
        method, template = self._routes.pick(rng)
        status = self._statuses.pick(rng)
        path = template.format(
            id=int(200_000 * rng.random() ** 3), uid=f"u{user:06d}",
            oid=f"ord_{rng.randrange(10**9):09d}", q=rng.choice(TERMS).replace(" ", "+"),
            page=rng.randint(1, 12), sort=rng.choice(("recent", "rating", "helpful")),
            limit=rng.choice((20, 24, 48)), offset=rng.choice((0, 0, 0, 24, 48, 96)),
            ostatus=rng.choice(("open", "shipped", "delivered")),
            hash=rng.choice(("8f3a2c1d", "1b9e77fa", "c04d5e21")),
            size=rng.choice(("thumb", "medium", "large")))
        # Latency: lognormal around 25 ms with a long tail, errors and POSTs slower.
        latency = rng.lognormvariate(math.log(25), 0.9) * (2.5 if status >= 500 else 1) * (
            1.6 if method == "POST" else 1)
        size = 0 if status in (204, 304) else int(rng.lognormvariate(math.log(4000), 1.2))
        return _Request(
            ts=self.now_ms, user=user,
            session=user * SESSIONS_PER_USER + rng.randrange(SESSIONS_PER_USER),
            method=method, path=path, status=status, latency_ms=round(latency, 3),
            bytes=size, agent=agent, country=country, ip=ip,
            referrer=rng.choice(REFERRERS), service=rng.choice(SERVICES),
            host=rng.choice(HOSTS), region=REGIONS[user % len(REGIONS)])


@dataclass(frozen=True)
class _Request:
    ts: int
    user: int
    session: int
    method: str
    path: str
    status: int
    latency_ms: float
    bytes: int
    agent: str
    country: str
    ip: str
    referrer: str
    service: tuple[str, str]
    host: str
    region: str


class _Weighted:
    """Weighted choice by bisecting a cumulative table: one ``random()`` a pick."""

    def __init__(self, items: list[Any], weights: list[int]) -> None:
        self.items = items
        self.cumulative: list[float] = []
        total = 0.0
        for w in weights:
            total += w
            self.cumulative.append(total)

    def pick(self, rng: random.Random) -> Any:
        x = rng.random() * self.cumulative[-1]
        return self.items[bisect.bisect_right(self.cumulative, x)]


def _event(t: _Traffic, r: _Request) -> bytes:
    service, version = r.service
    rng = t.rng
    event: dict[str, object] = {
        "timestamp": r.ts, "level": LEVEL_OF[r.status // 100],
        "service": service, "version": version, "host": r.host, "region": r.region,
        "event": "http_request",
        "request_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "trace_id": t.hexid(128), "span_id": t.hexid(64),
        "user_id": f"u{r.user:06d}",
        "session_id": f"s_{r.session * 2654435761 % 2**40:010x}",
        "http": {"method": r.method, "url": r.path, "status": r.status,
                 "bytes_sent": r.bytes, "user_agent": r.agent,
                 "referrer": r.referrer, "client_ip": r.ip},
        "latency_ms": r.latency_ms,
        "geo": {"country": r.country},
    }
    if r.path.startswith(("/api/v1/checkout", "/api/v1/users")):
        items = rng.randint(1, 6)
        event["cart"] = {"items": items, "currency": "USD",
                         "total_cents": sum(rng.randrange(299, 12999) for _ in range(items))}
    if r.status >= 400:
        event["error"] = {"code": f"E{r.status}{rng.randrange(10)}",
                          "message": {4: "request rejected by validation",
                                      5: "upstream call failed after retries"}[r.status // 100]}
    event["feature_flags"] = sorted(rng.sample(
        ["new_checkout", "fast_search", "reco_v2", "dark_mode", "one_click"], rng.randint(0, 3)))
    return json.dumps(event, separators=(",", ":")).encode()


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _access_line(_t: _Traffic, r: _Request) -> bytes:
    tm = time.gmtime(r.ts // 1000)
    when = (f"{tm.tm_mday:02d}/{_MONTHS[tm.tm_mon - 1]}/{tm.tm_year}:"
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000")
    return (f'{r.ip} - u{r.user:06d} [{when}] "{r.method} {r.path} HTTP/1.1" {r.status} '
            f'{r.bytes or "-"} "{r.referrer}" "{r.agent}" {r.latency_ms / 1000:.3f}').encode()


def _rendered(render: Callable[[_Traffic, _Request], bytes], seed: int
              ) -> Iterator[bytes]:
    t = _Traffic(seed)
    while True:
        yield render(t, t.next())


def stream(corpus: str, seed: int = DEFAULT_SEED) -> Iterator[bytes]:
    """The records of ``corpus``, endlessly, the same for the same seed."""
    if corpus == "json":
        return _rendered(_event, seed)
    if corpus == "access":
        return _rendered(_access_line, seed)
    if corpus == "random":
        return _random(seed)
    raise ValueError(f"no corpus {corpus!r}; one of {', '.join(CORPORA)}")


def _random(seed: int) -> Iterator[bytes]:
    # The json corpus's record sizes, filled with bytes nothing can compress.
    rng = random.Random(seed ^ 0x5EED)
    for record in _rendered(_event, seed):
        yield rng.randbytes(len(record))


def records(corpus: str, total_bytes: int, seed: int = DEFAULT_SEED) -> list[bytes]:
    """Records of ``corpus`` from the start of its stream until they hold at least
    ``total_bytes``."""
    out: list[bytes] = []
    size = 0
    for record in stream(corpus, seed):
        if size >= total_bytes:
            break
        out.append(record)
        size += len(record)
    return out


def pack(items: Iterable[bytes]) -> bytes:
    """Records length-prefixed (4-byte big-endian), as ``httpload -records-file`` reads."""
    return b"".join(struct.pack(">I", len(r)) + r for r in items)


def write(path: Path, corpus: str, total_bytes: int, seed: int = DEFAULT_SEED) -> int:
    """Write ``corpus`` to ``path`` length-prefixed; the number of records written."""
    items = records(corpus, total_bytes, seed)
    path.write_bytes(pack(items))
    return len(items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=CORPORA, default="json")
    parser.add_argument("--mib", type=float, default=16.0, help="MiB of records")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, help="write the records here, length-prefixed")
    parser.add_argument("--print", type=int, default=0, metavar="N",
                        help="print the first N records")
    args = parser.parse_args(argv)
    if args.print:
        for record in itertools.islice(stream(args.corpus, args.seed), args.print):
            sys.stdout.buffer.write(record + b"\n")
    if args.out:
        n = write(args.out, args.corpus, int(args.mib * MiB), args.seed)
        print(f"{n:,} records, {args.mib:g} MiB of {args.corpus} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
