"""The real stack as tests use it: settings for it, engines on it, brokers against it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import ManagedProcess, free_port, stop_together
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage.keys import KeyLayout
from app.storage.reader import LogReader
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store


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
        # An app in the test process shares its loop with the test, whose blocking
        # helpers (starting a broker process) stall it: no watchdog to end the process.
        "loop_stall_s": 0,
    }
    values.update(overrides)
    return Settings(**values)


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


@dataclass
class Broker:
    url: str
    process: ManagedProcess
    env: dict[str, str]
    workers: int = 1


class BrokerFactory:
    """Starts `llog serve` processes against the session stack; stops them at the end."""

    def __init__(self, stack: LocalStack, logs: Path) -> None:
        self._stack = stack
        self._logs = logs
        self.tmp = logs.parent
        self.started: list[Broker] = []

    def start(self, *, workers: int = 1, log_level: str = "warning", **settings: str
              ) -> Broker:
        return self.start_on(free_port(), workers=workers, log_level=log_level, **settings)

    def start_on(self, port: int, *, workers: int = 1, log_level: str = "warning",
                 **settings: str) -> Broker:
        """As :meth:`start`, on ``port`` (one a proxy's pool already names)."""
        broker_id = settings.pop("broker_id", f"b{len(self.started) + 1}-{port}")
        # No drain period unless a test asks for one: stopping stays quick.
        env = {**self._stack.settings_env(), "LLOG_BROKER_ID": broker_id,
               "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000", "LLOG_DRAIN_S": "0"}
        env.update({f"LLOG_{k.upper()}": v for k, v in settings.items()})
        proc = broker_process(broker_id, port, env, self._logs / f"{broker_id}.log",
                              workers=workers, log_level=log_level)
        url = f"http://127.0.0.1:{port}"
        proc.start()
        try:
            wait_healthy(proc, url)
        except BaseException:
            proc.stop()
            raise
        broker = Broker(url, proc, env, workers)
        self.started.append(broker)
        return broker

    def restart(self, broker: Broker) -> Broker:
        """Stop ``broker`` gracefully (SIGTERM: it drains first) and start it again on
        the same port with the same settings."""
        broker.process.stop(timeout=60)
        port = int(broker.url.rsplit(":", 1)[1])
        # At info the log says how far a slow start got (supervisor, workers, startup).
        proc = broker_process(broker.env["LLOG_BROKER_ID"], port, broker.env,
                              self._logs / f"{broker.env['LLOG_BROKER_ID']}-again.log",
                              workers=broker.workers, log_level="info")
        proc.start()
        try:
            # Workers import the app afresh; on a machine busy with other tests that has
            # taken over a minute, so a restart gets twice the first start's wait.
            wait_healthy(proc, broker.url, timeout=120)
        except BaseException:
            proc.stop()  # never left running past the test that started it
            raise
        again = Broker(broker.url, proc, broker.env, broker.workers)
        self.started.append(again)
        return again

    def stop_all(self) -> None:
        """Every broker told to stop at once, then each waited for: a broker with a
        drain period would otherwise make the next one wait through its own."""
        stop_together([broker.process for broker in self.started])


def compactor_process(stack: LocalStack, log: Path, port: int, **env: str) -> ManagedProcess:
    """A standalone `llog compactor` on ``port`` against ``stack``, with ``env`` (LLOG_*
    variables) on top of the stack's settings; not started. No drain period unless
    ``env`` asks for one, as for the factory's brokers: stopping stays quick."""
    return ManagedProcess(
        log.stem,
        [sys.executable, "-m", "app.cli", "compactor", "--port", str(port),
         "--log-level", "warning"],
        log,
        env={**os.environ, **stack.settings_env(), "LLOG_DRAIN_S": "0", **env},
    )


@contextlib.asynccontextmanager
async def serving_compactor(stack: LocalStack, logs: Path, compactor_id: str
                            ) -> AsyncIterator[str]:
    """A standalone compactor against ``stack``, healthy, for the block; its URL."""
    port = free_port()
    proc = compactor_process(stack, logs / f"{compactor_id}.log", port,
                             LLOG_BROKER_ID=compactor_id)
    proc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await anyio.to_thread.run_sync(wait_healthy, proc, url)
        yield url
    finally:
        proc.stop()


@contextlib.contextmanager
def broker_factory(stack: LocalStack, logs: Path) -> Iterator[BrokerFactory]:
    """A :class:`BrokerFactory` whose brokers are stopped on exit."""
    factory = BrokerFactory(stack, logs)
    try:
        yield factory
    finally:
        factory.stop_all()


@contextlib.contextmanager
def own_stack(data_dir: Path, **config: Any) -> Iterator[LocalStack]:
    """A stack of a test module's own (``config``: :class:`StackConfig` fields)."""
    with LocalStack(StackConfig.ephemeral(data_dir, **config)) as running:
        yield running
