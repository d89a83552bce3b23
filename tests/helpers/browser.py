"""The console in a real browser: Debian's headless Chromium driven by Playwright.

A pytest plugin (``tests/conftest.py`` registers it): its fixtures are

* ``chromium_executable`` (session): the Chromium binary; the test *fails* (never skips)
  saying what to install when there is none (``scripts/bootstrap.sh test`` installs it);
* ``browser`` (session): one Chromium per test process, launched on first use;
* ``open_console`` (per test): ``await open_console(base_url, token=None)`` opens a new
  context (1440x900) and page; every console error and uncaught page error fails the test
  at teardown unless it declared it (``expect_console_errors``, ``expect_failed_requests``);
* ``console_broker`` (module): a broker against the session stack, for a module's
  console tests to share.

Playwright's *async* API, on the session's event loop (pytest-asyncio's
``asyncio_default_test_loop_scope = "session"``): its sync API marks its own loop as the
thread's running loop between calls, after which no async test of the process could run
("Cannot run the event loop while another loop is running"). So browser tests are
``async def`` and every Playwright call is awaited.

Never ``playwright install``: Playwright's own browsers are a download this machine cannot
make; Debian's ``chromium`` package (or ``LLOG_CHROMIUM``, a path to a Chromium binary) is
what runs. The console app's side of the contract: ``GET {broker}/console`` serves it, a
hash router (``#/topics``, ``#/topics/{name}``, ``#/messages/{topic}``, ``#/produce``,
``#/groups``, ``#/groups/{name}``), and ``<main id="page">`` whose ``data-ready`` attribute
names the page (``overview``, ``topics``, ``topic``, ``messages``, ``produce``, ``groups``,
``group``) once that page has finished rendering (``data-error`` beside it when the render
failed; ``data-ready="sign-in"`` or ``"error"`` when no page could render).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest
import pytest_asyncio

from app.localstack.stack import LocalStack
from tests.helpers.stack import Broker, BrokerFactory

if TYPE_CHECKING:  # imported by the fixtures: every test process loads this plugin
    from playwright.async_api import (
        Browser,
        BrowserContext,
        ConsoleMessage,
        Error,
        Page,
        ViewportSize,
    )

CHROMIUM_ENV = "LLOG_CHROMIUM"
DEFAULT_CHROMIUM = Path("/usr/bin/chromium")
# Debian's /usr/bin/chromium is a shell launcher that sources /etc/chromium.d (extension
# flags, GPU rasterization, a /dev/shm check that misparses findmnt's output) and then
# execs this binary: the harness runs the binary itself, with its own flags only.
DEBIAN_CHROMIUM_BINARY = Path("/usr/lib/chromium/chromium")
MISSING_CHROMIUM = (
    "the console's browser tests need Chromium: install it (Debian: apt-get install chromium; "
    "scripts/bootstrap.sh test does) and retry, or set LLOG_CHROMIUM to a Chromium binary "
    "(never `playwright install`: its browsers are a download the tests do not use)")

# The machine's network is closed: without these Chromium keeps trying to reach Google's
# services (updates, sync, field trials, QUIC probes) and logs every refused connection.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A container's /dev/shm is often 64 MB, too small for the renderer: use /tmp.
    "--disable-dev-shm-usage",
)
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
# Every wait is bounded: an action, a navigation and an expect() each give up after this.
ACTION_TIMEOUT_MS = 10_000
LAUNCH_TIMEOUT_MS = 30_000
TOKEN_KEY = "llog.console.token"
# Marks a tab whose sessionStorage was given the token, so that a reload after the app
# dropped it (a sign-out) does not put it back.
_TOKEN_SEEDED_KEY = "llog.test.token-seeded"

# Chromium's console line for a fetch answered with an error status: the page logs it
# itself, as an error, whether or not the app handles the answer.
_FAILED_RESOURCE = "Failed to load resource: the server responded with a status of {status}"


def find_chromium() -> Path | None:
    """The Chromium the tests run: ``LLOG_CHROMIUM`` when set (and nothing else then),
    else Debian's (its binary behind the /usr/bin launcher), else ``chromium`` on PATH."""
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        path = Path(override)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    if DEFAULT_CHROMIUM.exists():
        if _is_debian_launcher(DEFAULT_CHROMIUM) and os.access(DEBIAN_CHROMIUM_BINARY,
                                                                os.X_OK):
            return DEBIAN_CHROMIUM_BINARY
        if os.access(DEFAULT_CHROMIUM, os.X_OK):
            return DEFAULT_CHROMIUM
    found = shutil.which("chromium")
    return Path(found) if found else None


def _is_debian_launcher(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"/usr/lib/$APPNAME" in head


@dataclass
class ConsolePage:
    """A page of its own browser context, and the errors it logged."""

    page: Page
    context: BrowserContext
    base_url: str
    errors: list[str] = field(default_factory=list)
    _expected: list[re.Pattern[str]] = field(default_factory=list)

    def expect_console_errors(self, *patterns: str) -> None:
        """Declare errors this test provokes: console errors and page errors matching any
        of these regular expressions (``re.search``) do not fail it."""
        self._expected.extend(re.compile(p) for p in patterns)

    def expect_failed_requests(self, *statuses: int) -> None:
        """Declare answers with these statuses (a 401 without a token, a 403, a 404 for a
        topic that is not there): Chromium logs each as an error of its own."""
        self.expect_console_errors(
            *(re.escape(_FAILED_RESOURCE.format(status=s)) + r"\b" for s in statuses))

    def unexpected_errors(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self._expected)]

    async def goto(self, route: str, ready: str, *, allow_error: bool = False
                   ) -> str | None:
        return await goto(self.page, self.base_url, route, ready, allow_error=allow_error)

    async def wait_ready(self, ready: str, *, allow_error: bool = False) -> str | None:
        return await wait_ready(self.page, ready, allow_error=allow_error)

    def rerender(self, ready: str, *, allow_error: bool = False
                 ) -> AbstractAsyncContextManager[None]:
        return rerender(self.page, ready, allow_error=allow_error)


class OpenConsole(Protocol):
    def __call__(self, base_url: str, *, token: str | None = None,
                 expect_console_errors: Iterable[str] = ()) -> Awaitable[ConsolePage]: ...


@contextlib.asynccontextmanager
async def launched_chromium(executable: Path) -> AsyncIterator[Browser]:
    """Headless ``executable`` with the flags this machine needs (the tests' and the
    console bench's one way to start it)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, chromium_sandbox=False,
            args=list(CHROMIUM_ARGS), timeout=LAUNCH_TIMEOUT_MS)
        try:
            yield launched
        finally:
            await launched.close()


def console_url(base_url: str, route: str = "") -> str:
    """``{base_url}/console#{route}``; a route is ``/topics``, ``#/topics`` or ``""``."""
    route = route.removeprefix("#")
    return f"{base_url.rstrip('/')}/console" + (f"#{route}" if route else "")


def ready_selector(ready: str) -> str:
    return f'main#page[data-ready="{ready}"]'


# The app marks main#page with data-ready="{page}" when a page's render is done, with
# data-error="{error type}" beside it when the render failed, and data-ready="error" or
# "sign-in" when no page could render (the broker unreachable, no valid token).
_SETTLED = """([want]) => {
  const main = document.querySelector("main#page");
  const ready = main?.dataset.ready;
  if (ready === undefined) return null;
  if (ready !== want && ready !== "error" && ready !== "sign-in") return null;
  return {ready, error: main.dataset.error ?? null};
}"""


async def wait_ready(page: Page, ready: str, *, allow_error: bool = False,
                     timeout_ms: float = ACTION_TIMEOUT_MS) -> str | None:
    """Wait until the console's page ``ready`` has rendered (after a click, say), and fail
    saying what the page shows when it rendered an error instead (or the sign-in form
    when ``ready`` is another page). With ``allow_error``, the page's ``data-error`` (an
    error type) is returned rather than failing the test; None when it rendered."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        handle = await page.wait_for_function(_SETTLED, arg=[ready], timeout=timeout_ms)
    except PlaywrightTimeout:
        handle = None
    if handle is None:  # said outside the handler: Playwright's own timeout adds nothing
        state = await page.evaluate("""() => {
          const main = document.querySelector("main#page");
          return main === null ? "no main#page"
            : `data-ready=${main.dataset.ready ?? "(none)"}; it shows:\\n`
              + main.innerText.slice(0, 2000);
        }""")
        pytest.fail(f"the console at {page.url} did not render {ready!r} within "
                    f"{timeout_ms / 1000:g} s: {state}", pytrace=False)
    settled = await handle.json_value()
    await handle.dispose()
    assert isinstance(settled, dict), settled
    error = settled["error"]
    if settled["ready"] != ready or (error is not None and not allow_error):
        shown = await page.locator("main#page").inner_text(timeout=timeout_ms)
        pytest.fail(f"the console at {page.url} rendered {settled['ready']!r}"
                    + (f" with error {error!r}" if error else "")
                    + f" where {ready!r} was awaited; it shows:\n{shown[:2000]}",
                    pytrace=False)
    return str(error) if error is not None else None


_UNMARK = "() => document.querySelector('main#page')?.removeAttribute('data-ready')"


@contextlib.asynccontextmanager
async def rerender(page: Page, ready: str, *, allow_error: bool = False,
                   timeout_ms: float = ACTION_TIMEOUT_MS) -> AsyncIterator[None]:
    """Around an action that makes the console render a page again (a form's submit, a
    link to a page of the same name): ``data-ready`` is removed before it, and the block
    ends once ``ready`` has rendered anew, never on the old page's mark::

        async with console.rerender("messages"):
            await form.locator('button[name="read"]').click()
    """
    await page.evaluate(_UNMARK)
    yield
    await wait_ready(page, ready, allow_error=allow_error, timeout_ms=timeout_ms)


async def goto(page: Page, base_url: str, route: str, ready: str, *,
               allow_error: bool = False, timeout_ms: float = ACTION_TIMEOUT_MS
               ) -> str | None:
    """Open the console at ``route`` (``/topics``, ``/topics/t-1``, ``""`` for the overview)
    and wait until its page ``ready`` has rendered (:func:`wait_ready`).

    From another route of the same loaded console the router renders again without a new
    document: ``data-ready`` is removed first, so the wait is for the new render and not
    the old page's mark (two topics' pages are both ``topic``). The same URL again reloads.
    """
    url = console_url(base_url, route)
    current = page.url
    if current.split("#", 1)[0] == url.split("#", 1)[0]:
        await page.evaluate(_UNMARK)
        if current == url:
            await page.reload(timeout=timeout_ms)
        else:
            await page.goto(url, timeout=timeout_ms)
    else:
        await page.goto(url, timeout=timeout_ms)
    return await wait_ready(page, ready, allow_error=allow_error, timeout_ms=timeout_ms)


def _seed_token_script(base_url: str, token: str) -> str:
    # Runs before any script of every document of the context: only the console's origin
    # gets the token (a data: or about: document has no storage to give it), once per tab.
    origin = re.match(r"^[a-z]+://[^/]+", base_url)
    assert origin is not None, base_url
    return f"""(() => {{
  if (location.origin !== {json.dumps(origin.group(0))}) return;
  try {{
    if (sessionStorage.getItem({json.dumps(_TOKEN_SEEDED_KEY)}) !== null) return;
    sessionStorage.setItem({json.dumps(TOKEN_KEY)}, {json.dumps(token)});
    sessionStorage.setItem({json.dumps(_TOKEN_SEEDED_KEY)}, "1");
  }} catch (e) {{}}
}})();"""


@pytest.fixture(scope="session")
def chromium_executable() -> Path:
    """The Chromium binary; fails (a skip would fail the run anyway, saying less) when the
    machine has none."""
    found = find_chromium()
    if found is None:
        override = os.environ.get(CHROMIUM_ENV)
        if override:
            pytest.fail(f"{CHROMIUM_ENV}={override} is not an executable file: point it at "
                        "a Chromium binary, or unset it to use Debian's chromium",
                        pytrace=False)
        pytest.fail(MISSING_CHROMIUM, pytrace=False)
    return found


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(chromium_executable: Path) -> AsyncIterator[Browser]:
    """One headless Chromium for the test process (half a second to launch)."""
    from playwright.async_api import expect

    expect.set_options(timeout=ACTION_TIMEOUT_MS)
    async with launched_chromium(chromium_executable) as launched:
        yield launched


@pytest_asyncio.fixture(loop_scope="session")
async def open_console(browser: Browser) -> AsyncIterator[OpenConsole]:
    """``await open_console(base_url, token=None)``: a new context and page for the console
    at ``base_url`` (not yet navigated: ``await console.goto("/topics", "topics")``). With
    ``token``, the page's sessionStorage has it (``llog.console.token``) before the app
    loads. Errors the page logs fail the test at teardown unless it expected them."""
    opened: list[ConsolePage] = []

    async def open_(base_url: str, *, token: str | None = None,
                    expect_console_errors: Iterable[str] = ()) -> ConsolePage:
        context = await browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(ACTION_TIMEOUT_MS)
        if token is not None:
            await context.add_init_script(_seed_token_script(base_url, token))
        page = await context.new_page()
        console = ConsolePage(page, context, base_url.rstrip("/"))
        console.expect_console_errors(*expect_console_errors)
        opened.append(console)

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                where = message.location
                at = f" ({where['url']}:{where['lineNumber']})" if where.get("url") else ""
                console.errors.append(f"console error: {message.text}{at}")

        def on_page_error(error: Error) -> None:
            console.errors.append(f"page error: {error.name}: {error.message}")

        page.on("console", on_console)
        page.on("pageerror", on_page_error)
        return console

    yield open_
    unexpected: list[str] = []
    for console in opened:
        try:
            await console.context.close()
        finally:
            unexpected.extend(console.unexpected_errors())
    if unexpected:
        pytest.fail("the console logged errors the test did not expect "
                    "(ConsolePage.expect_console_errors / expect_failed_requests):\n  "
                    + "\n  ".join(unexpected), pytrace=False)


@pytest.fixture(scope="module")
def console_broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Broker]:
    """A broker against the session stack shared by a module's console tests (one with
    settings of its own: the ``brokers`` fixture's ``brokers.start(**settings)``)."""
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("console-broker"))
    try:
        yield factory.start()
    finally:
        factory.stop_all()
