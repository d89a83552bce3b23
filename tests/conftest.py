"""Shared fixtures: one real Oxia + MinIO stack per test session, started by the same
code as `llog dev`, plus per-test topics and clients."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oxia
import pytest
import pytest_asyncio

from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import ManagedProcess, free_port
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage import oxia_compat  # noqa: F401  (fixes a client start-up race)
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metrics import StoreMetrics
from app.storage.oxia_store import OxiaStore
from app.storage.reader import LogReader
from app.storage.s3 import S3Store
from app.storage.writer import LogWriter


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    data_dir = tmp_path_factory.mktemp("stack")
    with LocalStack(StackConfig.ephemeral(data_dir)) as running:
        yield running


@pytest.fixture(scope="session")
def stack_env(stack: LocalStack) -> dict[str, str]:
    return stack.settings_env()


def make_settings(stack: LocalStack, **overrides: Any) -> Settings:
    c = stack.config
    values: dict[str, Any] = {
        "oxia_address": stack.oxia_address,
        "oxia_namespace": c.oxia_namespace,
        "s3_endpoint": stack.s3_endpoint,
        "s3_bucket": c.bucket,
        "s3_region": c.region,
        "s3_access_key": c.access_key,
        "s3_secret_key": c.secret_key,
        "root_prefix": c.root_prefix,
        "broker_id": "test",
        "oxia_session_timeout_ms": 3000,
        "oxia_request_timeout_s": 10,
    }
    values.update(overrides)
    return Settings(**values)


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
    client = oxia.Client(stack.oxia_address, session_timeout_ms=3000)
    yield client
    client.close()


@dataclass
class Engine:
    settings: Settings
    layout: KeyLayout
    metrics: StoreMetrics
    oxia: OxiaStore
    s3: S3Store
    writer: LogWriter
    reader: LogReader


@contextlib.asynccontextmanager
async def open_engine(settings: Settings, **writer_kwargs: Any) -> AsyncIterator[Engine]:
    """Store clients, writer and reader against the stack, closed on exit."""
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings, metrics) as ox, S3Store(settings, metrics) as s3:
        writer = LogWriter(ox, s3, layout, metrics, **writer_kwargs)
        yield Engine(settings, layout, metrics, ox, s3, writer, LogReader(ox, s3, layout))


@pytest_asyncio.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    async with open_engine(settings) as e:
        yield e


@pytest.fixture(scope="session")
def spark() -> Any:
    """The local[2] SparkSession shared by the Spark tests (created on first use)."""
    from tests.helpers.spark_support import get_spark

    return get_spark()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@dataclass
class Broker:
    url: str
    process: ManagedProcess
    env: dict[str, str]


class BrokerFactory:
    """Starts `llog serve` processes against the session stack; stops them at the end."""

    def __init__(self, stack: LocalStack, logs: Path) -> None:
        self._stack = stack
        self._logs = logs
        self.tmp = logs.parent
        self.started: list[Broker] = []

    def start(self, *, workers: int = 1, **settings: str) -> Broker:
        port = free_port()
        broker_id = settings.pop("broker_id", f"b{len(self.started) + 1}-{port}")
        env = {**self._stack.settings_env(), "LLOG_BROKER_ID": broker_id,
               "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000"}
        env.update({f"LLOG_{k.upper()}": v for k, v in settings.items()})
        proc = broker_process(broker_id, port, env, self._logs / f"{broker_id}.log",
                              workers=workers)
        url = f"http://127.0.0.1:{port}"
        proc.start()
        try:
            wait_healthy(proc, url)
        except BaseException:
            proc.stop()
            raise
        broker = Broker(url, proc, env)
        self.started.append(broker)
        return broker

    def stop_all(self) -> None:
        for broker in self.started:
            broker.process.stop()


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
