"""Uploads carry their CRC32C for the store to verify, signed or unsigned, on the real
MinIO: what the store keeps is what was sent, and a body that does not match the
checksum it came with is refused and not stored."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import crc32c
import pytest

from app.errors import LlogError
from app.localstack.stack import LocalStack
from app.stores.metrics import StoreMetrics
from app.stores.s3.body import Body
from app.stores.s3.store import S3Store
from tests.helpers.stack import make_settings


async def _stored_checksum(s3: S3Store, key: str) -> str | None:
    head: dict[str, Any] = await s3._client.head_object(
        Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
    found: str | None = head.get("ChecksumCRC32C")
    return found


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "botocore"])
@pytest.mark.parametrize("sign_payload", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("in_parts", [False, True], ids=["bytes", "parts"])
async def test_uploads_carry_their_crc32c(stack: LocalStack, sign_payload: bool,
                                          lean: bool, in_parts: bool) -> None:
    body = uuid.uuid4().bytes * 40_000
    expected = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
    # A WAL object is put as its parts (a head, then views into request bodies).
    sent: Body = ([body[:7], memoryview(body)[7:300_000], bytearray(body[300_000:300_001]),
                   memoryview(body)[300_001:]] if in_parts else body)
    settings = make_settings(stack, s3_sign_payload=sign_payload, s3_lean_requests=lean)
    metrics = StoreMetrics()
    async with S3Store(settings, metrics) as s3:
        key, created = f"t/{uuid.uuid4().hex}", f"t/{uuid.uuid4().hex}"
        await s3.put(key, sent)
        assert await s3.create_if_absent(created, body)
        assert await s3.get(key) == body
        assert await _stored_checksum(s3, key) == expected
        assert await _stored_checksum(s3, created) == expected
    assert metrics.registry.get_sample_value(
        "llog_s3_bytes_total", {"direction": "out"}) == 2 * len(body)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "botocore"])
async def test_a_body_that_does_not_match_its_checksum_is_refused(stack: LocalStack,
                                                                 lean: bool) -> None:
    settings = make_settings(stack, s3_max_attempts=1, s3_lean_requests=lean)
    async with S3Store(settings, StoreMetrics()) as s3:
        key = f"t/{uuid.uuid4().hex}"
        real = s3._crc32c
        s3._crc32c = lambda body: real(  # type: ignore[method-assign]
            body + b"!" if isinstance(body, bytes) else [*body, b"!"])
        with pytest.raises(LlogError):
            await s3.put(key, [b"the body ", memoryview(b"as sent")])
        assert await s3.head(key) is None


async def test_without_the_checksum_uploads_still_work(stack: LocalStack) -> None:
    settings = make_settings(stack, s3_put_checksum=False)
    async with S3Store(settings, StoreMetrics()) as s3:
        key = f"t/{uuid.uuid4().hex}"
        await s3.put(key, b"plain")
        assert await s3.get(key) == b"plain"
        assert await _stored_checksum(s3, key) is None
