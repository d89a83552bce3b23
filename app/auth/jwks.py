"""The issuer's public keys (a JWKS document, RFC 7517), from a file or a URL.

Fetched without blocking the event loop (a file through a worker thread, a URL with
httpx), limited in size and time, and kept until a fetch brings a good replacement: a
failed fetch keeps the keys held. Only asymmetric keys are kept: a symmetric (``oct``)
key would let anyone holding it mint tokens, and it never belongs in a public key set.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
from jwt import PyJWK
from jwt.exceptions import PyJWKError

log = logging.getLogger(__name__)


class JwksError(Exception):
    """The key set could not be fetched or holds no usable key."""


async def fetch_document(file: Path | None, url: str | None, timeout_s: float,
                         max_bytes: int) -> Mapping[str, Any]:
    """The JWKS document as JSON, from ``file`` or ``url``; one larger than
    ``max_bytes`` (LLOG_AUTH_JWKS_MAX_BYTES) is refused rather than parsed."""
    if file is not None:
        try:
            data = await anyio.to_thread.run_sync(_read_file, file, max_bytes)
        except OSError as exc:
            raise JwksError(f"cannot read {file}: {exc.strerror or exc}") from None
        where = str(file)
    else:
        assert url is not None
        data = await _download(url, timeout_s, max_bytes)
        where = url
    try:
        doc = json.loads(data)
    except ValueError:
        raise JwksError(f"{where} is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise JwksError(f"{where} is not a JWKS document (no \"keys\" list)")
    return doc


def _read_file(path: Path, max_bytes: int) -> bytes:
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"larger than {max_bytes} bytes")
    return data


async def _download(url: str, timeout_s: float, max_bytes: int) -> bytes:
    try:
        with anyio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=timeout_s) as client, client.stream(
                    "GET", url, headers={"accept": "application/json"}) as response:
                if response.status_code != 200:
                    raise JwksError(f"{url} answered {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise JwksError(f"{url} sent more than {max_bytes} bytes")
                return bytes(body)
    except TimeoutError:
        raise JwksError(f"{url} did not answer within {timeout_s} s") from None
    except httpx.HTTPError as exc:
        raise JwksError(f"cannot fetch {url}: {type(exc).__name__}: {exc}") from None


def signing_keys(doc: Mapping[str, Any], algorithms: tuple[str, ...]
                 ) -> dict[str | None, PyJWK]:
    """The document's usable signing keys by key id (None for a key without one)."""
    keys: dict[str | None, PyJWK] = {}
    for raw in doc["keys"]:
        if not isinstance(raw, dict) or raw.get("kty") == "oct" or raw.get("use") == "enc":
            continue
        try:
            key = PyJWK(raw)
        except PyJWKError as exc:
            log.warning("JWKS: skipping key %r: %s", raw.get("kid"), exc)
            continue
        if key.algorithm_name not in algorithms:
            continue
        kid = raw.get("kid")
        keys[kid if isinstance(kid, str) else None] = key
    if not keys:
        raise JwksError("the key set holds no signing key for the accepted algorithms ("
                        + ", ".join(algorithms) + ")")
    return keys
