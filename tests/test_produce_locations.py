"""LLOG_PRODUCE_LOCATIONS: where an acknowledged entry lives (``wal_uri``, ``index_key``)
is told to every caller by default, to admins of the topic only, or to nobody, on a
real broker; every answer still matches the OpenAPI document, and the client reads the
offsets either way."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from app.localstack.stack import LocalStack
from app.settings import Settings
from llog_client import AsyncLlogClient
from tests.helpers.auth import Keys, bearer
from tests.helpers.bodies import produce_body
from tests.helpers.stack import BrokerFactory
from tests.test_openapi_document import documented_broker

LOCATIONS = ("index_key", "wal_uri")


def auth_file(tmp_path: Path, keys: Keys, topic: str) -> Path:
    path = tmp_path / "auth.toml"
    path.write_text(f"""
[principals.owner]
keys = ["{keys.entries['owner']}"]
produce = ["{topic}"]
admin = ["{topic}"]

[principals.writer]
keys = ["{keys.entries['writer']}"]
produce = ["{topic}"]
""")
    return path


def test_the_default_tells_every_caller() -> None:
    assert Settings().produce_locations == "all"


@pytest.mark.parametrize(("mode", "told"), [
    ("all", {"owner", "writer"}), ("admin", {"owner"}), ("none", set())])
async def test_locations_are_told_as_the_setting_says(stack: LocalStack, tmp_path: Path,
                                                      topic: str, mode: str,
                                                      told: set[str]) -> None:
    keys = Keys()
    tokens = {name: keys.new(name) for name in ("owner", "writer")}
    async with documented_broker(stack, auth="on", auth_file=auth_file(tmp_path, keys, topic),
                                 produce_locations=mode) as send:
        offsets = []
        for name, token in tokens.items():
            r = await send("POST", "/produce", json=produce_body(topic, name),
                           headers=bearer(token))
            assert r.status_code == 200, r.text
            (result,) = r.json()["results"]
            offsets.append(result["end_offset"])
            shown = {field for field in LOCATIONS if field in result}
            assert shown == (set(LOCATIONS) if name in told else set()), (name, result)
            if shown:
                assert result["wal_uri"].startswith("s3://")
                assert result["index_key"].startswith(f"llog/{topic}/partitions/0/index/")
    assert offsets == [1, 2]


async def test_with_auth_off_admin_mode_tells_every_caller(stack: LocalStack,
                                                           topic: str) -> None:
    async with documented_broker(stack, produce_locations="admin") as send:
        r = await send("POST", "/produce", json=produce_body(topic, "a"))
        assert set(LOCATIONS) <= set(r.json()["results"][0])


async def test_the_client_produces_without_locations(brokers: BrokerFactory,
                                                     topic: str) -> None:
    broker = brokers.start(produce_locations="none")
    with anyio.fail_after(60):
        async with AsyncLlogClient(broker.url) as client:
            produced = await client.produce(topic, [b"a", b"b"], partition=0)
            again = await client.produce(topic, [b"c"], partition=0)
    assert [(b.start_offset, b.end_offset) for b in produced.batches] == [(1, 2)]
    assert [(b.start_offset, b.end_offset) for b in again.batches] == [(3, 3)]
