"""A real TCP fault proxy between the brokers and a server (MinIO), on a thread of its own
so that the clients' load does not slow it: it forwards bytes as they are until the
nemesis makes the link slow (each chunk from the server held ``delay_s``), half-open
(connections stay up, nothing flows either way), or cut (every connection closed, new ones
refused), and heals it."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from app.localstack.processes import free_port

CHUNK = 64 * 1024


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.delay_s = 0.0
        self._flowing = asyncio.Event()
        self._stopping: asyncio.Event
        self._refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}",
                                        daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve_until_stopped())
        finally:
            self._loop.close()

    async def _serve_until_stopped(self) -> None:
        self._flowing.set()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._started.set()
        await self._stopping.wait()
        # Everything closed and awaited here, on its own loop: a transport left for the
        # garbage collector warns in whatever test runs next.
        server.close()
        self._close_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    # What the nemesis does (from any thread).
    def slow(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def half_open(self) -> None:
        self._call(self._flowing.clear)

    def cut(self) -> None:
        self._refusing = True
        self._call(self._close_all)

    def heal(self) -> None:
        self.delay_s = 0.0
        self._refusing = False
        self._call(self._flowing.set)

    def _call(self, fn: object) -> None:
        self._loop.call_soon_threadsafe(fn)  # type: ignore[arg-type]

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pump(reader, up_writer, slow=False),
                                 self._pump(up_reader, writer, slow=True))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()
            for w in (writer, up_writer):  # let the aborts run their callbacks
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *,
                    slow: bool) -> None:
        while True:
            chunk = await source.read(CHUNK)
            if not chunk:
                with contextlib.suppress(OSError):
                    sink.write_eof()
                return
            await self._flowing.wait()
            if slow and self.delay_s:
                await asyncio.sleep(self.delay_s)
            sink.write(chunk)
            await sink.drain()
