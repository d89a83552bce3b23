"""The web console's speed in the headless Chromium the browser tests run, and its
screenshots.

    .venv/bin/python bench/console.py                      # about 4 minutes
    .venv/bin/python bench/console.py --loads 20 --rate 1000 --rate 5000 --duration 10
    .venv/bin/python bench/console.py --broker-url http://127.0.0.1:8080
    .venv/bin/python bench/console.py screenshots --out docs/console   # scripts/screenshots

One stack (real Oxia and MinIO on free ports) and one broker with `llog dev`'s settings
(bench/flush_cycle.py's ``start_broker``), or the broker at ``--broker-url`` (its topics
and group then get a random suffix). It seeds a 16-partition topic of ~20,000 JSON
records of ~200 B, a few smaller topics, and a consumer group with one live member and
lag, then measures:

* **page loads**: each page (overview, topics, topic, messages, produce, groups, group)
  ``--loads`` times after one warm-up, each a fresh browser context (no cache, a new
  connection): first-contentful-paint (Performance API) and the time until
  ``main#page[data-ready=<page>]`` is set (a MutationObserver put in before the page's
  scripts), both from navigation start. Beside them, the API floor of the same page:
  ``GET /whoami`` and then the page's own first calls, fetched from the same browser in a
  fresh context, so that what the page adds is visible. The target (issue): first paint
  of any page under 300 ms on loopback.
* **live tail**: the Messages page of a 4-partition topic with the tail on
  (``?tail=1``), then records produced at each ``--rate`` records/s for ``--duration``
  seconds (a paced thread: a batch every 50 ms, spread over the partitions). In the page:
  records received (the tail's count) against acknowledged, how long after the last
  produce the count caught up, the longest main-thread task (``longtask`` entries) and
  the longest event-loop delay (a 10 ms timer's lateness), frames per second
  (requestAnimationFrame callbacks), the rows in the tail's table at the end (bounded by
  its window) and the JS heap before and after.

It measures and prints; it asserts nothing. Results: .llog/bench/console-<time>.json.
``screenshots`` writes one PNG per page at 1440x900 (``overview.png`` ... ``sign-in.png``,
the last from a second broker with access control on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page

# What the page loads are measured on, by page: (route, page name).
PAGES = ("overview", "topics", "topic", "messages", "produce", "groups", "group")
TARGET_FCP_MS = 300.0
VIEWPORT = {"width": 1440, "height": 900}
TOKEN_KEY = "llog.console.token"
WAIT_MS = 20_000
BATCH_INTERVAL_S = 0.05
TAIL_PARTITIONS = 4

# Put in every document before its own scripts: when main#page first gets data-ready
# (the page rendered) and every long task; the tail run adds its probes later.
PROBES = """(() => {
  const b = window.__bench = {ready: null, error: null, readyAt: null, longtasks: []};
  const check = () => {
    if (b.readyAt !== null) return;
    const main = document.querySelector("main#page");
    const ready = main && main.dataset.ready;
    if (ready) {
      b.readyAt = performance.now();
      b.ready = ready;
      b.error = main.dataset.error ?? null;
    }
  };
  new MutationObserver(check).observe(document, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["data-ready"]});
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) b.longtasks.push([e.startTime, e.duration]);
    }).observe({type: "longtask", buffered: true});
  } catch (e) {}
})();"""

# The tail run's probes, started once the tail is live: frames, the longest lateness of a
# 10 ms timer (the main thread busy), and the long tasks from now on.
START_TAIL_PROBES = """() => {
  const b = window.__bench;
  b.longtasks = [];
  b.frames = 0;
  b.lagMax = 0;
  b.counting = true;
  b.t0 = performance.now();
  b.heap0 = performance.memory ? performance.memory.usedJSHeapSize : null;
  const frame = () => { if (!b.counting) return; b.frames += 1; requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
  let due = performance.now() + 10;
  const tick = () => {
    if (!b.counting) return;
    const now = performance.now();
    b.lagMax = Math.max(b.lagMax, now - due);
    due = now + 10;
    setTimeout(tick, 10);
  };
  setTimeout(tick, 10);
}"""

IDLE_FPS = """() => new Promise((done) => {
  let frames = 0;
  const t0 = performance.now();
  const frame = (now) => {
    frames += 1;
    if (now - t0 < 2000) requestAnimationFrame(frame);
    else done(frames / ((now - t0) / 1000));
  };
  requestAnimationFrame(frame);
})"""

STOP_TAIL_PROBES = """() => {
  const b = window.__bench;
  b.counting = false;
  b.t1 = performance.now();
}"""

TAIL_COUNT = """() => Number((document.querySelector('[data-testid="tail-count"]')
  ?.textContent ?? "0").replace(/[^0-9]/g, ""))"""

TAIL_RESULT = """() => {
  const b = window.__bench;
  const seconds = (b.t1 - b.t0) / 1000;
  const tasks = b.longtasks.filter(([start]) => start >= b.t0 && start <= b.t1);
  return {
    seconds,
    frames: b.frames,
    fps: b.frames / seconds,
    longtasks: tasks.length,
    longest_task_ms: tasks.reduce((m, [, d]) => Math.max(m, d), 0),
    longtask_ms_total: tasks.reduce((s, [, d]) => s + d, 0),
    max_timer_delay_ms: b.lagMax,
    rows: document.querySelectorAll('table[data-testid="tail"] tbody tr').length,
    status: document.querySelector('[data-testid="tail-status"]')?.textContent ?? null,
    heap_before_mib: b.heap0 === null ? null : b.heap0 / 1048576,
    heap_after_mib: performance.memory ? performance.memory.usedJSHeapSize / 1048576 : null,
  };
}"""

# The API floor: steps in sequence, the requests of a step at once, each answer read whole.
FETCH_STEPS = """async (steps) => {
  const t0 = performance.now();
  const token = sessionStorage.getItem("llog.console.token");
  for (const step of steps) {
    await Promise.all(step.map(async (r) => {
      const headers = {};
      if (r.body) headers["content-type"] = "application/json";
      if (token) headers["authorization"] = "Bearer " + token;
      const answer = await fetch(r.path, {method: r.method, headers,
        body: r.body ? JSON.stringify(r.body) : undefined});
      if (!answer.ok) throw new Error(r.method + " " + r.path + ": " + answer.status);
      await answer.json();
    }));
  }
  return performance.now() - t0;
}"""


# --- the broker and its data --------------------------------------------------------------


@dataclass
class Seeded:
    """What the seeding made: names (suffixed against a shared broker) and figures."""

    orders: str
    payments: str
    audit: str
    live: str
    group: str
    lone_group: str
    records: dict[str, int] = field(default_factory=dict)
    high_watermarks: dict[int, int] = field(default_factory=dict)  # orders' partitions
    member: dict[str, Any] = field(default_factory=dict)


class Broker:
    """A stack and an `llog dev` broker of our own (``start``), or one already running."""

    def __init__(self, url: str | None, token: str | None) -> None:
        self.url = url or ""
        self.token = token
        self.external = url is not None
        self._stack: Any = None
        self._procs: list[Any] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self, *, compactor: bool = False, **settings: str) -> str:
        """Start the stack (once) and a broker with ``settings`` on it; its URL. With
        ``compactor``, `llog dev`'s compactor beside it too, which its console shows."""
        import flush_cycle

        from app.localstack.broker import wait_healthy
        from app.localstack.dev import start_compactor
        from app.localstack.processes import free_port
        from app.localstack.stack import LocalStack, StackConfig

        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="llog-console-bench-")
            self._stack = LocalStack(StackConfig.ephemeral(Path(self._tmp.name) / "stack"))
            self._stack.__enter__()
        beside: dict[str, str] = {}
        if compactor:
            port = free_port()
            beside = {"LLOG_ROOT_PREFIX": f"cb{uuid.uuid4().hex[:6]}",
                      "LLOG_COMPACTOR_URL": f"http://127.0.0.1:{port}"}
        proc, url = flush_cycle.start_broker(self._stack, Path(self._tmp.name), None, 1,
                                             {**beside, **settings})
        self._procs.append(proc)
        if compactor:
            found, found_url = start_compactor(
                self._stack, Path(self._tmp.name), port=port,
                env={"LLOG_ROOT_PREFIX": beside["LLOG_ROOT_PREFIX"], "LLOG_DRAIN_S": "0"})
            self._procs.append(found)
            wait_healthy(found, found_url)
        if not self.url:
            self.url = url
        return str(url)

    def stop(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.stop(timeout=20)
        if self._stack is not None:
            self._stack.__exit__(None, None, None)
        if self._tmp is not None:
            self._tmp.cleanup()


def record_value(seq: int, ts_ms: int) -> str:
    """A JSON event of about 200 bytes, as a web service logs them."""
    user = seq * 7919 % 50_000
    return json.dumps({
        "ts": ts_ms, "seq": seq, "event": ("page_view", "add_to_cart", "checkout")[seq % 3],
        "user": f"u{user:05d}", "session": f"{user * 31 % 99991:05x}{seq % 97:02d}",
        "path": f"/products/{seq * 13 % 4096}?ref=search&q=item-{seq % 211}",
        "status": 200 if seq % 50 else 503, "ms": seq * 37 % 900,
    }, separators=(",", ":"))


def produce(http: httpx.Client, topic: str, entries: list[tuple[int, list[Any]]]) -> int:
    """One POST /produce of (partition, records) entries; the records acknowledged."""
    body = {"topic_partitions": [{"topic": topic, "partition": p, "records": recs}
                                 for p, recs in entries]}
    answer = http.post("/produce", json=body)
    answer.raise_for_status()
    return sum(int(r["count"]) for r in answer.json()["results"] if r.get("ok"))


def create_topic(http: httpx.Client, topic: str, partitions: int, **settings: Any) -> None:
    answer = http.post("/topics", json={"topic": topic, "partitions": partitions, **settings})
    if answer.status_code != 409:
        answer.raise_for_status()


def seed(http: httpx.Client, suffix: str, orders_records: int, pace_s: float = 0.0
         ) -> Seeded:
    """The topics and groups every page shows. With ``pace_s``, the big topic is written
    over about that many seconds at a rate that swells and ebbs (for the overview's
    charts) rather than at once."""
    s = Seeded(orders=f"orders{suffix}", payments=f"payments{suffix}", audit=f"audit{suffix}",
               live=f"clicks-live{suffix}", group=f"billing{suffix}",
               lone_group=f"audit-archiver{suffix}")
    create_topic(http, s.orders, 16)
    create_topic(http, s.payments, 4, retention_ms=7 * 86_400_000)
    create_topic(http, s.audit, 1, compression="none")
    create_topic(http, s.live, TAIL_PARTITIONS)
    now = int(time.time() * 1000)
    per_request = 2_000 if not pace_s else max(1, round(orders_records / (pace_s * 4)))
    done = 0
    start, due = time.monotonic(), 0.0
    while done < orders_records:
        if pace_s:
            due += 0.25 * (1 + 0.7 * math.sin(done / per_request / 6))
            time.sleep(max(0.0, start + due - time.monotonic()))
        n = min(per_request, orders_records - done)
        entries: list[tuple[int, list[Any]]] = [(p, []) for p in range(16)]
        for i in range(n):
            seq = done + i
            entries[seq % 16][1].append({"key": f"customer-{seq * 7919 % 5000}",
                                         "value": record_value(seq, now - (orders_records - seq))})
        done += produce(http, s.orders, [e for e in entries if e[1]])
    s.records[s.orders] = done
    payments = [(p, [{"key": f"pay-{p}-{i}", "value": json.dumps(
        {"amount_cents": (i * 977) % 50_000, "currency": "EUR", "order": f"o-{p}-{i}"}),
        "headers": [{"name": "trace-id", "value": uuid.uuid4().hex[:16]}]}
        for i in range(150)]) for p in range(4)]
    s.records[s.payments] = produce(http, s.payments, payments)
    audit = [(0, [f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} admin changed "
                  f"retention of {s.payments} (#{i})" for i in range(40)])]
    s.records[s.audit] = produce(http, s.audit, audit)
    s.high_watermarks = {p["partition"]: p["high_watermark"] for p in http.get(
        f"/topics/{s.orders}", params={"max_partitions": 16}).json()["partition_states"]}

    # A group with one live member (its session kept by heartbeats) that lags, and one
    # without members (a lone consumer's commits).
    joined = http.post(f"/groups/{s.group}/join", json={
        "topics": [s.orders], "client_id": "billing-worker-1", "session_timeout_ms": 300_000})
    joined.raise_for_status()
    s.member = joined.json()
    mine = [p for a in s.member["assignment"] if a["topic"] == s.orders for p in a["partitions"]]
    commit = http.post(f"/groups/{s.group}/commit", json={
        "member_id": s.member["member_id"], "generation": s.member["generation"],
        "offsets": [{"topic": s.orders, "partition": p,
                     "offset": max(0, s.high_watermarks[p] - 40 * (p + 1))} for p in mine]})
    commit.raise_for_status()
    http.post(f"/groups/{s.lone_group}/commit", json={
        "offsets": [{"topic": s.audit, "partition": 0, "offset": 29}]}).raise_for_status()
    return s


@contextlib.contextmanager
def heartbeats(http: httpx.Client, s: Seeded) -> Iterator[None]:
    """Keep the group's member live while the block runs; it leaves at the end."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(20):
            with contextlib.suppress(httpx.HTTPError):
                http.post(f"/groups/{s.group}/heartbeat",
                          json={"member_id": s.member["member_id"]})

    thread = threading.Thread(target=beat, name="heartbeats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        with contextlib.suppress(httpx.HTTPError):
            http.post(f"/groups/{s.group}/leave", json={"member_id": s.member["member_id"]})


@dataclass
class Pacer:
    """Records produced at ``rate`` records/s for ``seconds``: a batch every 50 ms spread
    over the topic's partitions, sent from a pool so that a slow answer does not hold the
    next batch back."""

    url: str
    headers: dict[str, str]
    topic: str
    rate: float
    seconds: float
    partitions: int = TAIL_PARTITIONS
    acked: int = 0
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    late_ms_max: float = 0.0
    wall_s: float = 0.0

    def run(self) -> None:
        batches = round(self.seconds / BATCH_INTERVAL_S)
        per_batch = max(1, round(self.rate * BATCH_INTERVAL_S))
        lock = threading.Lock()
        seq = 0
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as http, \
                ThreadPoolExecutor(max_workers=8) as pool:

            def send(entries: list[tuple[int, list[Any]]], n: int) -> None:
                t0 = time.monotonic()
                try:
                    acked = produce(http, self.topic, entries)
                except httpx.HTTPError as exc:
                    with lock:
                        self.errors.append(str(exc)[:200])
                    return
                with lock:
                    self.acked += acked
                    self.latencies_ms.append((time.monotonic() - t0) * 1000)

            start = time.monotonic()
            for k in range(batches):
                due = start + k * BATCH_INTERVAL_S
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    self.late_ms_max = max(self.late_ms_max, -delay * 1000)
                now = int(time.time() * 1000)
                entries: list[tuple[int, list[Any]]] = [(p, []) for p in range(self.partitions)]
                for i in range(per_batch):
                    entries[(seq + i) % self.partitions][1].append(record_value(seq + i, now))
                seq += per_batch
                self.sent += per_batch
                pool.submit(send, [e for e in entries if e[1]], per_batch)
            pool.shutdown(wait=True)
            self.wall_s = time.monotonic() - start


class Traffic:
    """Steady produce and consume in the background (for the overview's charts and the
    tail's screenshot): ``rate`` records/s to the live topic, a consume a second."""

    def __init__(self, url: str, headers: dict[str, str], s: Seeded, rate: float) -> None:
        self.url, self.headers, self.s, self.rate = url, headers, s, rate
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        seq = 0
        offsets = {(t, p): 0 for t, n in ((self.s.orders, 16), (self.s.live, TAIL_PARTITIONS))
                   for p in range(n)}
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as http:
            tick = 0
            while not self.stop.wait(0.25):
                tick += 1
                swell = 1 + 0.5 * math.sin(tick / 20)
                n = max(1, round(self.rate * swell / 4))
                now = int(time.time() * 1000)
                entries: list[tuple[int, list[Any]]] = [
                    (p, [record_value(seq + i, now) for i in range(n)
                         if (seq + i) % TAIL_PARTITIONS == p]) for p in range(TAIL_PARTITIONS)]
                seq += n
                with contextlib.suppress(httpx.HTTPError):
                    produce(http, self.s.live, [e for e in entries if e[1]])
                if tick % 2 == 0:  # and read both back, a little at a time
                    with contextlib.suppress(httpx.HTTPError, KeyError):
                        answer = http.post("/consume", json={
                            "topic_partitions": [{"topic": t, "partition": p,
                                                  "fetch_offset": o}
                                                 for (t, p), o in offsets.items()],
                            "max_wait_ms": 0, "max_bytes": 96 * 1024})
                        for r in answer.json()["results"]:
                            if r.get("ok") and "next_offset" in r:
                                offsets[(r["topic"], r["partition"])] = r["next_offset"]

    def __enter__(self) -> Traffic:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


# --- the browser --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """The tests' Chromium with the tests' flags (tests/helpers/browser.py)."""
    from tests.helpers.browser import MISSING_CHROMIUM, find_chromium, launched_chromium

    found = find_chromium()
    if found is None:
        raise SystemExit(MISSING_CHROMIUM)
    async with launched_chromium(found) as browser:
        yield browser


@dataclass
class Tab:
    context: BrowserContext
    page: Page
    errors: list[str]


async def new_tab(browser: Browser, broker: Broker, *, probes: bool = True) -> Tab:
    """A fresh context (its own cache and connections) and page, with the probes and the
    token (when there is one) in place before the console's scripts run."""
    context = await browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(WAIT_MS)
    if broker.token:
        await context.add_init_script(
            f"try {{ sessionStorage.setItem({json.dumps(TOKEN_KEY)}, "
            f"{json.dumps(broker.token)}); }} catch (e) {{}}")
    if probes:
        await context.add_init_script(PROBES)
    page = await context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return Tab(context, page, errors)


def console_url(base: str, route: str) -> str:
    return f"{base.rstrip('/')}/console#{route}"


def routes(s: Seeded) -> dict[str, str]:
    return {"overview": "/", "topics": "/topics", "topic": f"/topics/{s.orders}",
            "messages": f"/messages/{s.orders}", "produce": f"/produce?topic={s.orders}",
            "groups": "/groups", "group": f"/groups/{s.group}"}


def api_steps(s: Seeded) -> dict[str, list[list[dict[str, Any]]]]:
    """Per page, what it cannot render without: GET /whoami, then its own first calls
    (requests of one step at once, as the page makes them)."""
    def get(path: str) -> dict[str, Any]:
        return {"method": "GET", "path": path, "body": None}

    who = [get("/whoami")]
    describe = f"/topics/{s.orders}?from_partition=0&max_partitions=100"
    last = {"method": "POST", "path": "/consume", "body": {
        "topic_partitions": [{"topic": s.orders, "partition": p,
                              "fetch_offset": max(0, hw - 3), "partition_max_bytes": 65536}
                             for p, hw in s.high_watermarks.items()],
        "max_wait_ms": 0, "max_bytes": 1_048_576}}
    return {
        "overview": [who, [get("/console/api/series"), get("/cluster")]],
        "topics": [who, [get("/topics")]],
        "topic": [who, [get(describe), get(f"/console/api/placement/{s.orders}"
                                           "?from_partition=0&max_partitions=100")]],
        "messages": [who, [get(f"/topics/{s.orders}?max_partitions=1000")], [last]],
        "produce": [who, [get("/topics")]],
        "groups": [who, [get("/groups?limit=100")]],
        "group": [who, [get(f"/groups/{s.group}")]],
    }


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1],
            "n": len(ordered)}


async def load_once(browser: Browser, broker: Broker, url: str, want: str
                    ) -> dict[str, Any]:
    """One fresh load of ``url``: FCP and ready, from navigation start, in ms."""
    tab = await new_tab(browser, broker)
    try:
        await tab.page.goto(url, wait_until="commit")
        await tab.page.wait_for_function("() => window.__bench && window.__bench.readyAt !== null",
                                         timeout=WAIT_MS)
        # The paint entry is queued once the frame is presented: wait for it, bounded.
        with contextlib.suppress(Exception):
            await tab.page.wait_for_function(
                "() => performance.getEntriesByName('first-contentful-paint').length > 0",
                timeout=5_000)
        got = await tab.page.evaluate("""() => {
          const b = window.__bench;
          const nav = performance.getEntriesByType("navigation")[0];
          const fcp = performance.getEntriesByName("first-contentful-paint")[0];
          return {ready: b.ready, error: b.error, ready_ms: b.readyAt,
                  fcp_ms: fcp ? fcp.startTime : null,
                  html_ms: nav ? nav.responseEnd : null,
                  dom_content_loaded_ms: nav ? nav.domContentLoadedEventEnd : null,
                  longest_task_ms: b.longtasks.reduce((m, [, d]) => Math.max(m, d), 0),
                  resources: performance.getEntriesByType("resource").length};
        }""")
        got["errors"] = list(tab.errors)
        if got["ready"] != want:
            text = await tab.page.locator("main#page").inner_text()
            got["shows"] = text[:300]
        return dict(got)
    finally:
        await tab.context.close()


async def api_once(browser: Browser, broker: Broker, steps: list[list[dict[str, Any]]]
                   ) -> float:
    """The page's API calls alone, from a fresh context on the broker's origin."""
    tab = await new_tab(browser, broker, probes=False)
    try:
        await tab.page.goto(f"{broker.url}/health/live")
        return float(await tab.page.evaluate(FETCH_STEPS, steps))
    finally:
        await tab.context.close()


async def page_loads(browser: Browser, broker: Broker, s: Seeded, loads: int
                     ) -> dict[str, Any]:
    results: dict[str, Any] = {}
    steps = api_steps(s)
    for name, route in routes(s).items():
        url = console_url(broker.url, route)
        runs = []
        for i in range(loads + 1):  # the first is the warm-up
            run = await load_once(browser, broker, url, name)
            if i:
                runs.append(run)
        api_ms = []
        for i in range(loads + 1):
            ms = await api_once(browser, broker, steps[name])
            if i:
                api_ms.append(ms)
        ok = [r for r in runs if r["ready"] == name and not r["error"]]
        results[name] = {
            "route": route,
            "fcp_ms": quantiles([r["fcp_ms"] for r in ok if r["fcp_ms"] is not None]),
            "ready_ms": quantiles([r["ready_ms"] for r in ok]),
            "html_ms": quantiles([r["html_ms"] for r in ok if r["html_ms"]]),
            "api_ms": quantiles(api_ms),
            "longest_task_ms": max((r["longest_task_ms"] for r in runs), default=0),
            "resources": runs[0]["resources"] if runs else None,
            "failed": [{k: r.get(k) for k in ("ready", "error", "shows")}
                       for r in runs if r not in ok],
            "errors": sorted({e for r in runs for e in r["errors"]}),
        }
        print_page_row(name, results[name])
    return results


def fmt(v: float | None, width: int = 6) -> str:
    return f"{v:>{width}.0f}" if isinstance(v, int | float) else f"{'-':>{width}}"


def print_page_header(loads: int) -> None:
    print(f"\nPage loads: {loads} fresh loads each after a warm-up (new context: no cache, "
          "new connection); ms from navigation start")
    print(f"{'page':<10} {'FCP p50':>7} {'p95':>6} {'max':>6} | {'ready p50':>9} {'p95':>6} "
          f"{'max':>6} | {'API p50':>7} {'p95':>6} | {'ready-API':>9} | {'FCP<300':>7} "
          "notes")


def print_page_row(name: str, r: dict[str, Any]) -> None:
    fcp, ready, api = r["fcp_ms"], r["ready_ms"], r["api_ms"]
    added = (ready["p50"] - api["p50"]
             if ready["p50"] is not None and api["p50"] is not None else None)
    target = ("-" if fcp["max"] is None
              else "yes" if fcp["max"] < TARGET_FCP_MS else "NO")
    notes = []
    if r["failed"]:
        notes.append(f"{len(r['failed'])} failed: {r['failed'][0]}")
    if r["errors"]:
        notes.append(f"console errors: {r['errors'][:2]}")
    if r["longest_task_ms"]:
        notes.append(f"long task {r['longest_task_ms']:.0f} ms")
    print(f"{name:<10} {fmt(fcp['p50'], 7)} {fmt(fcp['p95'])} {fmt(fcp['max'])} | "
          f"{fmt(ready['p50'], 9)} {fmt(ready['p95'])} {fmt(ready['max'])} | "
          f"{fmt(api['p50'], 7)} {fmt(api['p95'])} | {fmt(added, 9)} | {target:>7} "
          + "; ".join(notes), flush=True)


async def open_tail(browser: Browser, broker: Broker, topic: str) -> Tab:
    """The Messages page of ``topic`` with the live tail on, once the stream is open."""
    tab = await new_tab(browser, broker)
    await tab.page.goto(console_url(broker.url, f"/messages/{topic}?tail=1"))
    await tab.page.wait_for_function("() => window.__bench.readyAt !== null", timeout=WAIT_MS)
    await tab.page.wait_for_function(
        """() => document.querySelector('[data-testid="tail-status"]')?.textContent === "live" """,
        timeout=WAIT_MS)
    return tab


async def tail_run(browser: Browser, broker: Broker, s: Seeded, rate: float, seconds: float
                   ) -> dict[str, Any]:
    tab = await open_tail(browser, broker, s.live)
    try:
        page = tab.page
        # Frames with nothing arriving: what this Chromium gives on this machine now.
        idle_fps = float(await page.evaluate(IDLE_FPS))
        before = int(await page.evaluate(TAIL_COUNT))
        await page.evaluate(START_TAIL_PROBES)
        pacer = Pacer(broker.url, broker.headers(), s.live, rate, seconds)
        await asyncio.to_thread(pacer.run)
        ended = time.monotonic()
        await page.evaluate(STOP_TAIL_PROBES)
        want = before + pacer.acked
        caught_up_ms: float | None = None
        with contextlib.suppress(Exception):
            await page.wait_for_function(f"() => ({TAIL_COUNT})() >= {want}", timeout=15_000,
                                         polling=20)
            caught_up_ms = (time.monotonic() - ended) * 1000
        received = int(await page.evaluate(TAIL_COUNT)) - before
        got = dict(await page.evaluate(TAIL_RESULT))
        p = quantiles(pacer.latencies_ms)
        return {"rate": rate, "seconds": seconds, "sent": pacer.sent, "acked": pacer.acked,
                "produce_wall_s": pacer.wall_s, "produce_errors": pacer.errors[:5],
                "produce_p50_ms": p["p50"], "produce_max_ms": p["max"],
                "pacer_late_ms_max": pacer.late_ms_max,
                "received": received, "caught_up_ms": caught_up_ms, "idle_fps": idle_fps,
                **got,
                "console_errors": tab.errors[:10]}
    finally:
        await tab.context.close()


def print_tail(rows: list[dict[str, Any]]) -> None:
    print("\nLive tail: Messages page with the tail on, records produced paced "
          "(a batch every 50 ms over 4 partitions)")
    print(f"{'rate rec/s':>10} {'acked':>7} {'received':>8} {'recv %':>6} {'caught up ms':>12} "
          f"{'long tasks':>10} {'longest ms':>10} {'max timer delay ms':>18} "
          f"{'frames/s (idle)':>15} "
          f"{'rows':>5} {'heap MiB':>13} {'produce p50 ms':>14}")
    for r in rows:
        if "error" in r:
            print(f"{r['rate']:>10.0f} FAILED: {r['error']}")
            continue
        share = 100 * r["received"] / r["acked"] if r["acked"] else 0
        heap = (f"{r['heap_before_mib']:.1f}->{r['heap_after_mib']:.1f}"
                if r["heap_before_mib"] is not None else "-")
        print(f"{r['rate']:>10.0f} {r['acked']:>7} {r['received']:>8} {share:>6.1f} "
              f"{fmt(r['caught_up_ms'], 12)} {r['longtasks']:>10} {r['longest_task_ms']:>10.0f} "
              f"{r['max_timer_delay_ms']:>18.0f} "
              f"{r['fps']:>7.1f} ({r['idle_fps']:>4.1f}) {r['rows']:>5} "
              f"{heap:>13} {fmt(r['produce_p50_ms'], 14)}", flush=True)
        if r["produce_errors"] or r["console_errors"]:
            print(f"{'':>10} errors: produce {r['produce_errors'][:2]}, "
                  f"console {r['console_errors'][:2]}")


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg": os.getloadavg(), "platform": platform.platform()}


@contextlib.contextmanager
def prepared(a: argparse.Namespace) -> Iterator[tuple[Broker, Seeded, httpx.Client]]:
    """The broker (ours or ``--broker-url``), seeded, its group's member kept live."""
    broker = Broker(a.broker_url, a.token)
    try:
        if not broker.external:
            print("starting Oxia, MinIO, a broker (llog dev's settings) and its compactor...",
                  flush=True)
            broker.start(compactor=True)
        suffix = f"-{uuid.uuid4().hex[:6]}" if broker.external else ""
        with httpx.Client(base_url=broker.url, headers=broker.headers(), timeout=60) as http:
            t0 = time.monotonic()
            s = seed(http, suffix, a.orders_records,
                     pace_s=a.seed_seconds if a.command == "screenshots" else 0.0)
            print(f"seeded {sum(s.records.values()):,} records into {len(s.records)} topics "
                  f"(and {s.live}, empty, for the tail) and 2 groups on {broker.url} in "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
            with heartbeats(http, s):
                yield broker, s, http
    finally:
        broker.stop()


async def bench(a: argparse.Namespace) -> None:
    rates = a.rate or [1000.0, 5000.0]
    report: dict[str, Any] = {"args": {**vars(a), "rate": rates}, "machine": machine()}
    with prepared(a) as (broker, s, _http):
        report["broker"] = broker.url if broker.external else "llog dev (own stack)"
        report["seeded"] = s.records
        async with chromium() as browser:
            report["chromium"] = browser.version
            print(f"Chromium {browser.version}; {os.cpu_count()} CPUs, load average "
                  f"{os.getloadavg()[0]:.1f}")
            print_page_header(a.loads)
            report["pages"] = await page_loads(browser, broker, s, a.loads)
            rows = []
            for rate in rates:
                try:
                    rows.append(await tail_run(browser, broker, s, rate, a.duration))
                except Exception as exc:  # a failed row leaves the others standing
                    rows.append({"rate": rate, "error": f"{type(exc).__name__}: {exc}"[:500]})
            report["tail"] = rows
            print_tail(rows)
    report["machine"]["load_avg_end"] = os.getloadavg()
    out_dir = ROOT / ".llog" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = out_dir / f"console-{stamp}.json"
    out.write_text(json.dumps(report, indent=1))
    summary(report)
    print(f"results: {out}")


def summary(report: dict[str, Any]) -> None:
    pages = report["pages"]
    worst_fcp = max((p["fcp_ms"]["max"] or 0 for p in pages.values()), default=0)
    slowest = max(pages, key=lambda n: pages[n]["ready_ms"]["p50"] or 0)
    print(f"\nSummary: first paint of every page at most {worst_fcp:.0f} ms (target "
          f"{TARGET_FCP_MS:.0f} ms: {'met' if worst_fcp < TARGET_FCP_MS else 'NOT met'}); "
          f"slowest ready (p50) {slowest} {pages[slowest]['ready_ms']['p50'] or 0:.0f} ms.")
    broken = {n: p["failed"] or p["errors"] for n, p in pages.items()
              if p["failed"] or p["errors"]}
    if broken:
        print(f"Pages that failed or logged errors: {broken}")
    for r in report["tail"]:
        if "error" in r:
            continue
        print(f"Tail at {r['rate']:.0f}/s: {r['received']:,} of {r['acked']:,} records shown "
              f"in the count, longest task {r['longest_task_ms']:.0f} ms, "
              f"{r['fps']:.0f} frames/s ({r['idle_fps']:.0f} idle), {r['rows']} rows kept.")


# --- screenshots --------------------------------------------------------------------------


async def shoot(tab: Tab, out: Path, name: str) -> None:
    await tab.page.wait_for_timeout(300)  # let fonts and the last frame settle
    await tab.page.screenshot(path=str(out / f"{name}.png"))
    print(f"  {out / f'{name}.png'}", flush=True)


async def shot(browser: Browser, broker: Broker, out: Path, name: str, route: str,
               ready: str) -> Tab:
    tab = await new_tab(browser, broker)
    await tab.page.goto(console_url(broker.url, route))
    await tab.page.wait_for_function("() => window.__bench.readyAt !== null", timeout=WAIT_MS)
    got = await tab.page.evaluate("() => [window.__bench.ready, window.__bench.error]")
    if got != [ready, None]:
        print(f"  warning: {name}: the page rendered {got}, not {ready!r}")
    return tab


async def screenshots(a: argparse.Namespace) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with prepared(a) as (broker, s, _http), \
            Traffic(broker.url, broker.headers(), s, rate=a.traffic_rate) as traffic:
        auth_url, auth_error = None, None
        if not broker.external:
            auth_url = start_auth_broker(broker)
        else:
            auth_error = "--broker-url: no broker with access control on to show"
        async with chromium() as browser:
            print(f"writing screenshots to {out}/")
            r = routes(s)
            for name in ("topics", "topic", "messages", "groups", "group"):
                tab = await shot(browser, broker, out, name, r[name], name)
                if name == "messages":
                    await tab.page.wait_for_selector(
                        'table[data-testid="records"] tbody tr, [data-testid^="record-"]',
                        timeout=WAIT_MS)
                await shoot(tab, out, name)
                await tab.context.close()

            tab = await shot(browser, broker, out, "produce", r["produce"], "produce")
            form = tab.page.locator('[data-testid="produce-form"]')
            await form.locator('input[name="partition"]').fill("3")
            await form.locator('input[name="key"]').fill("customer-4711")
            await form.locator('textarea[name="value"]').fill(json.dumps(
                {"event": "checkout", "user": "u04711", "cart": 3, "total_cents": 12999},
                indent=2))
            await form.locator('button[name="send"]').click()
            await tab.page.wait_for_selector('[data-testid="produce-result"]',
                                             timeout=WAIT_MS)
            await shoot(tab, out, "produce")
            await tab.context.close()

            tab = await open_tail(browser, broker, s.live)
            await tab.page.wait_for_function(
                """() => document.querySelectorAll('table[data-testid="tail"] tbody tr')
                     .length >= 40""", timeout=WAIT_MS)
            await tab.page.wait_for_timeout(2_500)  # the rate label needs whole seconds
            await shoot(tab, out, "tail")
            await tab.context.close()

            # The charts need samples (every 2 s) with traffic in them.
            wait = a.traffic_seconds - (time.monotonic() - traffic.started)
            if wait > 0:
                print(f"  traffic for {wait:.0f} s more, for the overview's charts",
                      flush=True)
                await asyncio.sleep(wait)
            tab = await shot(browser, broker, out, "overview", "/", "overview")
            await tab.page.wait_for_timeout(2_500)  # one refresh of the charts
            await shoot(tab, out, "overview")
            await tab.context.close()

            if auth_url is not None:
                signed_out = Broker(auth_url, None)
                tab = await shot(browser, signed_out, out, "sign-in", "/topics", "sign-in")
                await shoot(tab, out, "sign-in")
                await tab.context.close()
            else:
                print(f"  sign-in.png not written: {auth_error}")


def start_auth_broker(broker: Broker) -> str:
    """A second broker on the same stack with access control on (a key space of its own)."""
    from app.auth.apikeys import mint

    assert broker._tmp is not None
    _token, stored = mint()
    path = Path(broker._tmp.name) / "auth.toml"
    path.write_text(f'[principals.operator]\nkeys = ["{stored}"]\nadmin = ["*"]\n'
                    'produce = ["*"]\nconsume = ["*"]\ngroup = ["*"]\n')
    return broker.start(LLOG_AUTH="on", LLOG_AUTH_FILE=str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="bench", choices=("bench", "screenshots"))
    parser.add_argument("--loads", type=int, default=10, help="fresh loads per page")
    parser.add_argument("--rate", type=float, action="append",
                        help="live tail rows: records/s (repeatable; default 1000 and 5000)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of production per tail row")
    parser.add_argument("--broker-url", default=None,
                        help="a running broker (no stack started; names get a random suffix)")
    parser.add_argument("--token", default=os.environ.get("LLOG_TOKEN"),
                        help="a bearer token for --broker-url with access control on")
    parser.add_argument("--orders-records", type=int, default=20_000,
                        help="records seeded into the 16-partition topic")
    parser.add_argument("--out", default=str(ROOT / "docs" / "console"),
                        help="screenshots: where the PNGs go")
    parser.add_argument("--traffic-rate", type=float, default=200.0,
                        help="screenshots: records/s of background traffic")
    parser.add_argument("--seed-seconds", type=float, default=16.0,
                        help="screenshots: seconds over which the big topic is written")
    parser.add_argument("--traffic-seconds", type=float, default=24.0,
                        help="screenshots: traffic before the overview's shot")
    a = parser.parse_args()
    if a.command == "screenshots":
        asyncio.run(screenshots(a))
    else:
        asyncio.run(bench(a))


if __name__ == "__main__":
    main()
