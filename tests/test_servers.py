"""The real servers behave as the protocol relies on."""

from __future__ import annotations

import uuid
from typing import Any

import oxia
import pytest
from botocore.exceptions import ClientError

from app.localstack.stack import LocalStack
from app.stores.oxia import patches as oxia_patches


def test_oxia_cas_fails_on_stale_version(oxia_client: Any) -> None:
    key = f"servers/{uuid.uuid4().hex}"
    _, v1 = oxia_client.put(key, b"a", expected_version_id=oxia.EXPECTED_RECORD_DOES_NOT_EXIST)
    _, v2 = oxia_client.put(key, b"b", expected_version_id=v1.version_id())
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        oxia_client.put(key, b"c", expected_version_id=v1.version_id())
    with pytest.raises(oxia.ex.UnexpectedVersionId):
        oxia_client.put(key, b"c", expected_version_id=oxia.EXPECTED_RECORD_DOES_NOT_EXIST)
    _, value, version = oxia_client.get(key)
    assert value == b"b"
    assert version.version_id() == v2.version_id()


def test_oxia_ephemeral_key_disappears_when_its_client_closes(
    stack: LocalStack, oxia_client: Any
) -> None:
    key = f"servers/eph-{uuid.uuid4().hex}"
    owner = oxia_patches.connect(stack.oxia_address, session_timeout_ms=3000,
                                request_timeout_s=10)
    try:
        owner.put(key, b"held", ephemeral=True)
        _, value, version = oxia_client.get(key)
        assert value == b"held"
        assert version.is_ephemeral()
    finally:
        owner.close()
    with pytest.raises(oxia.ex.KeyNotFound):
        oxia_client.get(key)


def test_s3_conditional_create_returns_412_the_second_time(
    stack: LocalStack, s3_client: Any
) -> None:
    key = f"servers/{uuid.uuid4().hex}"
    bucket = stack.config.bucket
    s3_client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as excinfo:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == b"first"
