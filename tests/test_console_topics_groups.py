"""The console's Topics and Consumer groups pages in headless Chromium, against real
brokers: a topic created, changed and deleted through the forms, a group's lag followed
as it commits and its offsets reset through the dialog, and what a principal without
the rights is (not) offered.

Two brokers for the module: one without access control (its deletes answer 202 at once,
LLOG_TOPIC_DELETE_WAIT_MS=0, so the "being deleted" path is the one seen), one with an
auth file.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Route, expect

from app.localstack.stack import LocalStack
from tests.helpers import console_auth
from tests.helpers.auth import bearer
from tests.helpers.browser import OpenConsole, wait_ready
from tests.helpers.console_auth import AuthBroker
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = pytest.mark.timeout(120)

# A group's page reads it every 2 s: a change shows within a few reads.
REFRESHES_MS = 10_000


@pytest.fixture(scope="module")
def open_broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Broker]:
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("console-topics-groups"))
    try:
        yield factory.start(topic_delete_wait_ms="0")
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def auth_broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[AuthBroker]:
    with console_auth.auth_broker(stack, tmp_path_factory.mktemp("console-topics-groups-auth"),
                                  reader_more='group = ["readers-*"]',
                                  operator_more='group = ["*"]') as found:
        yield found


@pytest_asyncio.fixture(loop_scope="session")
async def http(open_broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=open_broker.url, timeout=30) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_create_change_and_delete_a_topic(open_broker: Broker, http: httpx.AsyncClient,
                                                open_console: OpenConsole) -> None:
    name = unique("console-t")
    console = await open_console(open_broker.url)
    page = console.page
    await console.goto("/topics", "topics")

    # Create, from the form.
    form = page.get_by_test_id("create-topic")
    await page.get_by_text("New topic").click()
    await form.locator("input[name=topic]").fill(name)
    await form.locator("input[name=partitions]").fill("2")
    await form.locator("input[name=retention_ms]").fill("3600000")
    await expect(form.get_by_text("1 h")).to_be_visible()  # the figure in words
    await form.locator("select[name=compression]").select_option("zstd")
    await form.locator("input[name=compression_level]").fill("5")
    await page.evaluate("() => document.querySelector('main#page').removeAttribute('data-ready')")
    await form.get_by_role("button", name="Create topic").click()
    await wait_ready(page, "topics")
    row = page.get_by_test_id("topics").get_by_test_id(f"topic-{name}")
    await expect(row).to_contain_text("zstd 5")
    await expect(row).to_contain_text("1 h")
    await expect(row.locator("td").nth(1)).to_have_text("2")
    await expect(row.locator('[data-col="retained"]')).to_have_text("0 B")  # described
    created = (await http.get(f"/topics/{name}")).json()
    assert (created["partitions"], created["retention_ms"], created["compression"],
            created["compression_level"]) == (2, 3_600_000, "zstd", 5), created

    # The filter narrows the list to it.
    await page.get_by_test_id("topic-filter").fill(name[-8:])
    await expect(page.get_by_test_id("topics").locator("tbody tr")).to_have_count(1)

    # Change its retention and partitions.
    await row.get_by_role("link", name=name).click()
    await wait_ready(page, "topic")
    await expect(page.get_by_test_id("partitions").locator("tbody tr")).to_have_count(2)
    update = page.get_by_test_id("update-topic")
    await page.get_by_text("Change", exact=True).click()
    await expect(update.locator("input[name=partitions]")).to_have_attribute("min", "2")
    await update.locator("input[name=partitions]").fill("3")
    await update.locator("input[name=retention_ms]").fill("7200000")
    await update.locator("input[name=retention_bytes]").fill("1048576")
    await page.evaluate("() => document.querySelector('main#page').removeAttribute('data-ready')")
    await update.get_by_role("button", name="Save changes").click()
    await wait_ready(page, "topic")
    await expect(page.get_by_test_id("partitions").locator("tbody tr")).to_have_count(3)
    await expect(page.get_by_test_id("fact-retention")).to_contain_text("2 h, 1.00 MiB/partition")
    changed = (await http.get(f"/topics/{name}")).json()
    assert (changed["partitions"], changed["retention_ms"], changed["retention_bytes"],
            changed["compression_level"]) == (3, 7_200_000, 1_048_576, 5), changed

    # Delete it: the button waits for the name typed exactly.
    await page.get_by_test_id("delete-topic").click()
    confirm = page.get_by_test_id("confirm-delete")
    await expect(confirm).to_be_disabled()
    await page.get_by_test_id("confirm-name").fill(name[:-1])
    await expect(confirm).to_be_disabled()
    await page.get_by_test_id("confirm-name").fill(name + "x")
    await expect(confirm).to_be_disabled()
    await page.get_by_test_id("confirm-name").fill(name)
    await expect(confirm).to_be_enabled()
    await confirm.click()
    await wait_ready(page, "topics")  # back on the list
    # LLOG_TOPIC_DELETE_WAIT_MS=0: the broker answers 202, and the person is told.
    await expect(page.locator("#notice")).to_contain_text(f"Topic {name} is being deleted")
    gone = await http.get(f"/topics/{name}")
    assert gone.status_code == 404 or gone.json()["status"] == "deleting", gone.text
    produced = await http.post("/produce", json={"topic_partitions": [
        {"topic": name, "partition": 0, "records": ["x"]}]})
    assert produced.status_code != 200 or not produced.json()["results"][0]["ok"], produced.text


async def test_the_list_describes_its_topics_a_few_at_a_time(
        open_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    """Retained bytes and last append come from one describe per topic shown: never more
    than 8 in flight, however many topics the view holds."""
    prefix = unique("console-many")
    for i in range(20):
        r = await http.post("/topics", json={"topic": f"{prefix}-{i:02}", "partitions": 1})
        assert r.status_code == 201, r.text
    console = await open_console(open_broker.url)
    page = console.page
    held: list[Route] = []
    most = 0
    eight, nine = asyncio.Event(), asyncio.Event()

    released = False

    async def hold(route: Route) -> None:
        nonlocal most
        if released:
            await route.continue_()
            return
        held.append(route)
        most = max(most, len(held))
        if len(held) == 8:
            eight.set()
        if len(held) > 8:
            nine.set()

    # Describes (GET /topics/{name}), not the list itself.
    await page.route(re.compile(r"/topics/[^/?]+(\?.*)?$"), hold)
    await console.goto(f"/topics?q={prefix}", "topics")
    rows = page.get_by_test_id("topics").locator("tbody tr")
    await expect(rows).to_have_count(20)
    await asyncio.wait_for(eight.wait(), 10)
    # What must not happen is a ninth describe while eight are unanswered: give it the
    # time it would take to be sent, then answer them all.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(nine.wait(), 0.5)
    released = True
    while held:
        await held.pop().continue_()
    for i in range(20):
        await expect(page.get_by_test_id(f"topic-{prefix}-{i:02}").locator(
            '[data-col="retained"]')).to_have_text("0 B")
    assert most == 8, most


async def test_a_topic_page_pages_its_partitions(open_broker: Broker, http: httpx.AsyncClient,
                                                 open_console: OpenConsole) -> None:
    name = unique("console-wide")
    r = await http.post("/topics", json={"topic": name, "partitions": 130})
    assert r.status_code == 201, r.text
    console = await open_console(open_broker.url)
    page = console.page
    await console.goto(f"/topics/{name}", "topic")
    rows = page.get_by_test_id("partitions").locator("tbody tr")
    await expect(rows).to_have_count(100)
    await expect(page.get_by_test_id("partition-99")).to_be_visible()
    await expect(page.get_by_test_id("partitions")).to_contain_text("any broker (affinity off)")
    await expect(page.get_by_test_id("topic-messages")).to_have_attribute(
        "href", f"#/messages/{name}")
    await expect(page.get_by_test_id("topic-produce")).to_have_attribute(
        "href", f"#/produce?topic={name}")
    await page.evaluate("() => document.querySelector('main#page').removeAttribute('data-ready')")
    await page.get_by_role("link", name="Next →").click()
    await wait_ready(page, "topic")
    await expect(rows).to_have_count(30)
    await expect(page.get_by_test_id("partition-129")).to_be_visible()
    await expect(page.get_by_test_id("partition-99")).to_have_count(0)


async def _produce(http: httpx.AsyncClient, topic: str, partition: int, n: int) -> None:
    r = await http.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": partition, "records": [f"r{i}" for i in range(n)]}]})
    assert r.status_code == 200, r.text


async def _commit(http: httpx.AsyncClient, group: str, member: dict[str, object],
                  offsets: dict[int, int], topic: str) -> None:
    r = await http.post(f"/groups/{group}/commit", json={
        "member_id": member["member_id"], "generation": member["generation"],
        "offsets": [{"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()]})
    assert r.status_code == 200, r.text


async def test_a_groups_lag_falls_as_it_commits_and_a_reset_sets_its_offsets(
        open_broker: Broker, http: httpx.AsyncClient, open_console: OpenConsole) -> None:
    topic, group = unique("console-lag"), unique("console-g")
    assert (await http.post("/topics", json={"topic": topic, "partitions": 2})).status_code == 201
    await _produce(http, topic, 0, 10)
    await _produce(http, topic, 1, 4)
    joined = await http.post(f"/groups/{group}/join", json={
        "topics": [topic], "client_id": "lag-worker", "session_timeout_ms": 60_000})
    assert joined.status_code == 200, joined.text
    member = joined.json()
    await _commit(http, group, member, {0: 3, 1: 4}, topic)

    console = await open_console(open_broker.url)
    page = console.page
    await console.goto("/groups", "groups")
    listed = page.get_by_test_id("groups").get_by_test_id(f"group-{group}")
    await expect(listed.locator("td").nth(2)).to_have_text("1")  # members
    await listed.get_by_role("link", name=group).click()
    await wait_ready(page, "group")
    lag0, lag1 = page.get_by_test_id(f"lag-{topic}-0"), page.get_by_test_id(f"lag-{topic}-1")
    await expect(lag0).to_have_attribute("data-lag", "7")
    await expect(lag0.locator('[data-col="lag"]')).to_have_text("7")
    await expect(lag1).to_have_attribute("data-lag", "0")
    await expect(page.get_by_test_id("group-members")).to_contain_text("lag-worker")
    await expect(page.get_by_test_id("group-members")).to_contain_text(f"{topic}: 0\u20131")
    stamp = await page.get_by_test_id("refreshed").text_content()

    # It commits more: the page sees the lag fall within a few refreshes.
    await _commit(http, group, member, {0: 9}, topic)
    await expect(lag0).to_have_attribute("data-lag", "1", timeout=REFRESHES_MS)
    await expect(page.get_by_test_id("refreshed")).not_to_have_text(stamp or "")

    # A reset while the member is live is refused, and the dialog says why in words.
    console.expect_failed_requests(409)
    await page.get_by_test_id("reset-offsets").click()
    dialog = page.get_by_test_id("reset-dialog")
    await dialog.locator("input[name=to][value=earliest]").check()
    await page.get_by_test_id("reset-submit").click()
    await expect(page.get_by_test_id("reset-refused")).to_contain_text(
        "The group has 1 live member; stop it (or wait for its session to expire) and "
        "reset again.")
    await dialog.get_by_role("button", name="Cancel").click()
    await expect(dialog).to_have_count(0)
    assert (await http.get(f"/groups/{group}")).json()["partitions"][0]["committed_offset"] == 9

    # The member leaves: the reset goes through, and the table shows the offsets set.
    left = await http.post(f"/groups/{group}/leave", json={"member_id": member["member_id"]})
    assert left.json()["left"] is True, left.text
    await expect(page.get_by_test_id("no-members")).to_be_visible(timeout=REFRESHES_MS)
    await page.get_by_test_id("reset-offsets").click()
    await dialog.locator("select[name=scope]").select_option(label=f"{topic} / 0")
    await dialog.locator("input[name=offset]").fill("4")  # picks the "offset" target
    await expect(dialog.locator("input[name=to][value=offset]")).to_be_checked()
    await page.get_by_test_id("reset-submit").click()
    await expect(dialog).to_have_count(0)
    await expect(lag0).to_have_attribute("data-committed", "4")
    await expect(lag0).to_have_attribute("data-lag", "6")
    await expect(lag1).to_have_attribute("data-committed", "4")  # untouched

    await page.get_by_test_id("reset-offsets").click()
    await dialog.locator("select[name=scope]").select_option(label=f"{topic}: every partition")
    await dialog.locator("input[name=to][value=earliest]").check()
    await page.get_by_test_id("reset-submit").click()
    await expect(dialog).to_have_count(0)
    await expect(lag0).to_have_attribute("data-lag", "10")
    await expect(lag1).to_have_attribute("data-lag", "4")
    described = (await http.get(f"/groups/{group}")).json()
    assert [p["lag"] for p in described["partitions"]] == [10, 4], described


async def test_with_access_control_what_a_reader_may_not_do_is_not_offered(
        auth_broker: AuthBroker, open_console: OpenConsole) -> None:
    reader = auth_broker.keys.tokens["reader"]
    console = await open_console(auth_broker.broker.url, token=reader)
    page = console.page
    await console.goto("/topics", "topics")
    # The list holds only what it has a right on, and no create form: it holds no admin.
    await expect(page.get_by_test_id("topics").locator("tbody tr")).to_have_count(1)
    await expect(page.get_by_test_id(f"topic-{auth_broker.mine}")).to_be_visible()
    await expect(page.get_by_test_id("create-topic")).to_have_count(0)

    await console.goto(f"/topics/{auth_broker.mine}", "topic")
    await expect(page.get_by_test_id("partitions")).to_be_visible()
    await expect(page.get_by_test_id("topic-messages")).to_be_visible()
    await expect(page.get_by_test_id("delete-topic")).to_have_count(0)
    await expect(page.get_by_test_id("update-topic")).to_have_count(0)

    # Sent to the page of a topic it holds no right on: the refusal, in words.
    console.expect_failed_requests(403)
    assert await console.goto(f"/topics/{auth_broker.theirs}", "topic",
                              allow_error=True) == "Forbidden"
    refusal = page.locator("main#page .error")
    await expect(refusal).to_contain_text("Not allowed")
    await expect(refusal).to_contain_text(re.compile(r"reader holds no right on topic"))
    await expect(page.get_by_test_id("partitions")).to_have_count(0)


async def test_with_access_control_a_group_without_the_right_offers_no_reset(
        auth_broker: AuthBroker, open_console: OpenConsole) -> None:
    """The reader holds ``group`` on readers-* only: its own group offers the reset, and
    another is refused outright."""
    operator = auth_broker.keys.tokens["operator"]
    mine, theirs = unique("readers"), unique("others")
    async with httpx.AsyncClient(base_url=auth_broker.broker.url, timeout=30,
                                 headers=bearer(operator)) as http:
        for group in (mine, theirs):
            r = await http.post(f"/groups/{group}/reset-offsets", json={
                "topic_partitions": [{"topic": auth_broker.mine, "to": "earliest"}]})
            assert r.status_code == 200, r.text
    console = await open_console(auth_broker.broker.url, token=auth_broker.keys.tokens["reader"])
    page = console.page
    await console.goto("/groups", "groups")
    await expect(page.get_by_test_id(f"group-{mine}")).to_be_visible()
    await expect(page.get_by_test_id(f"group-{theirs}")).to_have_count(0)
    await console.goto(f"/groups/{mine}", "group")
    await expect(page.get_by_test_id("reset-offsets")).to_be_visible()
    console.expect_failed_requests(403)
    assert await console.goto(f"/groups/{theirs}", "group", allow_error=True) == "Forbidden"
    await expect(page.locator("main#page .error")).to_contain_text("Not allowed")
    await expect(page.get_by_test_id("reset-offsets")).to_have_count(0)
