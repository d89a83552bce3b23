"""The data path's S3 requests (GET, ranged GET, PUT), signed and sent without botocore's
request pipeline.

The broker sends these three requests itself (why, with the measured figures: the
docstring of ``app/stores/s3/store.py``); everything else (listing, HEAD, DELETE,
conditional creates) still goes through botocore. Requests are signed by
``app/stores/s3/sigv4.py`` and sent over ``app/stores/s3/wire.py``, which reads a GET's
body straight into the buffers that keep it and writes a PUT's body from its parts (two
pools, GETs and uploads, each of up to ``LLOG_S3_MAX_POOL_CONNECTIONS``).

It retries as botocore's standard mode does: connection errors, timeouts, 5xx and
throttling answers, up to ``LLOG_S3_MAX_ATTEMPTS`` attempts with jittered exponential
backoff. Any other answer is final and raised as :class:`S3Status`, which the store
translates with botocore's errors (``app/stores/s3/store.py``).
"""

from __future__ import annotations

import random
import re
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import anyio

from app.settings import S3Settings
from app.stores.s3.body import Body, body_parts, body_size
from app.stores.s3.sigv4 import SigV4Signer
from app.stores.s3.wire import Answer, WireError, WirePool

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException",
                          "RequestTimeout", "RequestTimeTooSkewed", "InternalError"})
_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_MAX_BACKOFF_S = 20.0
_GET_OK = frozenset({200, 206})
_PUT_OK = frozenset({200})
_T = TypeVar("_T")


class S3Status(Exception):
    """A final answer other than success: its status and the error code of its body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def usable(s3: S3Settings) -> bool:
    """Whether the lean path can serve this configuration: it needs an explicit
    endpoint and static keys (any other credentials come through botocore's chain)."""
    return (s3.s3_lean_requests and s3.s3_endpoint is not None
            and s3.s3_access_key is not None and s3.s3_secret_key is not None)


class LeanS3:
    """Two pools of the broker's own S3 connections (GETs, uploads) and a SigV4 signer
    for one bucket."""

    def __init__(self, s3: S3Settings, *, backoff_s: float = 1.0) -> None:
        assert usable(s3)
        assert s3.s3_endpoint is not None  # for mypy: usable() checked it
        assert s3.s3_access_key is not None and s3.s3_secret_key is not None
        base = urlsplit(s3.s3_endpoint.rstrip("/") + "/" + quote(s3.s3_bucket))
        self._attempts = s3.s3_max_attempts
        self._backoff_s = backoff_s  # the first retry waits up to this long, then doubling
        self._base_path = base.path
        self._scheme, self._host_port = base.scheme, (base.hostname or "", base.port)
        self._signer = SigV4Signer(
            s3.s3_access_key.get_secret_value(), s3.s3_secret_key.get_secret_value(),
            s3.s3_region, s3.s3_endpoint, sign_payload=s3.s3_sign_payload)
        self._ca_bundle = s3.s3_ca_bundle
        self._limit = s3.s3_max_pool_connections
        self._connect_timeout_s = min(10.0, s3.s3_request_timeout_s)
        self._request_timeout_s = s3.s3_request_timeout_s
        self._gets: WirePool | None = None
        self._puts: WirePool | None = None  # uploads: a flush never waits behind reads

    async def __aenter__(self) -> LeanS3:
        host, port = self._host_port
        context: ssl.SSLContext | None = None
        if self._scheme == "https":  # a CA bundle means nothing to a plain endpoint
            context = (ssl.create_default_context() if self._ca_bundle is None
                       else ssl.create_default_context(cafile=str(self._ca_bundle)))
        # As aiohttp's sock_read: the request timeout bounds each wait for progress (a
        # byte of the request taken or of the answer read), not a long body as a whole.
        self._gets, self._puts = (
            WirePool(host, port or (443 if context else 80), ssl_context=context,
                     limit=self._limit, connect_timeout_s=self._connect_timeout_s,
                     read_timeout_s=self._request_timeout_s) for _ in range(2))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for pool in (self._gets, self._puts):
            if pool is not None:
                pool.close()
        self._gets = self._puts = None

    def _path(self, key: str) -> str:
        return f"{self._base_path}/{quote(key, safe='/~')}"

    async def get(self, key: str, byte_range: str | None) -> bytearray:
        """The body (of the range, when given)."""
        answer = await self._retrying(self._get_once, self._path(key), byte_range, ())
        return answer.buffers[0]

    async def get_cut(self, key: str, start: int, spans: Sequence[tuple[int, int]]
                      ) -> tuple[list[bytearray], int]:
        """Bytes ``start`` up to the end of the last span, read into one buffer per
        span (``(offset, end)`` from ``start``, in order, not overlapping), and the
        length of the body. A body shorter than the spans (the object ends before
        them) comes back whole in one buffer."""
        length = spans[-1][1]
        answer = await self._retrying(self._get_once, self._path(key),
                                      f"bytes={start}-{start + length - 1}", spans)
        return answer.buffers, answer.length

    async def put(self, key: str, body: Body, checksum: str | None) -> None:
        """Store ``body`` (its bytes, or its parts in order) at ``key``, with the
        CRC32C the store verifies when given."""
        headers = {"Content-Length": str(body_size(body))}
        if checksum is not None:
            headers["x-amz-checksum-crc32c"] = checksum
        await self._retrying(self._put_once, self._path(key), headers, body)

    async def _retrying(self, once: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """One request, retried as botocore's standard mode retries."""
        for attempt in range(1, self._attempts + 1):
            try:
                return await once(*args)
            except S3Status as exc:
                retryable = exc.status in _RETRY_STATUS or exc.code in _RETRY_CODES
                if not retryable or attempt == self._attempts:
                    raise
            # A body cut short is read again, and a request sent again, as a refused
            # connection is (a WireError and a refused connection are OSErrors).
            except (OSError, TimeoutError):
                if attempt == self._attempts:
                    raise
            await anyio.sleep(min(random.random() * self._backoff_s * 2 ** (attempt - 1),
                                   _MAX_BACKOFF_S))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _head(self, method: str, path: str, headers: dict[str, str],
              body: Body | None) -> bytes:
        # Signed per attempt: the signature carries the time.
        signed = self._signer.headers(method, path, headers, body)
        lines = "".join(f"{name}: {value}\r\n" for name, value in signed.items())
        return (f"{method} {path} HTTP/1.1\r\nHost: {self._signer.host}\r\n{lines}\r\n"
                ).encode("latin-1")

    async def _get_once(self, path: str, byte_range: str | None,
                        spans: Sequence[tuple[int, int]]) -> Answer:
        if self._gets is None:
            raise WireError("the S3 session is closed")
        headers = {"Range": byte_range} if byte_range is not None else {}
        answer = await self._gets.exchange(self._head("GET", path, headers, None),
                                           _GET_OK, spans)
        if answer.status not in _GET_OK:
            raise _status_error(answer.status, bytes(answer.buffers[0]))
        return answer

    async def _put_once(self, path: str, headers: dict[str, str], body: Body) -> None:
        # No Expect: 100-continue: the body goes at once, after its head, so a store or
        # proxy that never sends a 100 cannot hold the flush (and the flush slots
        # behind it); one that refuses the request early answers before reading it.
        if self._puts is None:
            raise WireError("the S3 session is closed")
        head = self._head("PUT", path, headers, body)
        answer = await self._puts.exchange([head, *body_parts(body)], _PUT_OK)
        if answer.status not in _PUT_OK:
            raise _status_error(answer.status, bytes(answer.buffers[0]))


def _status_error(status: int, body: bytes) -> S3Status:
    """The final (or retried) answer other than success, with the code of its body."""
    match = _CODE.search(body)
    code = match.group(1).decode("utf-8", "replace") if match else ""
    return S3Status(status, code or str(status), f"HTTP {status} {code}".strip())
