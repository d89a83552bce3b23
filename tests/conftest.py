"""Shared fixtures: one real Oxia + MinIO stack per test session, started by the same
code as `llog dev`, plus per-test topics and clients."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.localstack.processes import PORT_RANGE_ENV
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.stores.oxia import patches as oxia_patches
from tests.helpers import selection
from tests.helpers.stack import Broker, BrokerFactory, Engine, make_settings, open_engine
from tests.helpers.topology import stack_overrides

# The gate: a skip whose reason is not on selection.ALLOWED_SKIPS fails the run. The
# browser: the console's tests in headless Chromium (browser, open_console, console_broker).
pytest_plugins = ("tests.helpers.gate", "tests.helpers.browser")


def pytest_configure(config: pytest.Config) -> None:
    # The client's compiled modules shadow their source (clients/python/setup.py): tests
    # of an edit that has not been built would pass or fail on the old code.
    from llog_client._compiled import stale

    if stale():
        raise pytest.UsageError(
            f"llog_client's compiled modules {', '.join(stale())} are older than their "
            "source: run scripts/bootstrap.sh python (it builds them again)")
    # Each parallel process (and every server it starts) chooses ports from a range of its
    # own: two processes starting clusters at once never choose the same port.
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and PORT_RANGE_ENV not in os.environ:
        os.environ[PORT_RANGE_ENV] = selection.worker_port_range(
            str(workerinput["workerid"]), int(workerinput["workercount"]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    selection.mark_by_fixture(items)
    selection.heavy_groups_first(items)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    data_dir = tmp_path_factory.mktemp("stack")
    # LLOG_TEST_OXIA_CLUSTER=3, LLOG_TEST_S3_DRIVES=4: the same tests against clusters.
    with LocalStack(StackConfig.ephemeral(data_dir, **stack_overrides())) as running:
        yield running


@pytest.fixture(scope="session")
def stack_env(stack: LocalStack) -> dict[str, str]:
    return stack.settings_env()


@pytest.fixture
def settings(stack: LocalStack) -> Settings:
    return make_settings(stack)


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def tp(topic: str) -> TopicPartition:
    return TopicPartition(topic, 0)


@pytest.fixture(scope="session")
def s3_client(stack: LocalStack) -> Iterator[Any]:
    client = stack.s3_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def oxia_client(stack: LocalStack) -> Iterator[Any]:
    client = oxia_patches.connect(stack.oxia_address, session_timeout_ms=3000,
                                 request_timeout_s=10)
    yield client
    client.close()


@pytest_asyncio.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    async with open_engine(settings) as e:
        yield e


@pytest.fixture(scope="session")
@selection.slow_fixture
def spark() -> Any:
    """The local[2] SparkSession shared by the Spark tests (created on first use)."""
    from tests.helpers.spark_support import get_spark

    return get_spark()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture
def brokers(stack: LocalStack, tmp_path: Path) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(stack, tmp_path / "logs")
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker shared by a module's tests (small limits so limit tests stay cheap; a
    topic cache of half a second, so a topic delete settles in 1.5 s, not 6)."""
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("broker"))
    yield factory.start(max_request_bytes="262144", max_records_per_request="1000",
                        max_record_bytes="65536", max_wait_ms_ceiling="20000",
                        topic_cache_ttl_s="0.5")
    factory.stop_all()
