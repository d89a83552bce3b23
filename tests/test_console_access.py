"""Signing in and out of the console in headless Chromium, against a broker with access
control on: the sign-in form, who is signed in, sign-out forgetting the token and what
was typed, and a token that stops working mid-page sending the page back to the form."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect

from app.localstack.stack import LocalStack
from tests.helpers.auth import Keys, bearer, write_atomically
from tests.helpers.browser import OpenConsole
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = pytest.mark.timeout(120)


@dataclass
class Signed:
    broker: Broker
    keys: Keys
    auth_file: Path
    topic: str

    def write(self, *principals: str) -> None:
        """The auth file with these principals' keys only (the broker reloads it)."""
        write_atomically(self.auth_file, "".join(f"""
[principals.{name}]
keys = ["{self.keys.entries[name]}"]
admin = ["*"]
produce = ["*"]
consume = ["*"]
group = ["*"]
""" for name in principals))


@pytest.fixture(scope="module")
def signed(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    tmp = tmp_path_factory.mktemp("console-access")
    keys = Keys()
    for name in ("alice", "bob"):
        keys.new(name)
    found = Signed(Broker.__new__(Broker), keys, tmp / "auth.toml", f"t-{uuid.uuid4().hex[:8]}")
    found.write("alice", "bob")
    factory = BrokerFactory(stack, tmp)
    try:
        found.broker = factory.start(auth="on", auth_file=str(found.auth_file),
                                     auth_reload_interval_s="0.2")
        with httpx.Client(base_url=found.broker.url, timeout=30,
                          headers=bearer(keys.tokens["alice"])) as http:
            r = http.post("/topics", json={"topic": found.topic, "partitions": 1})
            assert r.status_code == 201, r.text
        yield found
    finally:
        factory.stop_all()


async def test_sign_in_shows_who_and_sign_out_forgets_the_token_and_the_draft(
        signed: Signed, open_console: OpenConsole) -> None:
    console = await open_console(signed.broker.url)
    console.expect_failed_requests(401)  # the first /whoami, without a token
    page = console.page
    await console.goto("/topics", "sign-in")
    await page.locator("#sign-in textarea[name=token]").fill("not-a-key")
    await page.locator("#sign-in button[type=submit]").click()
    await expect(page.locator("#sign-in [role=alert]")).to_contain_text("Unauthenticated")
    async with console.rerender("topics"):
        await page.locator("#sign-in textarea[name=token]").fill(signed.keys.tokens["alice"])
        await page.locator("#sign-in button[type=submit]").click()
    await expect(page.locator("#who")).to_have_text("alice (api-key)")
    await expect(page.locator("#sign-out")).to_be_visible()
    await expect(page.get_by_test_id(f"topic-{signed.topic}")).to_be_visible()

    await console.goto("/produce", "produce")
    await page.locator("textarea[name=value]").fill("typed by alice")
    await page.locator("#sign-out").click()
    await console.wait_ready("sign-in")
    assert await page.evaluate("sessionStorage.getItem('llog.console.token')") is None
    async with console.rerender("overview"):
        await page.locator("#sign-in textarea[name=token]").fill(signed.keys.tokens["bob"])
        await page.locator("#sign-in button[type=submit]").click()
    await expect(page.locator("#who")).to_have_text("bob (api-key)")
    await console.goto("/produce", "produce")
    await expect(page.locator("textarea[name=value]")).to_have_value("")


async def test_a_key_revoked_while_a_page_refreshes_sends_it_back_to_sign_in(
        signed: Signed, open_console: OpenConsole) -> None:
    console = await open_console(signed.broker.url, token=signed.keys.tokens["bob"])
    console.expect_failed_requests(401)
    page = console.page
    await console.goto("/", "overview")  # it refreshes its charts every 2 s
    await expect(page.locator("#who")).to_have_text("bob (api-key)")
    signed.write("alice")  # bob's key is gone
    try:
        await console.wait_ready("sign-in")
        await expect(page.locator("#sign-in [role=alert]")).to_contain_text(
            "Unauthenticated")
        assert await page.evaluate("sessionStorage.getItem('llog.console.token')") is None
        await expect(page.locator("#sign-out")).to_be_hidden()
    finally:
        signed.write("alice", "bob")
