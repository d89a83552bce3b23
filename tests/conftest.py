"""Shared fixtures: one real Oxia + MinIO stack per test session, started by the same
code as `llog dev`, plus per-test topics and clients."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage import oxia_compat
from app.storage.keys import TopicPartition
from tests.helpers import selection
from tests.helpers.stack import Broker, BrokerFactory, Engine, make_settings, open_engine
from tests.helpers.topology import stack_overrides

_SKIPPED: list[selection.Skip] = []


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    selection.mark_by_fixture(items)
    selection.heavy_groups_first(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(selection.Skip(report.nodeid, selection.skip_reason(report)))


def _is_worker(config: pytest.Config) -> bool:
    # Under pytest-xdist the controller sees every worker's reports and judges the run.
    return hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    unexpected = [] if _is_worker(config) else selection.unexpected(_SKIPPED)
    if unexpected:
        terminalreporter.section("skips not on the allow-list (tests/helpers/selection.py)",
                                 red=True)
        for skip in unexpected:
            terminalreporter.line(f"{skip.nodeid}: {skip.reason}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _is_worker(session.config) and selection.unexpected(_SKIPPED) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    client = oxia_compat.connect(stack.oxia_address, session_timeout_ms=3000,
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
    """One broker shared by a module's tests (small limits so limit tests stay cheap)."""
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("broker"))
    yield factory.start(max_request_bytes="262144", max_records_per_request="1000",
                        max_record_bytes="65536", max_wait_ms_ceiling="20000")
    factory.stop_all()
