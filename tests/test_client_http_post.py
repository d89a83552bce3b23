"""The producer's own HTTP/1.1 connections (llog_client._http_post) against a scripted
server that answers well, oddly or not at all: what reaches the server, how each kind of
answer is read, when a connection is kept, and how each failure is told apart (the
request cannot have arrived, or may have). The producer's requests to real brokers go
this way too (tests/test_client_producer.py)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import pytest

from llog_client._http_post import MAX_ANSWER, Answer, NotSent, PostFailed, PostPool
from tests.helpers.raw_http import RawRequest, read_request

pytestmark = pytest.mark.timeout(30)

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


@dataclass
class Server:
    """Each connection runs ``script(server, conn, number)``; ``requests`` holds what
    came, in order."""

    script: Callable[[Server, socket.socket, int], None]
    requests: list[RawRequest] = field(default_factory=list)
    connections: int = 0
    closed: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def read(self, conn: socket.socket) -> RawRequest | None:
        request = read_request(conn)
        if request is not None:
            self.requests.append(request)
        return request


@contextmanager
def serving(script: Callable[[Server, socket.socket, int], None]) -> Iterator[Server]:
    listener = socket.create_server(("127.0.0.1", 0))
    server = Server(script, url=f"http://127.0.0.1:{listener.getsockname()[1]}/produce")
    stop = threading.Event()

    listener.settimeout(0.1)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server.connections += 1
            number = server.connections
            threading.Thread(target=run, args=(conn, number), daemon=True).start()

    def run(conn: socket.socket, number: int) -> None:
        with conn, contextlib.suppress(OSError):
            script(server, conn, number)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def answer_each(answer: bytes) -> Callable[[Server, socket.socket, int], None]:
    def script(server: Server, conn: socket.socket, _n: int) -> None:
        while server.read(conn) is not None:
            conn.sendall(answer)
    return script


def post(pool: PostPool, url: str, body: bytes = b"records", read_s: float = 5.0,
         headers: dict[str, str] | None = None) -> Answer:
    async def go() -> Answer:
        return await pool.post(url, body, headers or {"content-type": "x/y"},
                               connect_s=5.0, read_s=read_s)
    return anyio.run(go)


def test_a_post_arrives_whole_and_the_connection_is_kept() -> None:
    body = bytes(range(256)) * 40_000  # 10 MiB: more than a socket takes at once
    with serving(answer_each(OK)) as server:
        pool = PostPool({"authorization": "Bearer t", "accept-encoding": "zstd"})
        for _ in range(3):
            answer = post(pool, server.url, body)
            assert answer.status == 200 and answer.body == b'{"ok":true}'
            assert answer.headers["content-type"] == "application/json"
        pool.close()
    assert server.connections == 1
    first = server.requests[0]
    assert first.line == "POST /produce HTTP/1.1"
    assert hashlib.sha256(first.body).digest() == hashlib.sha256(body).digest()
    assert first.headers["authorization"] == "Bearer t"
    assert first.headers["content-type"] == "x/y"
    assert "accept-encoding" not in first.headers  # answers come as they are
    assert first.headers["host"] == server.url.split("/")[2]


def test_a_connection_the_broker_closed_is_not_posted_on() -> None:
    """A broker lets an idle kept-alive connection go: the next request takes a new
    one instead of failing on the old."""
    def script(server: Server, conn: socket.socket, _n: int) -> None:
        if server.read(conn) is not None:
            conn.sendall(OK)
        conn.shutdown(socket.SHUT_RDWR)
        server.closed.set()

    with serving(script) as server:
        pool = PostPool({})
        assert post(pool, server.url).status == 200
        assert server.closed.wait(5)
        assert post(pool, server.url).status == 200
    assert server.connections == 2


@pytest.mark.parametrize("answer,body", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
     b"4;x=y\r\n{\"ok\r\n7\r\n\":true}\r\n0\r\ntrailer: t\r\n\r\n", b'{"ok":true}'),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", b"{}"),
    (b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\nretry-after: 1\r\n\r\n{}",
     b"{}"),
    (b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n", b""),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b""),  # no length: none to read
    (b"HTTP/1.1 100 Continue\r\n\r\n" + OK, b'{"ok":true}'),  # interim, skipped
], ids=["chunked-trailers", "chunked", "error", "empty", "empty-no-length", "continue"])
def test_answers_of_each_framing_are_read_and_the_connection_kept(answer: bytes,
                                                                  body: bytes) -> None:
    with serving(answer_each(answer)) as server:
        pool = PostPool({})
        for _ in range(2):
            got = post(pool, server.url)
            assert got.body == body
    assert server.connections == 1


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
], ids=["connection-close", "http-1.0"])
def test_a_connection_the_answer_closes_is_not_kept(answer: bytes) -> None:
    with serving(answer_each(answer)) as server:
        pool = PostPool({})
        for _ in range(2):
            assert post(pool, server.url).body == b"{}"
    assert server.connections == 2


def test_an_answer_without_a_length_is_read_to_its_end() -> None:
    def script(server: Server, conn: socket.socket, _n: int) -> None:
        if server.read(conn) is not None:
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n{\"ok\":")
            conn.sendall(b"true}")
    with serving(script) as server:
        pool = PostPool({})
        assert post(pool, server.url).body == b'{"ok":true}'
        assert post(pool, server.url).body == b'{"ok":true}'
    assert server.connections == 2


def test_nothing_listening_is_not_sent() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(NotSent):
        post(PostPool({}), f"http://127.0.0.1:{port}/produce")


def test_a_request_without_an_answer_may_have_been_sent() -> None:
    def script(server: Server, conn: socket.socket, _n: int) -> None:
        server.read(conn)  # read whole, then gone without a word

    with serving(script) as server, pytest.raises(PostFailed) as failed:
        post(PostPool({}), server.url)
    assert not isinstance(failed.value, NotSent)
    assert len(server.requests) == 1


def test_an_answer_that_never_comes_times_out() -> None:
    gone = threading.Event()

    def script(server: Server, conn: socket.socket, _n: int) -> None:
        server.read(conn)
        gone.wait(10)

    with serving(script) as server:
        pool = PostPool({})
        with pytest.raises(PostFailed) as failed:
            post(pool, server.url, read_s=0.3)
        gone.set()
    assert not isinstance(failed.value, NotSent)
    assert isinstance(failed.value.__cause__, TimeoutError)


@pytest.mark.parametrize("answer", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 1e3\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (MAX_ANSWER + 1),
    b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"a" * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffff\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # then the connection ends
], ids=["not-http", "bad-status", "negative-length", "odd-length", "no-colon",
        "too-large", "head-too-large", "bad-chunk", "huge-chunk", "cut-body"])
def test_answers_it_cannot_read_fail_the_request_and_drop_the_connection(answer: bytes
                                                                          ) -> None:
    def script(server: Server, conn: socket.socket, n: int) -> None:
        if server.read(conn) is None:
            return
        if n == 1:
            conn.sendall(answer)
            return
        conn.sendall(OK)
        while server.read(conn) is not None:
            conn.sendall(OK)

    with serving(script) as server:
        pool = PostPool({})
        with pytest.raises(PostFailed) as failed:
            post(pool, server.url)
        assert not isinstance(failed.value, NotSent)
        assert post(pool, server.url).status == 200  # on a new connection
    assert server.connections == 2


def test_a_cancelled_post_leaves_no_connection_behind() -> None:
    """Cancelled while the body is half written: that connection is closed, never
    posted on again (the broker would read the next request as the rest of a body)."""
    hold = threading.Event()

    def script(server: Server, conn: socket.socket, n: int) -> None:
        if n == 1:
            hold.wait(10)  # reads nothing: the client's writes fill the socket
            return
        while server.read(conn) is not None:
            conn.sendall(OK)

    with serving(script) as server:
        pool = PostPool({})

        async def cancelled() -> bool:
            with anyio.move_on_after(0.3) as scope:
                await pool.post(server.url, b"x" * (64 << 20), {}, connect_s=5, read_s=30)
            return scope.cancelled_caught

        assert anyio.run(cancelled)
        hold.set()
        assert post(pool, server.url).status == 200
    assert server.connections == 2


def test_a_closed_pool_opens_no_connection() -> None:
    with serving(answer_each(OK)) as server:
        pool = PostPool({})
        assert post(pool, server.url).status == 200
        pool.close()
        with pytest.raises(NotSent):
            post(pool, server.url)
    assert server.connections == 1


def test_an_answer_before_the_whole_body_is_the_outcome() -> None:
    """A broker may refuse a request from its head (413) and close without reading the
    body: the write breaks, but the answer came and is what the request got."""
    def script(server: Server, conn: socket.socket, _n: int) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 413 Content Too Large\r\nconnection: close\r\n"
                     b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        conn.shutdown(socket.SHUT_WR)
        threading.Event().wait(0.05)  # then gone, the body unread: the client's write fails

    with serving(script) as server:
        answer = post(PostPool({}), server.url, b"x" * (64 << 20))
    assert answer.status == 413 and answer.body == b"{}"


def test_a_proxy_of_the_environment_is_left_to_httpx(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert PostPool({}).handles("http://broker:9000/produce")
    assert not PostPool({}).handles("https://broker:9000/produce")
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    assert not PostPool({}).handles("http://broker:9000/produce")
    monkeypatch.setenv("no_proxy", "broker,other")
    assert PostPool({}).handles("http://broker:9000/produce")
    assert not PostPool({}).handles("http://elsewhere:9000/produce")


def test_a_header_that_would_break_the_head_is_refused() -> None:
    with pytest.raises(ValueError):
        PostPool({"authorization": "Bearer t\r\nx-evil: 1"})
    with serving(answer_each(OK)) as server:
        with pytest.raises(NotSent):
            post(PostPool({}), server.url, headers={"x-a": "1\r\n\r\nGET / HTTP/1.1"})
        with pytest.raises(NotSent):
            post(PostPool({}), server.url, headers={"x-a": "caf\u00e9\u2603"})
    assert server.connections == 0
