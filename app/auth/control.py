"""Access control of one broker process: who is calling, what they may do, how much.

:class:`AccessControl` is built by ``create_app`` only when ``LLOG_AUTH=on`` and used by
the HTTP edge (app/routes/access.py); with auth off nothing of it exists, so requests pay
nothing for it.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import anyio
from prometheus_client import CollectorRegistry

from app.auth.apikeys import TOKEN_PREFIX, key_id_of
from app.auth.authfile import AuthConfig, Entry
from app.auth.jwts import JwtVerifier
from app.auth.metrics import AuthMetrics, PrincipalLabels
from app.auth.quotas import QuotaBook
from app.auth.reload import AuthFileWatch
from app.auth.rights import Right
from app.auth.tickets import MAX_REDEEMED, StreamTickets, Ticket
from app.clock import wall_s
from app.errors import Forbidden, Unauthenticated
from app.settings import AuthSettings

# A refusal names at most this many of the names it refuses.
_SHOWN_NAMES = 10


@dataclass(frozen=True)
class Principal:
    name: str
    label: str  # its metrics label (app/auth/metrics.py)
    method: Literal["api-key", "jwt", "ticket"]
    # What a long-lived request (a stream) re-checks later: the API key the principal
    # proved (revoked when the auth file drops it), and when its credential ends (a
    # JWT's exp plus the leeway, as Unix time; None: it does not expire).
    key_id: str | None = None
    expires_at: float | None = None


class AccessControl:
    def __init__(self, auth: AuthSettings, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert auth.auth_file is not None
        self.settings = auth
        self.metrics = AuthMetrics(registry)
        self.quotas = QuotaBook(auth.auth_max_tracked_principals, clock)
        self.jwt = JwtVerifier(auth, clock) if auth.jwt_enabled else None
        self._labels = PrincipalLabels(auth.auth_metrics_max_principals)
        self._config: AuthConfig | None = None
        # Bumped by every load of the auth file; long-lived requests wait on ``changed``
        # to re-check their principal instead of polling.
        self.generation = 0
        self._changed = anyio.Event()
        secret = (auth.stream_ticket_secret.get_secret_value().encode()
                  if auth.stream_ticket_secret is not None else secrets.token_bytes(32))
        self.tickets = StreamTickets(secret, auth.stream_ticket_ttl_s, MAX_REDEEMED)
        self.watch = AuthFileWatch(auth.auth_file, auth.auth_reload_interval_s,
                                   auth.auth_file_max_bytes, self._apply, self._loaded)

    def _apply(self, config: AuthConfig) -> None:
        self._config = config
        self.generation += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self, since: int) -> None:
        """Return once the auth file was loaded again after generation ``since``."""
        while self.generation <= since:
            await self._changed.wait()

    def _loaded(self, outcome: str) -> None:
        self.metrics.reloads.labels(outcome).inc()

    @property
    def config(self) -> AuthConfig:
        assert self._config is not None, "the auth file is loaded when the app starts"
        return self._config

    # -- who ---------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal an ``Authorization`` header proves, or Unauthenticated."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("this endpoint needs Authorization: Bearer <token>", code=None)
        if token.startswith(TOKEN_PREFIX):
            name = self.config.keys.principal(token)
            if name is None:
                raise Unauthenticated("unknown or revoked API key")
            return Principal(name, self._labels.label(name, listed=True), "api-key",
                             key_id=key_id_of(token))
        if self.jwt is None:
            raise Unauthenticated("the token is not an API key and no JWT issuer is "
                                  "configured")
        name, expires_at = await self.jwt.verify(token)
        return self.principal(name, "jwt", expires_at=expires_at)

    def principal(self, name: str, method: Literal["api-key", "jwt", "ticket"], *,
                  key_id: str | None = None, expires_at: float | None = None
                  ) -> Principal:
        listed = name in self.config.principals
        return Principal(name, self._labels.label(name, listed=listed), method,
                         key_id=key_id, expires_at=expires_at)

    def recheck(self, principal: Principal, right: Right, names: Iterable[str]) -> None:
        """Unauthenticated if the principal's key was removed from the auth file since
        it was proved or its credential expired, Forbidden if it lost ``right`` on one
        of ``names``: for a request that outlives the check made when it started."""
        if principal.key_id is not None and (
                self.config.keys.owner(principal.key_id) != principal.name):
            raise Unauthenticated("the API key was revoked")
        if principal.expires_at is not None and wall_s() >= principal.expires_at:
            raise Unauthenticated("the token has expired")
        self.authorize(principal, right, names)

    def entry(self, principal: Principal) -> Entry:
        return self.config.entry(principal.name)

    def redeem(self, ticket: str, topic: str) -> Principal:
        """The principal a stream ticket (``?ticket=``) proves for ``topic``, once, with
        the request charged to its quota: charged first, so a 429 leaves the ticket
        usable for the retry."""
        proved: list[Principal] = []

        def admit(found: Ticket) -> None:
            principal = self.principal(found.principal, "ticket", key_id=found.key_id,
                                       expires_at=found.expires_at)
            self.charge_request(principal)
            proved.append(principal)

        self.tickets.redeem(ticket, topic, admit)
        return proved[0]

    def mint_ticket(self, principal: Principal, topic: str) -> str:
        """A stream ticket for ``topic``; Forbidden unless the principal may consume it."""
        self.authorize(principal, Right.CONSUME, [topic])
        return self.tickets.mint(Ticket(principal.name, topic, principal.key_id,
                                        principal.expires_at))

    # -- what --------------------------------------------------------------------------

    def authorize(self, principal: Principal, right: Right, names: Iterable[str]) -> None:
        """Forbidden unless the principal holds ``right`` on every name."""
        denied = self.entry(principal).acl.denied(right, names)
        if denied:
            shown = ", ".join(denied[:_SHOWN_NAMES]) + (
                f" and {len(denied) - _SHOWN_NAMES} more" if len(denied) > _SHOWN_NAMES else "")
            kind = "consumer group" if right is Right.GROUP else "topic"
            raise Forbidden(f"{principal.name} may not {right.value} on {kind}"
                            f"{'s' if len(denied) > 1 else ''} {shown}")

    def sees_topic(self, principal: Principal, topic: str) -> bool:
        return self.entry(principal).acl.sees_topic(topic)

    # -- how much ----------------------------------------------------------------------

    def charge_request(self, principal: Principal) -> None:
        self.quotas.charge_request(principal.name, self.entry(principal).quota)

    def charge_bytes(self, principal: Principal, size: int) -> None:
        self.quotas.charge_bytes(principal.name, self.entry(principal).quota, size)


@contextlib.asynccontextmanager
async def run_access_control(control: AccessControl, *, sighup: bool) -> AsyncIterator[None]:
    """Load the auth file (a broken one stops the start) and the issuer's keys, then keep
    both current until the app stops."""
    await control.watch.load_first()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: control.watch.run(sighup=sighup))
        if control.jwt is not None:
            await tg.start(control.jwt.run)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()
