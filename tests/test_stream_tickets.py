"""Stream tickets as pure logic, with a clock of the test's own: a ticket expires, is
spent once, is bound to its topic, and only its secret makes one; the set of spent
tickets stays bounded."""

from __future__ import annotations

import pytest

from app.auth.tickets import StreamTickets, Ticket
from app.errors import QuotaExceeded, Unauthenticated, Unavailable


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


TICKET = Ticket("reader", "orders", "0123456789ab", None)


def test_a_ticket_is_spent_once_and_expires() -> None:
    clock = Clock()
    tickets = StreamTickets(b"k" * 32, 30, 100, clock)
    assert tickets.redeem(tickets.mint(TICKET), "orders") == TICKET
    spent = tickets.mint(TICKET)
    tickets.redeem(spent, "orders")
    with pytest.raises(Unauthenticated, match="used already"):
        tickets.redeem(spent, "orders")
    late = tickets.mint(TICKET)
    clock.now += 30
    with pytest.raises(Unauthenticated, match="expired"):
        tickets.redeem(late, "orders")
    # Once expired, a spent ticket is forgotten, and is still refused (expired).
    with pytest.raises(Unauthenticated, match="expired"):
        tickets.redeem(spent, "orders")


def test_a_ticket_is_bound_to_its_topic_and_secret() -> None:
    tickets = StreamTickets(b"k" * 32, 30, 100, Clock())
    issued = tickets.mint(TICKET)
    with pytest.raises(Unauthenticated, match="another topic"):
        tickets.redeem(issued, "orders-2")
    with pytest.raises(Unauthenticated, match="does not verify"):
        StreamTickets(b"j" * 32, 30, 100, Clock()).redeem(tickets.mint(TICKET), "orders")
    payload, mac = issued.removeprefix("llogt_").split(".")
    for bad in (f"llogt_{payload}x.{mac}", f"llogt_{payload}.{mac[:-1]}", "llogt_.",
                "llogt_a.b.c", issued.removeprefix("llogt_"), "llogt_" + "A" * 5000):
        with pytest.raises(Unauthenticated):
            tickets.redeem(bad, "orders")


def test_the_spent_tickets_remembered_are_bounded() -> None:
    clock = Clock()
    tickets = StreamTickets(b"k" * 32, 30, 2, clock)
    for _ in range(2):
        tickets.redeem(tickets.mint(TICKET), "orders")
    # Forgetting a live nonce would let its ticket be used twice: refuse instead.
    with pytest.raises(Unavailable):
        tickets.redeem(tickets.mint(TICKET), "orders")
    clock.now += 30  # those two can no longer be used: forgotten
    tickets.redeem(tickets.mint(TICKET), "orders")


def test_a_ticket_refused_by_its_admission_is_not_spent() -> None:
    """The request quota is charged before the ticket is spent: a 429 leaves it usable
    for the retry."""
    tickets = StreamTickets(b"k" * 32, 30, 100, Clock())
    issued = tickets.mint(TICKET)

    def over_quota(_: Ticket) -> None:
        raise QuotaExceeded("over the request quota", retry_after_s=1)

    with pytest.raises(QuotaExceeded):
        tickets.redeem(issued, "orders", over_quota)
    assert tickets.redeem(issued, "orders", lambda _: None) == TICKET


def test_one_principal_cannot_fill_the_spent_tickets_for_everyone() -> None:
    clock = Clock()
    tickets = StreamTickets(b"k" * 32, 30, 10, clock, max_per_principal=3)
    for _ in range(3):
        tickets.redeem(tickets.mint(TICKET), "orders")
    refused = tickets.mint(TICKET)
    with pytest.raises(QuotaExceeded):
        tickets.redeem(refused, "orders")
    other = Ticket("writer", "orders", None, None)
    assert tickets.redeem(tickets.mint(other), "orders") == other
    clock.now += 30  # the reader's spent tickets expire: it may redeem again
    tickets.redeem(tickets.mint(TICKET), "orders")
