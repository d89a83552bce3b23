"""The live tail's reconnects in headless Chromium, against a real broker: a connection
that drops before any event resumes where each partition's log ended (nothing produced
meanwhile is skipped), and a position the log no longer has restarts from the newest
record rather than failing the same way on every reconnect."""

from __future__ import annotations

import uuid

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.helpers.browser import OpenConsole
from tests.helpers.stack import Broker

pytestmark = pytest.mark.timeout(120)

# A Tail of the page's own module, on one partition of ``topic``, from its log's end.
_START = """async (topic) => {
  const { Tail } = await import('/console/assets/js/tail.js');
  const who = await (await fetch('/whoami')).json();
  const described = await (await fetch(`/topics/${topic}`)).json();
  const next = described.partition_states[0].high_watermark + 1;
  const tail = new Tail({topic, partitions: [0], who, filter: {key: '', text: ''},
                         format: 'auto', next: new Map([[0, next]])});
  document.querySelector('main#page').append(tail.element);
  window.tail = tail;
  await tail.start();
  await new Promise((resolve) => tail.source.addEventListener('open', resolve, {once: true}));
}"""


async def _produce(http: httpx.AsyncClient, topic: str, *values: str) -> None:
    r = await http.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "records": list(values)}]})
    assert r.status_code == 200, r.text


async def _tail(http: httpx.AsyncClient, broker: Broker, open_console: OpenConsole,
                *before: str) -> tuple[Page, str]:
    """A page with a tail of a new topic (``before``: records it holds first)."""
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    assert (await http.post("/topics", json={"topic": topic, "partitions": 1})
            ).status_code == 201
    if before:
        await _produce(http, topic, *before)
    console = await open_console(broker.url)
    await console.goto("/", "overview")
    await console.page.evaluate(_START, topic)
    return console.page, topic


async def test_a_reconnect_before_any_event_skips_nothing_produced_meanwhile(
        console_broker: Broker, open_console: OpenConsole) -> None:
    async with httpx.AsyncClient(base_url=console_broker.url, timeout=30) as http:
        page, topic = await _tail(http, console_broker, open_console, "before")
        await page.evaluate("window.tail.closeSource()")  # dropped before any event
        await _produce(http, topic, "away-1", "away-2")
        await page.evaluate("window.tail.reconnect()")
        # Offsets 2 and 3 came while it was away; 1 was there before the tail began.
        await expect(page.get_by_test_id("record-0-3")).to_be_visible()
        await expect(page.get_by_test_id("record-0-2")).to_be_visible()
        await expect(page.get_by_test_id("record-0-1")).to_have_count(0)
        assert "from=0%3A2" in await page.evaluate("window.tail.source.url")


async def test_a_position_the_log_does_not_have_restarts_from_the_newest(
        console_broker: Broker, open_console: OpenConsole) -> None:
    async with httpx.AsyncClient(base_url=console_broker.url, timeout=30) as http:
        page, topic = await _tail(http, console_broker, open_console)
        # As if the tail had followed a topic since deleted and made anew, shorter.
        await page.evaluate("window.tail.closeSource(); window.tail.lastId = '0:900';"
                            " window.tail.reconnect()")
        await expect(page.get_by_test_id("tail-status")).to_have_text("live")
        await expect(page.locator(".tail-card")).to_contain_text("OffsetOutOfRange")
        await _produce(http, topic, "fresh")
        await expect(page.get_by_test_id("record-0-1")).to_be_visible()
