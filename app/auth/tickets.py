"""Stream tickets: how a browser's ``EventSource``, which cannot send an
``Authorization`` header, opens an event stream with access control on.

A client holding a token asks ``POST /topics/{topic}/stream/tickets`` for a ticket and
opens ``GET /topics/{topic}/stream?ticket=…``. A ticket is
``llogt_<payload>.<mac>``: the payload (base64url JSON) names the principal, the topic,
the API key that proved the principal (so removing the key from the auth file also ends
streams opened with its tickets), when the principal's own credential expires (a JWT's
``exp``), when the ticket expires and a random nonce; the mac is HMAC-SHA256 of the
payload under the ticket secret. So a ticket is

- **short-lived**: refused after ``LLOG_STREAM_TICKET_TTL_S`` (30 s);
- **bound** to one principal and one topic: it opens nothing else;
- **used once**: its nonce is remembered until the ticket expires, by this process
  (brokers share no state, so behind a load balancer a stolen ticket could at most be
  replayed once per other broker within its lifetime, for that topic and principal);
- **unforgeable**: only a holder of the secret makes a mac that verifies.

The secret is ``LLOG_STREAM_TICKET_SECRET``, the same on every broker (and worker) a
load balancer may send the stream to; without it each process draws its own at start,
and its tickets open streams on that process only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import math
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from app.clock import wall_s
from app.errors import QuotaExceeded, Unauthenticated, Unavailable

PREFIX = "llogt_"
# Separates these macs from any other use of the same secret.
_DOMAIN = b"llog stream ticket v1\x00"
# Longest ticket accepted (a principal and a topic of 256 characters, base64url):
# anything longer is refused before it is decoded.
MAX_TICKET_CHARS = 2048
# Tickets redeemed within one lifetime that a process remembers (a few MB at most).
MAX_REDEEMED = 100_000
# Of those, the most one principal may hold: a principal that opens streams without
# end is refused (429) before it can fill the table and refuse everyone else's.
MAX_REDEEMED_PER_PRINCIPAL = 1_000


@dataclass(frozen=True)
class Ticket:
    """What a redeemed ticket proves."""

    principal: str
    topic: str
    key_id: str | None  # the API key that proved the principal when it was minted
    expires_at: float | None  # the principal's credential's end (a JWT's exp), Unix time


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StreamTickets:
    def __init__(self, secret: bytes, ttl_s: float, max_redeemed: int,
                 clock: Callable[[], float] = wall_s, *,
                 max_per_principal: int = MAX_REDEEMED_PER_PRINCIPAL) -> None:
        self._secret = secret
        self.ttl_s = ttl_s
        self._max_redeemed = max_redeemed
        self._max_per_principal = max_per_principal
        self._clock = clock
        # Nonces of tickets redeemed and not yet expired: a set, a heap by expiry to
        # forget them once their ticket could no longer be used anyway, and how many
        # each principal holds.
        self._redeemed: set[str] = set()
        self._expiries: list[tuple[float, str, str]] = []
        self._held: Counter[str] = Counter()

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, _DOMAIN + payload, hashlib.sha256).digest()

    def mint(self, ticket: Ticket) -> str:
        payload = orjson.dumps({
            "p": ticket.principal, "t": ticket.topic, "k": ticket.key_id,
            "x": ticket.expires_at, "e": self._clock() + self.ttl_s,
            "n": secrets.token_urlsafe(16)})
        return f"{PREFIX}{_b64(payload)}.{_b64(self._mac(payload))}"

    def redeem(self, text: str, topic: str,
               admit: Callable[[Ticket], None] | None = None) -> Ticket:
        """The ticket's claims, once: Unauthenticated if it is forged, expired, spent or
        made for another topic. ``admit`` (the principal's request quota, say) runs on a
        valid ticket before it is spent: a ticket it refuses can be used again."""
        fields = self._verified(text)
        now = self._clock()
        expires = fields.get("e")
        if not isinstance(expires, float | int) or now >= expires:
            raise Unauthenticated("the stream ticket has expired")
        if fields.get("t") != topic:
            raise Unauthenticated("the stream ticket was made for another topic")
        nonce = fields.get("n")
        principal, key_id, until = fields.get("p"), fields.get("k"), fields.get("x")
        if (not isinstance(nonce, str) or not isinstance(principal, str)
                or not isinstance(key_id, str | None)
                or not isinstance(until, float | int | None)):
            raise Unauthenticated("the stream ticket is not well-formed")
        self._forget_expired(now)
        if nonce in self._redeemed:
            raise Unauthenticated("the stream ticket was used already")
        ticket = Ticket(principal, topic, key_id, None if until is None else float(until))
        if admit is not None:
            admit(ticket)
        self._spend(nonce, principal, float(expires))
        return ticket

    def _verified(self, text: str) -> dict[str, object]:
        body = text.removeprefix(PREFIX)
        if len(text) > MAX_TICKET_CHARS or body == text or body.count(".") != 1:
            raise Unauthenticated("not a stream ticket")
        payload_text, mac_text = body.split(".")
        try:
            payload, mac = _unb64(payload_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            raise Unauthenticated("not a stream ticket") from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise Unauthenticated("the stream ticket does not verify")
        try:
            fields = orjson.loads(payload)
        except orjson.JSONDecodeError:
            fields = None
        if not isinstance(fields, dict):  # signed by us, so only with another version
            raise Unauthenticated("the stream ticket is not well-formed")
        return fields

    def _forget_expired(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            _, nonce, principal = heapq.heappop(self._expiries)
            self._redeemed.discard(nonce)
            self._held[principal] -= 1
            if self._held[principal] <= 0:
                del self._held[principal]

    def _spend(self, nonce: str, principal: str, expires: float) -> None:
        # Forgetting a live nonce would let its ticket be used again: refuse instead.
        if self._held[principal] >= self._max_per_principal:
            raise QuotaExceeded(
                f"{principal} redeemed {self._max_per_principal} stream tickets within "
                "their lifetime; retry shortly", retry_after_s=max(1, math.ceil(self.ttl_s)))
        if len(self._redeemed) >= self._max_redeemed:
            raise Unavailable("too many stream tickets redeemed lately; retry shortly")
        self._redeemed.add(nonce)
        self._held[principal] += 1
        heapq.heappush(self._expiries, (expires, nonce, principal))
