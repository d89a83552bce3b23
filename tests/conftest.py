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

from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
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
async def open_engine(
    settings: Settings, *, background: bool = True, **writer_kwargs: Any
) -> AsyncIterator[Engine]:
    """Store clients, writer and reader; ``background`` runs the writer's task group."""
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings, metrics) as ox, S3Store(settings, metrics) as s3:
        writer = LogWriter(ox, s3, layout, metrics, **writer_kwargs)
        engine = Engine(settings, layout, metrics, ox, s3, writer, LogReader(ox, s3, layout))
        if background:
            async with writer:
                yield engine
        else:
            yield engine


@pytest_asyncio.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    # An async-generator fixture sets up and tears down in different tasks, so it must
    # not hold a task group open across its yield: no background writer work here.
    async with open_engine(settings, background=False) as e:
        yield e


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
