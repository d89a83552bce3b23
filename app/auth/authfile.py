"""The auth file (``LLOG_AUTH_FILE``, TOML): principals, their API keys, rights and
quotas. Strict: an unknown field, a malformed key hash or pattern refuses the whole file
(a typo in security settings must not pass unnoticed)::

    [default]                   # any principal not named below (JWT subjects)
    consume = ["public.*"]
    quota = { requests_per_s = 50, produce_bytes_per_s = 1048576 }

    [principals.orders-service]
    keys = ["sha256:3f2a9c1e04b7:…"]       # printed by `llog auth new-key`
    produce = ["orders", "orders-retry.*"]
    consume = ["orders"]
    group = ["billing-*"]
    admin = []
    quota = { requests_per_s = 500, produce_bytes_per_s = 10485760, burst_s = 2 }
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from app.auth.apikeys import KeyRing, StoredKey
from app.auth.quotas import Quota
from app.auth.rights import Acl, Right

Pattern = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[!-)+-~]*\*?$",
                               description="a name, or a prefix ending in *")]
PrincipalName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[!-~]+$")]
Rate = Annotated[StrictInt | StrictFloat, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuotaSpec(_Strict):
    requests_per_s: Rate | None = None
    produce_bytes_per_s: Rate | None = None
    burst_s: Annotated[StrictInt | StrictFloat, Field(gt=0, le=3600)] = 1


class RightsSpec(_Strict):
    produce: list[Pattern] = []
    consume: list[Pattern] = []
    group: list[Pattern] = []
    admin: list[Pattern] = []
    quota: QuotaSpec | None = None

    def acl(self) -> Acl:
        return Acl.of({Right.PRODUCE: self.produce, Right.CONSUME: self.consume,
                       Right.GROUP: self.group, Right.ADMIN: self.admin})


class PrincipalSpec(RightsSpec):
    keys: list[str] = []


class AuthFileSpec(_Strict):
    default: RightsSpec = RightsSpec()
    principals: dict[PrincipalName, PrincipalSpec] = {}


@dataclass(frozen=True)
class Entry:
    """What one principal may do, and its quota (None: unlimited)."""

    acl: Acl
    quota: Quota | None


@dataclass(frozen=True)
class AuthConfig:
    principals: dict[str, Entry]
    default: Entry
    keys: KeyRing

    def entry(self, principal: str) -> Entry:
        return self.principals.get(principal, self.default)


class AuthFileError(ValueError):
    """The auth file cannot be read or is invalid; the message says where."""


def _quota(spec: QuotaSpec | None, fallback: Quota | None) -> Quota | None:
    if spec is None:
        return fallback
    return Quota(spec.requests_per_s, spec.produce_bytes_per_s, float(spec.burst_s))


def parse(text: str) -> AuthConfig:
    try:
        spec = AuthFileSpec.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise AuthFileError(f"not valid TOML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        raise AuthFileError(problems) from None
    default = Entry(spec.default.acl(), _quota(spec.default.quota, None))
    principals: dict[str, Entry] = {}
    keys: list[tuple[str, StoredKey]] = []
    for name, p in spec.principals.items():
        principals[name] = Entry(p.acl(), _quota(p.quota, default.quota))
        for i, text_key in enumerate(p.keys):
            try:
                keys.append((name, StoredKey.parse(text_key)))
            except ValueError as exc:
                raise AuthFileError(f"principals.{name}.keys.{i}: {exc}") from None
    try:
        ring = KeyRing(keys)
    except ValueError as exc:
        raise AuthFileError(str(exc)) from None
    return AuthConfig(principals, default, ring)


def load(path: Path, max_bytes: int) -> AuthConfig:
    """Read and parse the file (blocking: call it off the event loop); a file larger
    than ``max_bytes`` (LLOG_AUTH_FILE_MAX_BYTES) is refused rather than read."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise AuthFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise AuthFileError(f"{path} is larger than {max_bytes} bytes")
    try:
        return parse(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise AuthFileError(f"{path} is not UTF-8 text") from None
    except AuthFileError as exc:
        raise AuthFileError(f"{path}: {exc}") from None
