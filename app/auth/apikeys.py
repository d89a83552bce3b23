"""Static API keys: minted at random, stored only as hashes, checked in constant time.

A key is ``llog_<key id>_<secret>``: 48 random bits of key id (public: it finds the
entry and names the key in logs) and 256 random bits of secret. The auth file keeps
``sha256:<key id>:<hex SHA-256 of the whole key>``.

Why a plain SHA-256 and not a slow hash (scrypt, argon2): slow hashes protect *guessable*
secrets such as passwords, whose hashes can be searched by brute force. A 256-bit random
secret cannot be searched whatever the hash, so a slow hash would add nothing but tens
of milliseconds of CPU to every request (a way to overload the broker with bad keys).
The digest is compared with :func:`hmac.compare_digest`, so the time taken does not say
how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

TOKEN_PREFIX = "llog_"
_TOKEN = re.compile(r"llog_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
_STORED = re.compile(r"sha256:([0-9a-f]{12}):([0-9a-f]{64})")


@dataclass(frozen=True)
class StoredKey:
    key_id: str
    digest: bytes

    @classmethod
    def parse(cls, text: str) -> StoredKey:
        match = _STORED.fullmatch(text)
        if match is None:
            raise ValueError("expected sha256:<12 hex key id>:<64 hex digest> "
                             "(as printed by `llog auth new-key`)")
        return cls(match[1], bytes.fromhex(match[2]))

    def __str__(self) -> str:
        return f"sha256:{self.key_id}:{self.digest.hex()}"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def mint() -> tuple[str, StoredKey]:
    """A new key, and what the auth file keeps of it."""
    key_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return token, StoredKey(key_id, _digest(token))


def key_id_of(token: str) -> str | None:
    """The key id of a well-formed API key, else None."""
    match = _TOKEN.fullmatch(token)
    return match[1] if match else None


class KeyRing:
    """Key id -> (principal, stored key), for the keys of the auth file."""

    def __init__(self, keys: Iterable[tuple[str, StoredKey]]) -> None:
        self._by_id: dict[str, tuple[str, StoredKey]] = {}
        for principal, key in keys:
            if key.key_id in self._by_id:
                raise ValueError(f"key id {key.key_id} appears twice")
            self._by_id[key.key_id] = (principal, key)

    def __len__(self) -> int:
        return len(self._by_id)

    def owner(self, key_id: str) -> str | None:
        """The principal that holds the key with id ``key_id``, or None."""
        found = self._by_id.get(key_id)
        return found[0] if found is not None else None

    def principal(self, token: str) -> str | None:
        """The principal whose key ``token`` is, or None."""
        key_id = key_id_of(token)
        found = self._by_id.get(key_id) if key_id is not None else None
        if found is None:
            return None
        principal, stored = found
        return principal if hmac.compare_digest(_digest(token), stored.digest) else None
