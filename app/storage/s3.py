"""Asynchronous S3 access through aiobotocore: one client and connection pool per process.

botocore's standard retry mode retries throttling, 5xx and connection errors with
backoff. On top of it, a conditional create that answers 409 (a concurrent conditional
write in flight) is retried here, while 412 (the object exists) is a definite answer.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import SecretStr

from app.errors import ObjectMissing, StorageUnavailable
from app.settings import Settings
from app.storage.metrics import StoreMetrics


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified_ms: int


def _reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Store:
    """put, conditional create, get, range get, list, delete, with counters."""

    def __init__(self, settings: Settings, metrics: StoreMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self.bucket = settings.s3_bucket
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> S3Store:
        s = self._settings
        config = AioConfig(
            max_pool_connections=s.s3_max_pool_connections,
            connect_timeout=min(10.0, s.s3_request_timeout_s),
            read_timeout=s.s3_request_timeout_s,
            retries={"max_attempts": s.s3_max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"},
        )
        self._stack = contextlib.AsyncExitStack()
        session = get_session()
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3",
                endpoint_url=s.s3_endpoint,
                region_name=s.s3_region,
                aws_access_key_id=_reveal(s.s3_access_key),
                aws_secret_access_key=_reveal(s.s3_secret_key),
                config=config,
            )
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._client = None

    def _observe(self, op: str, outcome: str, started: float) -> None:
        self._metrics.s3_requests.labels(op, outcome).inc()
        self._metrics.s3_latency.labels(op).observe(time.monotonic() - started)

    async def put(self, key: str, body: bytes) -> None:
        started = time.monotonic()
        try:
            await self._client.put_object(Bucket=self.bucket, Key=key, Body=body)
        except (ClientError, BotoCoreError) as exc:
            self._observe("put", "error", started)
            raise StorageUnavailable(f"S3 PUT {key} failed: {exc}") from exc
        self._observe("put", "ok", started)
        self._metrics.s3_bytes.labels("out").inc(len(body))

    async def create_if_absent(self, key: str, body: bytes, *, attempts: int = 8) -> bool:
        """PUT with ``If-None-Match: *``: True if created, False if the key already exists."""
        delay = 0.05
        for attempt in range(attempts):
            started = time.monotonic()
            try:
                await self._client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*"
                )
            except ClientError as exc:
                status = _status(exc)
                if status == 412 or _code(exc) == "PreconditionFailed":
                    self._observe("put", "exists", started)
                    return False
                if status == 409 and attempt + 1 < attempts:
                    # ConditionalRequestConflict: another conditional write is in flight.
                    self._observe("put", "conflict", started)
                    await anyio.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 2.0)
                    continue
                self._observe("put", "error", started)
                raise StorageUnavailable(f"S3 conditional PUT {key} failed: {exc}") from exc
            except BotoCoreError as exc:
                self._observe("put", "error", started)
                raise StorageUnavailable(f"S3 conditional PUT {key} failed: {exc}") from exc
            self._observe("put", "ok", started)
            self._metrics.s3_bytes.labels("out").inc(len(body))
            return True
        raise StorageUnavailable(f"S3 conditional PUT {key}: conflicts did not clear")

    async def get(self, key: str) -> bytes:
        return await self._read("get", key, None)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data = await self._read("range_get", key, f"bytes={start}-{start + length - 1}")
        if len(data) != length:
            raise ObjectMissing(
                f"s3://{self.bucket}/{key}: range [{start}, {start + length}) returned "
                f"{len(data)} bytes (object truncated?)"
            )
        return data

    async def _read(self, op: str, key: str, byte_range: str | None) -> bytes:
        started = time.monotonic()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        try:
            resp = await self._client.get_object(**kwargs)
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
        except ClientError as exc:
            code = _code(exc)
            if code in ("NoSuchKey", "404", "NotFound"):
                self._observe(op, "missing", started)
                raise ObjectMissing(f"s3://{self.bucket}/{key} does not exist") from None
            if code == "InvalidRange" or _status(exc) == 416:
                self._observe(op, "missing", started)
                raise ObjectMissing(
                    f"s3://{self.bucket}/{key}: range {byte_range} lies outside the object"
                ) from None
            self._observe(op, "error", started)
            raise StorageUnavailable(f"S3 GET {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            self._observe(op, "error", started)
            raise StorageUnavailable(f"S3 GET {key} failed: {exc}") from exc
        self._observe(op, "ok", started)
        self._metrics.s3_bytes.labels("in").inc(len(data))
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        started = time.monotonic()
        try:
            resp = await self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                self._observe("head", "missing", started)
                return None
            self._observe("head", "error", started)
            raise StorageUnavailable(f"S3 HEAD {key} failed: {exc}") from exc
        except BotoCoreError as exc:
            self._observe("head", "error", started)
            raise StorageUnavailable(f"S3 HEAD {key} failed: {exc}") from exc
        self._observe("head", "ok", started)
        return ObjectInfo(
            key, int(resp["ContentLength"]), int(resp["LastModified"].timestamp() * 1000)
        )

    async def list(self, prefix: str, *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            started = time.monotonic()
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                                      "MaxKeys": page_size}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                resp = await self._client.list_objects_v2(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                self._observe("list", "error", started)
                raise StorageUnavailable(f"S3 LIST {prefix} failed: {exc}") from exc
            self._observe("list", "ok", started)
            for item in resp.get("Contents", []):
                yield ObjectInfo(
                    item["Key"], int(item["Size"]),
                    int(item["LastModified"].timestamp() * 1000),
                )
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")

    async def delete(self, key: str) -> None:
        started = time.monotonic()
        try:
            await self._client.delete_object(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            self._observe("delete", "error", started)
            raise StorageUnavailable(f"S3 DELETE {key} failed: {exc}") from exc
        self._observe("delete", "ok", started)
