"""The console's Messages and Produce pages in headless Chromium against a real broker:
producing from the form, reading, filtering, permalinks, reading from a time, and the
live tail fed from outside the page (bounded to its window)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page, expect

from app.localstack.stack import LocalStack
from tests.helpers import console_auth
from tests.helpers.auth import bearer
from tests.helpers.browser import OpenConsole
from tests.helpers.console_auth import AuthBroker
from tests.helpers.stack import Broker

pytestmark = pytest.mark.timeout(60)

TAIL_WINDOW = 500  # app/console/assets/js/tail.js


@pytest_asyncio.fixture(loop_scope="session")
async def http(console_broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=console_broker.url, timeout=10) as client:
        yield client


async def new_topic(http: httpx.AsyncClient, partitions: int = 1) -> str:
    name = f"msg-{uuid.uuid4().hex[:10]}"
    answer = await http.post("/topics", json={"topic": name, "partitions": partitions})
    assert answer.status_code == 201, answer.text
    return name


async def produce(http: httpx.AsyncClient, topic: str, records: list[object],
                  partition: int = 0) -> dict[str, object]:
    answer = await http.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": partition, "records": records}]})
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()["results"][0]
    return result


async def record_rows(page: Page, table: str) -> list[str]:
    """The data-testid of each record row of ``table``, top to bottom."""
    rows = await page.locator(f'[data-testid="{table}"] tbody tr[data-testid]').evaluate_all(
        "rows => rows.map(r => r.dataset.testid)")
    return [str(r) for r in rows]


async def test_produce_from_the_form_shows_the_offset_and_links_to_the_record(
        console_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic = await new_topic(http, partitions=2)
    console = await open_console(console_broker.url)
    page = console.page
    await console.goto(f"/produce?topic={topic}", "produce")
    form = page.get_by_test_id("produce-form")
    await expect(form.locator('input[name="topic"]')).to_have_value(topic)
    await form.locator('input[name="partition"]').fill("1")
    await form.locator('input[name="key"]').fill("order-7")
    await form.locator('textarea[name="value"]').fill('{"id": 7, "state": "paid"}')
    await form.locator('button[name="add-header"]').click()
    await form.locator('input[name="header-name"]').fill("trace-id")
    await form.locator('input[name="header-value"]').fill("4bf92f35")
    await form.locator('button[name="send"]').click()
    result = page.get_by_test_id("produce-result")
    await expect(result).to_have_attribute("data-offset", "1")
    await expect(result).to_have_attribute("data-partition", "1")
    await expect(result).to_contain_text("partition 1 at offset 1")

    # The form keeps its values: the same record again lands at the next offset.
    await expect(form.locator('textarea[name="value"]')).to_have_value('{"id": 7, "state": "paid"}')
    await form.locator('button[name="send"]').click()
    await expect(result).to_have_attribute("data-offset", "2")

    # Bytes as base64, by key (no partition): the broker says where it went.
    await form.locator('input[name="partition"]').fill("")
    await form.locator('textarea[name="value"]').fill("AAEC/w==")
    await form.locator('input[name="base64"]').check()
    await form.locator('button[name="send"]').click()
    await expect(result).to_have_attribute("data-ok", "true")
    kp = int(await result.get_attribute("data-partition") or -1)
    ko = int(await result.get_attribute("data-offset") or -1)
    assert (kp, ko) in ((0, 1), (1, 3))
    keyed = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": kp, "fetch_offset": ko}], "max_wait_ms": 0})
    record = keyed.json()["results"][0]["records"][0]
    assert (record["base64"], record["key"]) == ("AAEC/w==", "order-7")

    # The permalink opens Messages on the record, highlighted, with both times and headers.
    await form.locator('input[name="partition"]').fill("1")
    await form.locator('input[name="base64"]').uncheck()
    await form.locator('textarea[name="value"]').fill('{"id": 8}')
    await form.locator('button[name="send"]').click()
    last = 3 if kp == 0 else 4
    await expect(result).to_have_attribute("data-offset", str(last))
    await page.get_by_test_id("produce-permalink").click()
    await console.wait_ready("messages")
    row = page.get_by_test_id(f"record-1-{last}")
    await expect(row).to_have_class("hit")
    await expect(row).to_contain_text('"id": 8')
    await expect(row).to_contain_text("trace-id: 4bf92f35")
    await expect(row).to_contain_text("order-7")
    assert (await record_rows(page, "records"))[0] == f"record-1-{last}"
    assert f"partition=1&offset={last}" in page.url


async def test_messages_reads_all_partitions_and_filters_by_key_and_text(
        console_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic = await new_topic(http, partitions=3)
    for p in range(3):
        await produce(http, topic, [{"key": f"k{i % 3}", "value": f"p{p} n{i}"}
                                    for i in range(12)], partition=p)
    console = await open_console(console_broker.url)
    page = console.page
    await console.goto(f"/messages/{topic}?from=start", "messages")
    rows = await record_rows(page, "records")
    # Merged by append time: partition 0's records were appended first.
    assert len(rows) == 36
    assert rows[:12] == [f"record-0-{o}" for o in range(1, 13)]
    assert rows[-1] == "record-2-12"

    form = page.get_by_test_id("messages-form")
    await form.locator('input[name="key"]').fill("k1")
    await page.evaluate("() => document.querySelector('main#page').removeAttribute('data-ready')")
    await form.locator('button[name="read"]').click()
    await console.wait_ready("messages")
    table = page.get_by_test_id("records")
    keys = await table.locator("tbody tr[data-testid] td.key").all_inner_texts()
    assert keys == ["k1"] * 12
    await expect(page.get_by_test_id("match-count")).to_have_text("12")
    await expect(page.get_by_test_id("records-summary")).to_contain_text("scanned 36 records")

    await console.goto(f"/messages/{topic}?partition=2&from=start&key=k1&q=N4", "messages")
    assert await record_rows(page, "records") == ["record-2-5"]


async def test_a_permalink_and_the_end_of_a_partition(
        console_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic = await new_topic(http)
    await produce(http, topic, [f"r{i}" for i in range(1, 121)])
    console = await open_console(console_broker.url)
    page = console.page
    await console.goto(f"/messages/{topic}?partition=0&offset=57", "messages")
    await expect(page.get_by_test_id("record-0-57")).to_have_class("hit")
    rows = await record_rows(page, "records")
    assert rows[0] == "record-0-57" and len(rows) == 50

    # The end: the last 50; Older reads the 50 before them.
    await console.goto(f"/messages/{topic}", "messages")
    rows = await record_rows(page, "records")
    assert rows == [f"record-0-{o}" for o in range(71, 121)]
    await page.locator('button[name="older"]').click()
    await expect(page.get_by_test_id("record-0-21")).to_be_attached()
    rows = await record_rows(page, "records")
    assert rows == [f"record-0-{o}" for o in range(21, 121)]


async def test_reading_from_a_time_lands_on_the_first_record_appended_then(
        console_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic = await new_topic(http)
    await produce(http, topic, ["before-1", "before-2", "before-3"])
    await produce(http, topic, ["after-1", "after-2"])
    read = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 4}], "max_wait_ms": 0})
    at = read.json()["results"][0]["records"][0]["append_time_ms"]
    before = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 3}], "max_wait_ms": 0})
    assert before.json()["results"][0]["records"][0]["append_time_ms"] < at

    console = await open_console(console_broker.url)
    page = console.page
    await console.goto(f"/messages/{topic}", "messages")
    form = page.get_by_test_id("messages-form")
    await form.locator('select[name="from"]').select_option("time")
    local = await page.evaluate(
        "ms => new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 23)",
        at)
    await form.locator('input[name="time"]').fill(local)
    await page.evaluate("() => document.querySelector('main#page').removeAttribute('data-ready')")
    await form.locator('button[name="read"]').click()
    await console.wait_ready("messages")
    assert await record_rows(page, "records") == ["record-0-4", "record-0-5"]
    assert f"time={at}" in page.url


async def test_live_tail_shows_records_produced_elsewhere_and_stays_bounded(
        console_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic = await new_topic(http, partitions=2)
    await produce(http, topic, ["old"])
    console = await open_console(console_broker.url)
    page = console.page
    await console.goto(f"/messages/{topic}?tail=1", "messages")
    await expect(page.get_by_test_id("tail-status")).to_have_text("live")
    # The most rows the tail's table ever held, watched as it changes.
    await page.evaluate("""() => {
      const body = document.querySelector('[data-testid="tail"] tbody');
      window.__tailMax = 0;
      new MutationObserver(() => {
        window.__tailMax = Math.max(window.__tailMax, body.rows.length);
      }).observe(body, {childList: true});
    }""")
    tail = page.get_by_test_id("tail")
    await produce(http, topic, ["first live"], partition=1)
    await expect(tail.get_by_test_id("record-1-1")).to_contain_text("first live")
    await expect(page.get_by_test_id("tail-count")).to_have_text("1")
    # "old" was there before the tail started: in the records read, not in the tail.
    await expect(page.get_by_test_id("records").get_by_test_id("record-0-1")).to_be_attached()
    assert await tail.get_by_test_id("record-0-1").count() == 0

    sent = 1
    for burst in range(3):
        await produce(http, topic, [f"b{burst}-{i}" for i in range(300)], partition=burst % 2)
        sent += 300
    await expect(page.get_by_test_id("tail-count")).to_have_text(f"{sent:,}")
    tail_rows = page.locator('[data-testid="tail"] tbody tr')
    await expect(tail_rows).to_have_count(TAIL_WINDOW)
    assert await page.evaluate("() => window.__tailMax") <= TAIL_WINDOW
    # Newest first: the last record of the last burst heads the table.
    assert (await record_rows(page, "tail"))[0] == "record-0-601"

    # Paused, records are counted but the table stands still; resumed, it catches up.
    await page.locator('button[name="pause"]').click()
    await produce(http, topic, ["while paused"], partition=1)
    await expect(page.get_by_test_id("tail-count")).to_have_text(f"{sent + 1:,}")
    assert await tail.get_by_test_id("record-1-302").count() == 0
    await page.locator('button[name="pause"]').click()
    await expect(tail.get_by_test_id("record-1-302")).to_contain_text("while paused")

    # Leaving the page closes the stream.
    await console.goto("/topics", "topics")
    assert await page.evaluate("() => window.__tailMax") <= TAIL_WINDOW


async def test_refusals_are_shown(console_broker: Broker, open_console: OpenConsole) -> None:
    console = await open_console(console_broker.url)
    console.expect_failed_requests(404)
    error = await console.goto("/messages/no-such-topic-here", "messages", allow_error=True)
    assert error == "UnknownTopic"
    await expect(console.page.locator(".error")).to_contain_text("Not found")


@pytest.fixture(scope="module")
def auth_broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[AuthBroker]:
    with console_auth.auth_broker(stack, tmp_path_factory.mktemp("console-messages-auth")) as found:
        yield found


async def test_with_access_control_the_tail_uses_a_ticket_and_refusals_are_shown(
        auth_broker: AuthBroker, open_console: OpenConsole) -> None:
    url = auth_broker.broker.url
    console = await open_console(url, token=auth_broker.keys.tokens["reader"])
    page = console.page
    await console.goto(f"/messages/{auth_broker.mine}?tail=1", "messages")
    await expect(page.get_by_test_id("tail-status")).to_have_text("live")
    assert await page.get_by_test_id("messages-produce").count() == 0
    async with httpx.AsyncClient(base_url=url, timeout=10,
                                 headers=bearer(auth_broker.keys.tokens["operator"])) as op:
        answer = await op.post("/produce", json={"topic_partitions": [
            {"topic": auth_broker.mine, "partition": 0, "records": ["through a ticket"]}]})
        assert answer.status_code == 200, answer.text
    await expect(page.get_by_test_id("tail").get_by_test_id("record-0-1")).to_contain_text(
        "through a ticket")

    # No consume right: the page says so, and reads nothing.
    await console.goto(f"/messages/{auth_broker.theirs}", "messages")
    await expect(page.locator(".error")).to_contain_text("Not allowed")
    assert await page.get_by_test_id("records").count() == 0
    # No produce right anywhere: no produce form.
    await console.goto(f"/produce?topic={auth_broker.mine}", "produce")
    await expect(page.locator(".error")).to_contain_text("holds no produce right")
    assert await page.get_by_test_id("produce-form").count() == 0
    # The picker lists only what the reader may consume.
    await console.goto("/messages", "messages")
    picker = page.get_by_test_id("topic-picker")
    await expect(picker).to_contain_text(auth_broker.mine)
    assert auth_broker.theirs not in await picker.inner_text()
