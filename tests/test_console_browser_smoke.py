"""The console in headless Chromium: the harness itself (tests/helpers/browser.py, against
pages of its own) and the console's first page served by a real broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.async_api import Browser, expect

from app.localstack.stack import LocalStack
from tests.helpers.browser import OpenConsole
from tests.helpers.stack import BrokerFactory, serving_compactor

HARNESS_PAGE = "data:text/html," + quote(
    "<!doctype html><title>harness</title><main id='page'><p id='n'>0</p></main>"
    "<script>document.querySelector('#n').textContent = String(6 * 7);"
    "document.querySelector('main#page').dataset.ready = 'harness';</script>")

# A stand-in for the console's side of the contract: a hash router that marks main#page
# with data-ready once a route has rendered (a tick later, as a fetch would), and the
# token the tab's sessionStorage holds.
FAKE_CONSOLE = b"""<!doctype html><title>fake console</title><link rel="icon" href="data:,">
<main id="page"></main>
<script>
function show() {
  const main = document.querySelector("main#page");
  main.removeAttribute("data-ready");
  main.removeAttribute("data-error");
  const route = location.hash.replace(/^#\\/?/, "");
  const [name, ...rest] = route.split("/");
  const page = name === "" ? "overview" : rest.length ? name.replace(/s$/, "") : name;
  setTimeout(() => {
    main.textContent = route + " token=" + sessionStorage.getItem("llog.console.token");
    if (page === "broken") main.dataset.error = "PageError";
    main.dataset.ready = page;
  }, 20);
}
addEventListener("hashchange", show);
show();
</script>"""


class _FakeConsole(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = self.path == "/console"
        body = FAKE_CONSOLE if found else b"not found"
        self.send_response(200 if found else 404)
        self.send_header("content-type", "text/html" if found else "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_console() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeConsole)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def test_harness_launches_chromium_renders_a_page_and_evaluates_js(
        browser: Browser, open_console: OpenConsole) -> None:
    assert browser.is_connected()
    assert browser.version.split(".")[0].isdigit(), browser.version
    console = await open_console("http://127.0.0.1:9")  # never visited
    await console.page.goto(HARNESS_PAGE)
    assert await console.wait_ready("harness") is None
    await expect(console.page.locator("#n")).to_have_text("42")
    assert await console.page.evaluate("() => [innerWidth, innerHeight]") == [1440, 900]
    assert console.errors == []


async def test_harness_records_page_errors_and_console_errors(
        open_console: OpenConsole) -> None:
    console = await open_console("http://127.0.0.1:9")
    await console.page.goto("data:text/html,<p>x</p>")
    async with console.page.expect_event("console"):
        await console.page.evaluate("() => console.error('logged on purpose')")
    async with console.page.expect_event("pageerror"):
        await console.page.evaluate("() => setTimeout(() => { throw new Error('thrown') })")
    assert len(console.unexpected_errors()) == 2, console.errors
    console.expect_console_errors("logged on purpose", r"Error: thrown")
    assert console.unexpected_errors() == []


async def test_harness_routes_seeds_the_token_and_reports_a_failed_render(
        fake_console: str, open_console: OpenConsole) -> None:
    console = await open_console(fake_console, token="tok-1")
    main = console.page.locator("main#page")
    await console.goto("", "overview")
    await expect(main).to_have_text(" token=tok-1")
    await console.goto("/topics/a", "topic")
    await console.goto("/topics/b", "topic")  # same page name: waits for the new render
    await expect(main).to_have_text("topics/b token=tok-1")
    async with console.rerender("topic"):  # an action that renders the same page anew
        await console.page.evaluate("() => { location.hash = '#/topics/c' }")
    await expect(main).to_have_text("topics/c token=tok-1")
    # A sign-out drops the token; a reload does not put it back.
    await console.page.evaluate("() => sessionStorage.removeItem('llog.console.token')")
    await console.goto("/groups", "groups")
    await console.page.reload()
    await console.wait_ready("groups")
    await expect(main).to_have_text("groups token=null")
    assert await console.goto("/broken", "broken", allow_error=True) == "PageError"
    with pytest.raises(pytest.fail.Exception, match="with error 'PageError'"):
        await console.goto("/broken", "broken")  # the same URL again: reloads
    assert console.errors == []


@pytest.mark.timeout(60)
async def test_console_overview_renders(brokers: BrokerFactory, stack: LocalStack,
                                        tmp_path: Path, open_console: OpenConsole) -> None:
    """The overview: the serving broker's charts and tiles, the brokers it knows, and the
    standalone compactor it was told of, read from the broker's side."""
    async with serving_compactor(stack, tmp_path, "smoke-compactor") as url:
        broker = brokers.start(compactor_url=url)
        console = await open_console(broker.url)
        await console.goto("", "overview")
        page = console.page
        for chart in ("Records per second", "Throughput", "Produce latency",
                      "Consume answer time, long polls' waits included",
                      "Estimated S3 request cost", "S3 requests per second"):
            await expect(page.locator(f'[data-chart="{chart}"] canvas')).to_have_count(1)
        await expect(page.get_by_test_id("tiles")).to_contain_text("Produced records")
        await expect(page.get_by_test_id("brokers")).to_contain_text("affinity is off")
        await expect(page.get_by_test_id("compactor-status")).to_have_text("ok")
        await expect(page.get_by_test_id("compactor")).to_contain_text("smoke-compactor")
