"""JWT bearer tokens: verified against the configured issuer's public keys.

A token passes when its signature verifies with a key of the issuer's key set under an
accepted asymmetric algorithm (the key's own algorithm must match the token's), it
carries ``exp``, ``iss`` and ``aud`` and the principal claim, ``iss`` and ``aud`` are the
configured ones, and ``exp``/``nbf`` hold within the leeway. The principal is the
configured claim (default ``sub``).

The key set is fetched at start, again every ``LLOG_AUTH_JWKS_REFRESH_S``, and at once
(at most every ``LLOG_AUTH_JWKS_MIN_REFRESH_S``) when a token names a key id the set does
not hold, which is how a key rotation reaches the broker before the next refresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import anyio.abc
import jwt
from jwt import PyJWK

from app.auth.jwks import JwksError, fetch_document, signing_keys
from app.errors import Unauthenticated, Unavailable
from app.settings import AuthSettings

log = logging.getLogger(__name__)
MAX_PRINCIPAL_CHARS = 256

# PyJWT's exceptions, most specific first, as the description a client is given.
_DESCRIPTIONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet"),
    (jwt.InvalidAudienceError, "the token is not meant for this audience"),
    (jwt.InvalidIssuerError, "the token comes from another issuer"),
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.InvalidAlgorithmError, "the token's algorithm is not accepted"),
)


class JwtVerifier:
    def __init__(self, auth: AuthSettings, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._s = auth
        self._clock = clock
        self._keys: dict[str | None, PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = anyio.Lock()
        self._require = sorted({"exp", "iss", "aud", auth.auth_jwt_principal_claim})

    async def refresh(self) -> None:
        """Fetch the key set; on failure keep the keys held and raise JwksError."""
        s = self._s
        self._fetched_at = self._clock()
        doc = await fetch_document(s.auth_jwks_file, s.auth_jwks_url, s.auth_jwks_timeout_s,
                                   s.auth_jwks_max_bytes)
        self._keys = signing_keys(doc, s.auth_jwt_algorithms)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Load the key set (a failure is logged: tokens are refused with 503 until a
        later fetch succeeds), then refresh it periodically."""
        await self._refresh_logged()
        task_status.started()
        while True:
            await anyio.sleep(self._s.auth_jwks_refresh_s)
            await self._refresh_logged()

    async def _refresh_logged(self) -> bool:
        try:
            await self.refresh()
            return True
        except JwksError as exc:
            log.error("JWKS: %s; keeping the %d keys held", exc, len(self._keys))
            return False

    async def _key(self, kid: object) -> PyJWK:
        if not isinstance(kid, str | None):
            raise Unauthenticated("the token's key id is not a string")
        key = self._pick(kid)
        if key is None and self._may_refetch():
            async with self._lock:
                if self._pick(kid) is None and self._may_refetch():
                    await self._refresh_logged()
            key = self._pick(kid)
        if key is not None:
            return key
        if not self._keys:
            raise Unavailable("the token issuer's keys could not be loaded; retry later")
        raise Unauthenticated("the token is signed with a key the issuer does not publish")

    def _pick(self, kid: str | None) -> PyJWK | None:
        if kid is None:  # no key id: only unambiguous with a single key
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    def _may_refetch(self) -> bool:
        return (self._fetched_at is None
                or self._clock() - self._fetched_at >= self._s.auth_jwks_min_refresh_s)

    async def principal(self, token: str) -> str:
        """The principal the token names, or Unauthenticated saying why not."""
        return (await self.verify(token))[0]

    async def verify(self, token: str) -> tuple[str, float]:
        """The principal the token names and the Unix time it stops being accepted (its
        ``exp`` plus the leeway), or Unauthenticated saying why not."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the token is not a well-formed JWT") from None
        if header.get("alg") not in self._s.auth_jwt_algorithms:
            raise Unauthenticated("the token's algorithm is not accepted")
        key = await self._key(header.get("kid"))
        claims = self._decode(token, key)
        principal = claims.get(self._s.auth_jwt_principal_claim)
        if not isinstance(principal, str) or not 0 < len(principal) <= MAX_PRINCIPAL_CHARS:
            raise Unauthenticated(f"the token's {self._s.auth_jwt_principal_claim} claim is "
                                  f"not a name of 1 to {MAX_PRINCIPAL_CHARS} characters")
        # Required, and checked by decode as ``int(exp)`` would take it: a string of
        # digits passes there too, so it is read the same way here.
        try:
            exp = float(int(claims["exp"]))  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise Unauthenticated("the token's exp claim is not a time") from None
        return principal, exp + self._s.auth_jwt_leeway_s

    def _decode(self, token: str, key: PyJWK) -> dict[str, object]:
        s = self._s
        try:
            claims: dict[str, object] = jwt.decode(
                token, key=key, algorithms=list(s.auth_jwt_algorithms),
                audience=s.auth_jwt_audience, issuer=s.auth_jwt_issuer,
                leeway=s.auth_jwt_leeway_s,
                options={"require": self._require, "enforce_minimum_key_length": True})
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"the token lacks the {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            for kind, description in _DESCRIPTIONS:
                if isinstance(exc, kind):
                    raise Unauthenticated(description) from None
            raise Unauthenticated(f"the token is invalid: {exc}") from None
        return claims
