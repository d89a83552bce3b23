"""The lean path's SigV4 signer signs as botocore's ``S3SigV4Auth`` does, byte for byte:
the same headers for the same request at the same second, whatever the endpoint, the
key, the headers and the payload choice; and it derives its signing key again when the
day changes."""

from __future__ import annotations

import calendar
import datetime
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from app.stores.s3.sigv4 import SigV4Signer, host_of

ACCESS, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"


def _botocore(method: str, url: str, headers: dict[str, str], body: bytes | None,
              region: str, sign_payload: bool) -> dict[str, str]:
    request = AWSRequest(method, url, headers=headers, data=body)
    request.context["client_config"] = Config(s3={"payload_signing_enabled": sign_payload})
    S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", region).add_auth(request)
    return dict(request.headers.items())


def _ours(method: str, url: str, headers: dict[str, str], body: bytes | None,
          region: str, sign_payload: bool, stamp: str) -> dict[str, str]:
    parts = urlsplit(url)
    endpoint = f"{parts.scheme}://{parts.netloc}"
    signer = SigV4Signer(ACCESS, SECRET, region, endpoint, sign_payload=sign_payload)
    return signer.headers_at(stamp, method, parts.path, headers, body)


@pytest.mark.parametrize("endpoint", [
    "http://127.0.0.1:9000", "https://s3.example.com", "http://S3.Example.com:80",
    "https://minio.local:8443", "http://[::1]:9000", "https://[2001:db8::1]"])
@pytest.mark.parametrize("sign_payload", [False, True])
@pytest.mark.parametrize(("method", "headers", "body"), [
    ("GET", {}, None),
    ("GET", {"Range": "bytes=0-4194303"}, None),
    ("PUT", {"x-amz-checksum-crc32c": "yZRlqg=="}, b"a WAL object" * 1000),
    ("PUT", {}, b""),
    ("GET", {"Range": "  bytes=12-  34 "}, None),  # values are trimmed as SigV4 says
])
def test_signs_as_botocore_does(endpoint: str, sign_payload: bool, method: str,
                                headers: dict[str, str], body: bytes | None) -> None:
    for key in ("wal/0001/0000000000000042.wal", "t/é ü/a+b=c&d~e", "p/!*'()[];:@$,"):
        url = f"{endpoint}/{quote('my-bucket')}/{quote(key, safe='/~')}"
        expected = _botocore(method, url, dict(headers), body, "eu-west-3", sign_payload)
        got = _ours(method, url, dict(headers), body, "eu-west-3", sign_payload,
                    expected["X-Amz-Date"])
        assert got == expected


def test_a_path_under_the_endpoint_is_signed_as_sent() -> None:
    url = "http://gateway.local:8080/s3/bucket/k/0001"
    expected = _botocore("GET", url, {"Range": "bytes=1-2"}, None, "us-east-1", False)
    signer = SigV4Signer(ACCESS, SECRET, "us-east-1", "http://gateway.local:8080/s3",
                         sign_payload=False)
    assert signer.headers_at(expected["X-Amz-Date"], "GET", "/s3/bucket/k/0001",
                             {"Range": "bytes=1-2"}, None) == expected


def test_the_signing_key_follows_the_day(monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.auth

    now = [calendar.timegm((2026, 11, 28, 23, 59, 59, 0, 0, 0))]
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: (
        datetime.datetime.fromtimestamp(now[0], datetime.UTC).replace(tzinfo=None)))
    signer = SigV4Signer(ACCESS, SECRET, "us-east-1", "http://127.0.0.1:9000",
                         sign_payload=False, clock=lambda: now[0])
    days = []
    for _ in range(2):  # the second before midnight, then the one after it
        got = signer.headers("GET", "/b/k", {}, None)
        assert got == _botocore("GET", "http://127.0.0.1:9000/b/k", {}, None,
                                "us-east-1", False)
        days.append(got["X-Amz-Date"][:8])
        now[0] += 1
    assert days == ["20261128", "20261129"]


def test_the_host_is_signed_as_botocore_derives_it() -> None:
    assert host_of("http://127.0.0.1:9000") == "127.0.0.1:9000"
    assert host_of("https://S3.Example.com:443") == "s3.example.com"
    assert host_of("http://[::1]:80") == "[::1]"
    assert host_of("https://[2001:db8::1]:9443") == "[2001:db8::1]:9443"
