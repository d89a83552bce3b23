"""Stream tickets as pure logic, with a clock of the test's own: a ticket expires, is
spent once, is bound to its topic, and only its secret makes one; the set of spent
tickets stays bounded."""

from __future__ import annotations

import pytest

from app.auth.tickets import StreamTickets, Ticket
from app.errors import Unauthenticated, Unavailable


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
