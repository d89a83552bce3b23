"""A broker with access control on for the console's browser tests: an operator who may
do everything, and a reader who may consume one topic (``mine``) and hold no right on
another (``theirs``), both topics made for it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.localstack.stack import LocalStack
from tests.helpers.auth import Keys, bearer, write_atomically
from tests.helpers.stack import Broker, BrokerFactory


@dataclass
class AuthBroker:
    broker: Broker
    keys: Keys
    mine: str  # the reader may consume it (and not produce to it)
    theirs: str  # the reader holds no right on it


@contextlib.contextmanager
def auth_broker(stack: LocalStack, tmp: Path, *, reader_more: str = "",
                operator_more: str = "") -> Iterator[AuthBroker]:
    """The broker; ``reader_more`` and ``operator_more``: more lines of each principal's
    auth-file table (``group = ["readers-*"]``)."""
    keys = Keys()
    for name in ("operator", "reader"):
        keys.new(name)
    mine, theirs = f"mine-{uuid.uuid4().hex[:8]}", f"theirs-{uuid.uuid4().hex[:8]}"
    path = tmp / "auth.toml"
    write_atomically(path, f"""
[principals.operator]
keys = ["{keys.entries['operator']}"]
admin = ["*"]
produce = ["*"]
consume = ["*"]
{operator_more}

[principals.reader]
keys = ["{keys.entries['reader']}"]
consume = ["{mine}"]
{reader_more}
""")
    factory = BrokerFactory(stack, tmp)
    try:
        broker = factory.start(auth="on", auth_file=str(path))
        with httpx.Client(base_url=broker.url, timeout=30,
                          headers=bearer(keys.tokens["operator"])) as http:
            for name in (mine, theirs):
                r = http.post("/topics", json={"topic": name, "partitions": 1})
                assert r.status_code == 201, r.text
        yield AuthBroker(broker, keys, mine, theirs)
    finally:
        factory.stop_all()
