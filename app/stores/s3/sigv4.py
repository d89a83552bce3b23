"""AWS Signature Version 4 for the lean S3 path's requests (``app/stores/s3/lean.py``).

This signs the only requests that path sends, a GET or a PUT of one object by its path
(no query string), with the same result byte for byte as botocore's ``S3SigV4Auth``
(``tests/test_sigv4.py`` checks it against botocore), and keeps the signing key of the
day: one HMAC and one SHA-256 of the canonical request per request, where botocore's
signer builds an ``AWSRequest``, splits its URL again, sorts its headers through
``HTTPHeaders`` and derives the key with four HMACs every time. What that saves per
request, measured: the docstring of ``app/stores/s3/store.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from app.stores.s3.body import Body, body_parts

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_ALGORITHM = "AWS4-HMAC-SHA256"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_of(url: str) -> str:
    """The Host a request to ``url`` signs: lower case, the port unless the scheme's
    default, an IPv6 address in brackets."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


class SigV4Signer:
    """Signs requests to one endpoint with one set of static keys."""

    def __init__(self, access_key: str, secret_key: str, region: str, endpoint: str, *,
                 sign_payload: bool, service: str = "s3",
                 clock: Callable[[], float] = time.time) -> None:
        self._access_key = access_key
        self._secret = f"AWS4{secret_key}".encode()
        self._region = region
        self._service = service
        self._host = host_of(endpoint)
        self._sign_payload = sign_payload
        self._clock = clock
        self._day = ""
        self._key = b""

    @property
    def host(self) -> str:
        """The Host header every request it signs must carry."""
        return self._host

    def headers(self, method: str, path: str, headers: Mapping[str, str],
                body: Body | None) -> dict[str, str]:
        """``headers`` and those that sign the request: ``X-Amz-Date``,
        ``X-Amz-Content-SHA256`` and ``Authorization``. ``path`` is the URL's path as
        sent (already quoted); S3 signs it as it is."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        return self.headers_at(stamp, method, path, headers, body)

    def headers_at(self, stamp: str, method: str, path: str, headers: Mapping[str, str],
                   body: Body | None) -> dict[str, str]:
        """As :meth:`headers`, at the time ``stamp`` (``YYYYMMDDTHHMMSSZ``)."""
        if not self._sign_payload:
            payload = UNSIGNED_PAYLOAD
        elif body is None:
            payload = EMPTY_SHA256
        else:  # its parts hashed in order, without joining them
            digest = hashlib.sha256()
            for part in body_parts(body):
                digest.update(part)
            payload = digest.hexdigest()
        out = dict(headers)
        out["X-Amz-Date"] = stamp
        out["X-Amz-Content-SHA256"] = payload
        signed = {name.lower(): " ".join(value.split()) for name, value in out.items()}
        signed["host"] = self._host
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join((
            method, path, "",  # no query string
            "".join(f"{name}:{signed[name]}\n" for name in names),
            signed_names, payload))
        day = stamp[:8]
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        to_sign = "\n".join((_ALGORITHM, stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()))
        signature = hmac.new(self._signing_key(day), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        out["Authorization"] = (f"{_ALGORITHM} Credential={self._access_key}/{scope}, "
                                f"SignedHeaders={signed_names}, Signature={signature}")
        return out

    def _signing_key(self, day: str) -> bytes:
        if day != self._day:  # derived once a day, as the scope changes
            key = self._secret
            for part in (day, self._region, self._service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._day, self._key = day, key
        return self._key
