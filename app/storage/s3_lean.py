"""The data path's S3 requests (GET, ranged GET, PUT), signed and sent without botocore's
request pipeline.

botocore builds every request through its event hooks, parameter validation, endpoint
rules, serialisers and response parsers: about 1.5 ms of CPU for a 4 KiB ranged GET on
the development machine, where signing it and sending it through aiohttp costs about
0.45 ms (0.27 since it is signed by ``app/storage/sigv4.py`` rather than botocore's
signer). A catch-up answer is up to thirty ranged
GETs and a flush one PUT, so the broker sends these three requests itself; everything
else (listing, HEAD, DELETE, conditional creates) still goes through botocore.

It retries as botocore's standard mode does: connection errors, timeouts, 5xx and
throttling answers, up to ``LLOG_S3_MAX_ATTEMPTS`` attempts with jittered exponential
backoff. Any other answer is final and raised as :class:`S3Status`, which the store
translates with botocore's errors (``app/storage/s3.py``).
"""

from __future__ import annotations

import random
import re
import ssl
from urllib.parse import quote, urlsplit

import aiohttp
import anyio
from yarl import URL

from app.settings import S3Settings
from app.storage.sigv4 import SigV4Signer

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException",
                          "RequestTimeout", "RequestTimeTooSkewed", "InternalError"})
_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_MAX_BACKOFF_S = 20.0
_MAX_ERROR_BODY = 64 * 1024
# aiohttp pauses a connection holding twice this much unread: a body is read as it comes
# (the default, 64 KiB, pauses and resumes the socket every few reads of a large body).
_READ_BUFFER = 256 * 1024


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
    """One aiohttp connection pool and a SigV4 signer for one bucket."""

    def __init__(self, s3: S3Settings, *, backoff_s: float = 1.0) -> None:
        assert usable(s3)
        assert s3.s3_endpoint is not None  # for mypy: usable() checked it
        assert s3.s3_access_key is not None and s3.s3_secret_key is not None
        self._base = s3.s3_endpoint.rstrip("/") + "/" + quote(s3.s3_bucket)
        self._attempts = s3.s3_max_attempts
        self._backoff_s = backoff_s  # the first retry waits up to this long, then doubling
        base = urlsplit(self._base)
        self._origin = f"{base.scheme}://{base.netloc}"
        self._base_path = base.path
        self._signer = SigV4Signer(
            s3.s3_access_key.get_secret_value(), s3.s3_secret_key.get_secret_value(),
            s3.s3_region, s3.s3_endpoint, sign_payload=s3.s3_sign_payload)
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=min(10.0, s3.s3_request_timeout_s),
            sock_read=s3.s3_request_timeout_s)
        self._ssl: ssl.SSLContext | bool = True
        if s3.s3_ca_bundle is not None:
            self._ssl = ssl.create_default_context(cafile=str(s3.s3_ca_bundle))
        self._limit = s3.s3_max_pool_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LeanS3:
        connector = aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False,
            read_bufsize=_READ_BUFFER,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _path(self, key: str) -> str:
        return f"{self._base_path}/{quote(key, safe='/~')}"

    async def get(self, key: str, byte_range: str | None) -> list[bytes]:
        """The body as it was received, in pieces: joining them is the caller's choice
        (one object of many parts is better cut once, part by part)."""
        headers = {"Range": byte_range} if byte_range is not None else {}
        return await self._send("GET", key, headers, None, (200, 206))

    async def put(self, key: str, body: bytes, checksum: str | None) -> None:
        headers = {}
        if checksum is not None:
            headers["x-amz-checksum-crc32c"] = checksum
        await self._send("PUT", key, headers, body, (200,))

    async def _send(self, method: str, key: str, headers: dict[str, str],
                    body: bytes | None, ok: tuple[int, ...]) -> list[bytes]:
        """One request, retried as botocore's standard mode retries."""
        path = self._path(key)
        for attempt in range(1, self._attempts + 1):
            try:
                return await self._once(method, path, headers, body, ok)
            except S3Status as exc:
                retryable = exc.status in _RETRY_STATUS or exc.code in _RETRY_CODES
                if not retryable or attempt == self._attempts:
                    raise
            # A body cut short (ClientPayloadError) is read again, as a refused connection.
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
                if attempt == self._attempts:
                    raise
            await anyio.sleep(min(random.random() * self._backoff_s * 2 ** (attempt - 1),
                                   _MAX_BACKOFF_S))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _once(self, method: str, path: str, headers: dict[str, str],
                    body: bytes | None, ok: tuple[int, ...]) -> list[bytes]:
        if self._session is None:
            raise aiohttp.ClientConnectionError("the S3 session is closed")
        # Signed per attempt: the signature carries the time.
        signed = self._signer.headers(method, path, headers, body)
        async with self._session.request(method, URL(self._origin + path, encoded=True),
                                         headers=signed, data=body) as response:
            if response.status in ok:
                return await _pieces(response)
            raw = await response.content.read(_MAX_ERROR_BODY)
            match = _CODE.search(raw)
            code = match.group(1).decode("utf-8", "replace") if match else ""
            raise S3Status(response.status, code or str(response.status),
                           f"HTTP {response.status} {code}".strip())


async def _pieces(response: aiohttp.ClientResponse) -> list[bytes]:
    """The whole body, in the pieces it came in. (``read()`` joins what is buffered at
    each wake-up, then joins those joins: two copies of every byte of a megabytes-long
    answer, where its caller joins or cuts the pieces once.)"""
    pieces: list[bytes] = []
    while True:
        piece, end_of_http_chunk = await response.content.readchunk()
        if piece:
            pieces.append(piece)
        elif not end_of_http_chunk:  # (b"", False) is the end of the body
            break
    return pieces
