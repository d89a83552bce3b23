"""Keep the auth file current without a restart: look at it every
``LLOG_AUTH_RELOAD_INTERVAL_S`` (and at once on SIGHUP), load it when it changed, keep
the previous version when the new one is broken."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from app.auth.authfile import AuthConfig, AuthFileError, load

log = logging.getLogger(__name__)
Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> Stamp:
    """What changes when the file is rewritten or replaced (None: it is missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class AuthFileWatch:
    def __init__(self, path: Path, interval_s: float, max_bytes: int,
                 apply: Callable[[AuthConfig], None],
                 on_outcome: Callable[[str], None]) -> None:
        self._path = path
        self._interval = interval_s
        self._max_bytes = max_bytes
        self._apply = apply
        self._on_outcome = on_outcome
        self._stamp: Stamp = None
        # Loads attempted so far (ok or failed), and an event set by the next one.
        self.attempts = 0
        self._attempted = anyio.Event()

    def _attempt_done(self, outcome: str) -> None:
        self.attempts += 1
        self._on_outcome(outcome)
        self._attempted.set()
        self._attempted = anyio.Event()

    async def attempted(self, after: int) -> None:
        """Return once more than ``after`` loads have been attempted."""
        while self.attempts <= after:
            await self._attempted.wait()

    async def load_first(self) -> None:
        """The first load: a broken file stops the process (AuthFileError)."""
        self._stamp = await anyio.to_thread.run_sync(_stamp, self._path)
        self._apply(await anyio.to_thread.run_sync(load, self._path, self._max_bytes))
        self._attempt_done("ok")

    async def reload(self, *, force: bool = False) -> bool:
        """Load the file if it changed (or ``force``); False if it is broken."""
        stamp = await anyio.to_thread.run_sync(_stamp, self._path)
        if stamp == self._stamp and not force:
            return True
        self._stamp = stamp
        try:
            config = await anyio.to_thread.run_sync(load, self._path, self._max_bytes)
        except AuthFileError as exc:
            log.error("auth file not reloaded, the previous version stays in force: %s", exc)
            self._attempt_done("failed")
            return False
        self._apply(config)
        self._attempt_done("ok")
        log.info("auth file %s reloaded: %d principals, %d API keys", self._path,
                 len(config.principals), len(config.keys))
        return True

    async def run(self, *, sighup: bool) -> None:
        """Poll for changes; with ``sighup``, SIGHUP reloads at once as well."""
        async with anyio.create_task_group() as tg:
            if sighup:
                tg.start_soon(self._on_sighup)
            while True:
                await anyio.sleep(self._interval)
                await self.reload()

    async def _on_sighup(self) -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                await self.reload(force=True)
