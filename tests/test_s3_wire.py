"""The lean path's connections (app/stores/s3/wire.py) against a scripted server that
writes its answers in pieces of random sizes: bodies and spans land where they
belong, connections are kept and reused only when the answer allows it, and every way
an answer can go wrong fails the request (retryably) without leaving the next one
reading its leftovers."""

from __future__ import annotations

import asyncio
import gc
import random
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import trustme
import uvloop

from app.stores.s3 import wire as s3_wire
from app.stores.s3.wire import MAX_ERROR_BODY, MAX_HEAD, WireError, WirePool

OK = frozenset({200, 206})

REQUEST = b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Script:
    """What the server does with the n-th request it reads (over all connections):
    ``answer(n)`` gives the bytes of its answer, written in pieces of random sizes
    (``whole``: in one write); ``close_after(n)``, whether it then closes the connection;
    ``drop(n)``, close without answering; ``stall(n)``, write half the answer and wait
    until the client goes (``stalled`` is set then, ``gone`` once it went)."""

    answer: Callable[[int], bytes]
    close_after: Callable[[int], bool] = lambda n: False
    drop: Callable[[int], bool] = lambda n: False
    stall: Callable[[int], bool] = lambda n: False
    whole: bool = False
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    requests: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(5))


def ok(body: bytes, status: int = 206, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d Partial Content\r\nContent-Length: %d\r\n%s\r\n"
            % (status, len(body), extra)) + body


@asynccontextmanager
async def serving(script: Script, tls: ssl.SSLContext | None = None
                  ) -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        script.connections += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                n = script.requests
                script.requests += 1
                if script.drop(n):
                    return
                data = script.answer(n)
                if script.stall(n):
                    writer.write(data[:len(data) // 2])
                    await writer.drain()
                    script.stalled.set()
                    await reader.read()  # until the client closes
                    script.gone.set()
                    return
                while data:  # in pieces, so a body crosses many reads
                    size = len(data) if script.whole else script.rng.choice(
                        (1, 7, 100, 4096, 70_000))
                    writer.write(data[:size])
                    data = data[size:]
                    await writer.drain()
                if script.close_after(n):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client went (or read no further)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def pool(port: int, read_timeout_s: float = 10.0,
               tls: ssl.SSLContext | None = None) -> AsyncIterator[WirePool]:
    wire = WirePool("127.0.0.1", port, ssl_context=tls, limit=4, connect_timeout_s=5,
                    read_timeout_s=read_timeout_s)
    try:
        yield wire
    finally:
        wire.close()


async def test_spans_land_in_buffers_of_their_own_on_one_kept_connection() -> None:
    rng = random.Random(11)
    body = rng.randbytes(300_000)
    script = Script(lambda n: ok(body))
    async with serving(script) as port, pool(port) as wire:
        for _ in range(40):
            cuts = sorted(rng.sample(range(len(body)), 6))
            spans = [(cuts[i], cuts[i + 1]) for i in range(0, 6, 2)]
            spans[-1] = (spans[-1][0], len(body))  # the range ends with the last span
            answer = await wire.exchange(REQUEST, OK, spans)
            assert answer.length == len(body)
            assert answer.buffers == [body[a:b] for a, b in spans]
            whole = await wire.exchange(REQUEST, OK)
            assert whole.buffers == [body]
        wire.close()
    assert script.connections == 1


async def test_an_idle_connection_holds_none_of_the_bodies_it_read() -> None:
    async with serving(Script(lambda n: ok(bytes(100_000)))) as port, pool(port) as wire:
        for spans in ((), [(0, 10), (20, 100_000)]):
            answer = await wire.exchange(REQUEST, OK, spans)
            assert len(wire._idle) == 1
            held = [r for r in gc.get_referrers(answer.buffers, *answer.buffers)
                    if r is not answer.buffers and r is not answer]
            assert not [r for r in held if isinstance(r, asyncio.BufferedProtocol | list)]


async def test_a_body_shorter_than_its_spans_comes_back_whole() -> None:
    async with serving(Script(lambda n: ok(b"0123456789"))) as port, pool(port) as wire:
        answer = await wire.exchange(REQUEST, OK, [(0, 4), (4, 20)])
    assert (answer.length, answer.buffers) == (10, [bytearray(b"0123456789")])


async def test_a_kept_connection_the_server_closed_is_replaced_once_unseen() -> None:
    # The server closes a kept connection as the next request arrives on it (a race no
    # idle check can win): sent again on a new connection, once.
    script = Script(lambda n: ok(b"body %d" % n), drop=lambda n: n % 2 == 1)
    async with serving(script) as port, pool(port) as wire:
        got = [(await wire.exchange(REQUEST, OK)).buffers for _ in range(3)]
    assert got == [[b"body 0"], [b"body 2"], [b"body 4"]]
    assert script.connections == 3


async def test_a_new_connection_closed_without_an_answer_fails() -> None:
    script = Script(lambda n: ok(b"first"), drop=lambda n: n > 0)
    async with serving(script) as port, pool(port) as wire:
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"first"]
        with pytest.raises(WireError, match="closed after 0 bytes"):
            await wire.exchange(REQUEST, OK)
    assert script.requests == 3  # on the kept connection, then once on a new one


@pytest.mark.parametrize("closing", [b"Connection: close\r\n", None])
async def test_an_answer_that_ends_its_connection_is_not_reused(closing: bytes | None
                                                                ) -> None:
    def answer(n: int) -> bytes:
        if closing is None:  # HTTP/1.0 closes unless told otherwise
            return b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi"
        return ok(b"hi", 200, closing)

    script = Script(answer)
    async with serving(script) as port, pool(port) as wire:
        for _ in range(3):
            assert (await wire.exchange(REQUEST, OK)).buffers == [b"hi"]
    assert script.connections == 3


@pytest.mark.parametrize("framing", ["length", "chunked", "until-close", "too-long"])
async def test_an_error_answer_is_read_for_its_code_and_its_connection_closed(
        framing: str) -> None:
    error = b"<Error><Code>NoSuchKey</Code></Error>"
    if framing == "too-long":
        error += b" " * (2 * MAX_ERROR_BODY)
    heads = {"length": b"Content-Length: %d\r\n" % len(error),
             "chunked": b"Transfer-Encoding: chunked\r\n",
             "until-close": b"Connection: close\r\n",
             "too-long": b"Content-Length: %d\r\n" % len(error)}
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(error), error) if framing == "chunked" else error

    def answer(n: int) -> bytes:
        if n % 2:
            return ok(b"fine")
        return b"HTTP/1.1 404 Not Found\r\n" + heads[framing] + b"\r\n" + body

    script = Script(answer, close_after=lambda n: framing == "until-close" and n % 2 == 0)
    async with serving(script) as port, pool(port) as wire:
        for _ in range(2):
            failed = await wire.exchange(REQUEST, OK)
            assert failed.status == 404
            assert b"<Code>NoSuchKey</Code>" in failed.buffers[0]
            assert len(failed.buffers[0]) <= MAX_ERROR_BODY
            assert (await wire.exchange(REQUEST, OK)).buffers == [b"fine"]
    # Each error ends its connection; each fine answer comes on a new one.
    assert script.connections == 3


@pytest.mark.parametrize(("answer", "message"), [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
     "without Content-Length"),
    (b"HTTP/1.1 200 OK\r\n\r\n", "without Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 2 * MAX_HEAD + b"\r\n\r\n", "head is over"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nonly 7", "closed after"),
])
async def test_an_answer_this_client_cannot_read_fails_retryably(answer: bytes,
                                                                  message: str) -> None:
    script = Script(lambda n: answer if n == 0 else ok(b"next"),
                    close_after=lambda n: n == 0)
    async with serving(script) as port, pool(port) as wire:
        with pytest.raises(WireError, match=message) as raised:
            await wire.exchange(REQUEST, OK)
        assert isinstance(raised.value, OSError)  # retried as a failed connection is
        # The next request is not fed what is left of that answer.
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"next"]


async def test_bytes_beyond_the_content_length_end_the_connection() -> None:
    # Written with the answer, in one write: they arrive with it.
    script = Script(lambda n: ok(b"abc") + b"surplus" if n == 0 else ok(b"next"),
                    whole=True)
    async with serving(script) as port, pool(port) as wire:
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"abc"]
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"next"]
    assert script.connections == 2


async def test_a_request_cancelled_mid_answer_closes_its_connection() -> None:
    script = Script(lambda n: ok(bytes(100_000)) if n == 0 else ok(b"next"),
                    stall=lambda n: n == 0)
    async with serving(script) as port, pool(port) as wire, anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            async def cancel_once_stalled() -> None:
                await script.stalled.wait()
                scope.cancel()

            tg.start_soon(cancel_once_stalled)
            await wire.exchange(REQUEST, OK)
        assert scope.cancelled_caught
        with anyio.fail_after(5):  # closed, not left to the garbage collector
            await script.gone.wait()
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"next"]
    assert script.connections == 2


async def test_an_answer_that_stops_coming_times_out() -> None:
    # The server writes half the answer, then nothing until the client goes: the wait
    # for the rest never ends but by the read timeout, however slow the machine.
    script = Script(lambda n: ok(b"x" * 10), stall=lambda n: True)
    async with serving(script) as port, pool(port, read_timeout_s=0.3) as wire:
        with pytest.raises(TimeoutError, match="no progress of the S3 exchange for 0.3 s"):
            await wire.exchange(REQUEST, OK)


async def test_a_long_answer_is_not_cut_short_while_its_bytes_keep_coming(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read timeout bounds each wait for bytes, not the whole answer: a body that
    comes one piece per read period, eight periods in all, is read whole.

    The pieces are paced by the read watch itself rather than by sleeps, so no load on
    the machine can leave a period without bytes: the server writes the head when it
    reads the request, and each piece of the body from the check that saw the one
    before; a check is held back while what the server wrote has not arrived yet (on a
    machine that keeps up, it would have). The checks themselves are the real ones."""
    period_s = 0.05
    body = random.Random(3).randbytes(8 * 100)
    head = ok(body)[:-len(body)]
    pieces = [body[i:i + 100] for i in range(0, len(body), 100)]
    writers: list[asyncio.StreamWriter] = []
    sent = [0]  # bytes the server wrote
    seen: list[int] = []  # bytes of the answer each check found received

    def send(data: bytes) -> None:
        writers[0].write(data)  # at once: the bytes are on their way before it returns
        sent[0] += len(data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            send(head)
            await reader.read()  # until the client goes; the checks write the body
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    real_check = s3_wire._ReadWatch._check

    def check(watch: s3_wire._ReadWatch) -> None:
        received, done = watch._conn.received, watch._waiter.done()
        if done:  # read whole; the exchange has yet to stop its watch
            real_check(watch)
            return
        if sent[0] == 0 or received < sent[0]:
            asyncio.get_running_loop().call_soon(check, watch)  # not arrived yet
            return
        real_check(watch)
        seen.append(received)
        if pieces and not watch._waiter.done():
            send(pieces.pop(0))  # a period after the piece before

    monkeypatch.setattr(s3_wire._ReadWatch, "_check", check)
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        async with pool(server.sockets[0].getsockname()[1], read_timeout_s=period_s) as wire:
            began = loop.time()
            answer = await wire.exchange(REQUEST, OK)
            took = loop.time() - began
    finally:
        server.close()
        await server.wait_closed()
    assert answer.buffers == [body]
    # Eight checks, each of which found one more piece than the last; the answer took
    # them all, each a whole period after the one before: far over the read timeout.
    assert seen == [len(head) + 100 * k for k in range(8)]
    assert took > 7 * period_s


async def test_a_request_in_parts_is_written_as_its_bytes_in_order() -> None:
    """A PUT's head and body parts (bytes, views, a bytearray) go out as one request:
    the server reads exactly their bytes, and the connection is kept for the next."""
    body = random.Random(4).randbytes(300_000)
    parts: list[bytes | bytearray | memoryview] = [
        memoryview(body)[:1], body[1:70_000], bytearray(body[70_000:70_001]),
        memoryview(body)[70_001:]]
    head = (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                got = await reader.readuntil(b"\r\n\r\n")
                length = int(got.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                received.append(await reader.readexactly(length))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        async with pool(server.sockets[0].getsockname()[1]) as wire:
            for _ in range(2):
                answer = await wire.exchange([head, *parts], frozenset({200}))
                assert (answer.status, answer.buffers) == (200, [b""])
    finally:
        server.close()
        await server.wait_closed()
    assert received == [body, body]


async def test_an_upload_the_socket_keeps_taking_is_not_timed_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read timeout counts a request's bytes taken by the socket as progress, as it
    counts an answer's bytes: a PUT whose body is still going out (a slow link, a store
    reading slowly) is not failed for the answer it cannot have sent yet; once neither
    moves for a whole period, it is. Paced by the watch's own checks, as above: each
    check that saw progress lets the socket take one more byte."""

    class Transport:
        def __init__(self) -> None:
            self.unsent = 8

        def get_write_buffer_size(self) -> int:
            return self.unsent

    transport = Transport()
    conn = s3_wire._Connection()
    conn._transport = transport  # type: ignore[assignment]
    conn._request_size = 8
    real_check = s3_wire._ReadWatch._check
    unsent_at_checks: list[int] = []

    def check(watch: s3_wire._ReadWatch) -> None:
        unsent_at_checks.append(transport.unsent)
        real_check(watch)
        if transport.unsent:
            transport.unsent -= 1  # the socket took a byte within the next period

    monkeypatch.setattr(s3_wire._ReadWatch, "_check", check)
    waiter: asyncio.Future[s3_wire.Answer] = asyncio.get_running_loop().create_future()
    watch = s3_wire._ReadWatch(conn, waiter, 0.01)
    transport.unsent = 7  # a byte taken in the first period
    try:
        with anyio.fail_after(10), pytest.raises(TimeoutError, match="no progress"):
            await waiter
    finally:
        watch.cancel()
    # Checked with 7, 6, ... 0 bytes left: each saw progress; the one after the last
    # byte went saw none and failed the exchange.
    assert unsent_at_checks == [7, 6, 5, 4, 3, 2, 1, 0, 0]


async def test_interim_answers_are_passed_over_for_the_final_one() -> None:
    """HTTP lets a server send ``100 Continue`` (or ``103 Early Hints``) unasked before
    its answer: the answer is the one after them, and the connection is kept."""
    script = Script(lambda n: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                    b"Link: </x>\r\n\r\n" + ok(b"the body", 200))
    async with serving(script) as port, pool(port) as wire:
        for _ in range(2):
            answer = await wire.exchange(REQUEST, OK)
            assert (answer.status, answer.buffers) == (200, [b"the body"])
    assert script.connections == 1


async def test_a_request_answered_before_it_was_sent_whole_drops_the_rest_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store may refuse a PUT (403, 400) before reading its body and keep the
    connection open without reading on: the rest of the body is dropped and the
    connection aborted at once, not left to drain for as long as the peer keeps it
    (a socket and the body's memory held per failed attempt)."""
    body = b"x" * (64 << 20)  # far more than socket buffers take unread
    lost = asyncio.Event()
    real_lost = s3_wire._Connection.connection_lost

    def connection_lost(conn: s3_wire._Connection, exc: Exception | None) -> None:
        real_lost(conn, exc)
        lost.set()

    monkeypatch.setattr(s3_wire._Connection, "connection_lost", connection_lost)
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            error = b"<Error><Code>AccessDenied</Code></Error>"
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(error), error))
            await writer.drain()
            await release.wait()  # open, reading nothing more, until the test ends
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        async with pool(server.sockets[0].getsockname()[1]) as wire:
            head = b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            with anyio.fail_after(10):
                answer = await wire.exchange([head, body], frozenset({200}))
                assert answer.status == 403
                await lost.wait()
    finally:
        release.set()
        server.close()
        await server.wait_closed()


async def test_a_closed_pool_refuses_requests() -> None:
    async with serving(Script(lambda n: ok(b"x"))) as port, pool(port) as wire:
        wire.close()
        with pytest.raises(WireError, match="closed"):
            await wire.exchange(REQUEST, OK)


async def test_tls_answers_land_whole_and_apart() -> None:
    # Bodies over many TLS records (16 KiB each), each of its own byte, cut into spans.
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    bodies = [bytes([65 + n % 26]) * (200_000 + n) for n in range(6)]
    script = Script(lambda n: ok(bodies[n]))
    async with serving(script, server_tls) as port, pool(port, tls=client_tls) as wire:
        for n, body in enumerate(bodies):
            spans = [(0, 70_000), (100_000, len(body))] if n % 2 else []
            answer = await wire.exchange(REQUEST, OK, spans)
            assert answer.buffers == ([body[a:b] for a, b in spans] or [body])
    assert script.connections == 1


async def test_connection_close_among_other_tokens_ends_the_connection() -> None:
    script = Script(lambda n: ok(b"hi", 200, b"Connection: close, TE\r\n"))
    async with serving(script) as port, pool(port) as wire:
        for _ in range(2):
            assert (await wire.exchange(REQUEST, OK)).buffers == [b"hi"]
    assert script.connections == 2


async def test_an_empty_chunked_error_ends_at_its_last_chunk() -> None:
    script = Script(lambda n: b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n"
                              b"\r\n0\r\n\r\n")
    async with serving(script) as port, pool(port) as wire:
        with anyio.fail_after(5):  # not the read timeout (10 s)
            assert (await wire.exchange(REQUEST, OK)).status == 404


async def test_an_answer_longer_than_the_range_asked_for_is_refused() -> None:
    # A server that ignored the Range header: nothing of its answer is kept.
    script = Script(lambda n: ok(bytes(5_000_000), 200) if n == 0 else ok(b"next"))
    async with serving(script) as port, pool(port) as wire:
        with pytest.raises(WireError, match="an answer of 5000000 bytes to a request for 10"):
            await wire.exchange(REQUEST, OK, [(0, 4), (6, 10)])
        assert (await wire.exchange(REQUEST, OK)).buffers == [b"next"]


@pytest.mark.parametrize("test", [
    test_spans_land_in_buffers_of_their_own_on_one_kept_connection,
    test_a_kept_connection_the_server_closed_is_replaced_once_unseen,
    test_bytes_beyond_the_content_length_end_the_connection,
    test_a_request_cancelled_mid_answer_closes_its_connection,
    test_an_answer_longer_than_the_range_asked_for_is_refused,
    test_tls_answers_land_whole_and_apart,
    test_an_answer_that_stops_coming_times_out,
], ids=lambda t: t.__name__.removeprefix("test_"))
def test_on_uvloop(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The same on uvloop, the broker's loop under uvicorn: its transports and its
    buffered reads are its own (the suite's loop is asyncio's)."""
    uvloop.run(test())
