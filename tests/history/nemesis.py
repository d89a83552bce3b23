"""The nemesis: faults on a seeded schedule, each recorded when applied and when healed.

- ``kill``: SIGKILL of a broker (every process of it), started again after the fault's
  time on the same port with the same settings.
- ``pause``: SIGSTOP of a broker, SIGCONT after the fault's time (its Oxia session may
  expire meanwhile: peers drop it and take its partitions' appends over).
- ``slow_store``: each answer from MinIO to one broker held 0.5-8 s (``slow_s``; a slow
  S3: PUTs outlive forward deadlines, and the appends of other brokers pass them
  meanwhile).
- ``cut_store``: every connection between one broker and MinIO closed, new ones
  refused.
- ``half_open_store``: connections stay up and nothing flows either way.
- ``delete_topic``: ``DELETE /topics/{topic}`` of the topic kept for deletes: its log
  start moves past everything (recorded as ``truncate`` operations by the run).
- ``pause_server``: SIGSTOP of Oxia or MinIO, SIGCONT after the fault's time.
- ``kill_server``: SIGKILL of Oxia or MinIO, started again (same data, same port).

One fault at a time; everything is healed before the final reads.
"""

from __future__ import annotations

import functools
import random
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from app.localstack.processes import ManagedProcess, wait_until
from tests.history.model import Recorder
from tests.history.proxy import FaultProxy

FAULTS = ("kill", "pause", "slow_store", "cut_store", "half_open_store", "delete_topic",
          "pause_server", "kill_server")
SERVER_FAULTS = ("pause_server", "kill_server")


@dataclass
class Target:
    """A broker, what starts it again, and the proxy between it and MinIO."""

    name: str
    kill: Callable[[], None]
    signal: Callable[[int], None]
    restart: Callable[[], Awaitable[None]]
    store: FaultProxy


@dataclass
class Server:
    """A server of the stack: its process, and what says it answers again."""

    name: str
    process: ManagedProcess
    ready: Callable[[], bool]

    async def restart(self) -> None:
        self.process.start()
        await anyio.to_thread.run_sync(functools.partial(
            wait_until, f"{self.name} after a restart", self.ready, timeout=120,
            process=self.process))


class Nemesis:
    def __init__(self, rec: Recorder, rng: random.Random, targets: Sequence[Target],
                 delete_topic: Callable[[], Awaitable[None]], *,
                 servers: Sequence[Server] = (),
                 faults: Sequence[str] = FAULTS, every_s: tuple[float, float] = (2.0, 6.0),
                 lasting_s: tuple[float, float] = (1.0, 8.0),
                 slow_s: tuple[float, float] = (0.5, 8.0)) -> None:
        self.rec, self.rng, self.targets = rec, rng, list(targets)
        self.servers = list(servers)
        self.slow_s = slow_s
        self.delete_topic = delete_topic
        self.faults, self.every_s, self.lasting_s = list(faults), every_s, lasting_s
        self.applied: list[tuple[str, str]] = []

    async def run(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            with anyio.move_on_after(self.rng.uniform(*self.every_s)):
                await stop.wait()
            if stop.is_set():
                return
            fault = self.rng.choice(self.faults)
            if fault in SERVER_FAULTS:
                if self.servers:
                    await self.one(fault, self.rng.choice(self.servers))
            else:
                await self.one(fault, self.rng.choice(self.targets))

    async def one(self, fault: str, target: Target | Server) -> None:
        lasting = self.rng.uniform(*self.lasting_s)
        self.rec.add("nemesis", "invoke", "nemesis", {"fault": fault, "target": target.name,
                                                      "seconds": round(lasting, 2)})
        self.applied.append((fault, target.name))
        try:
            if isinstance(target, Server):
                await self._on_server(fault, target, lasting)
            else:
                await self._apply(fault, target, lasting)
        finally:
            self.rec.add("nemesis", "ok", "nemesis", {"fault": fault, "target": target.name})

    async def _on_server(self, fault: str, server: Server, lasting: float) -> None:
        if fault == "pause_server":
            server.process.signal(signal.SIGSTOP)
            try:
                await anyio.sleep(lasting)
            finally:
                server.process.signal(signal.SIGCONT)
            return
        server.process.kill()
        await anyio.sleep(lasting)
        await server.restart()

    async def _apply(self, fault: str, target: Target, lasting: float) -> None:
        if fault == "delete_topic":
            await self.delete_topic()
            return
        if fault == "kill":
            target.kill()
            await anyio.sleep(lasting)
            await target.restart()
            return
        if fault == "pause":
            target.signal(signal.SIGSTOP)
            try:
                await anyio.sleep(lasting)
            finally:
                target.signal(signal.SIGCONT)
            return
        proxy = target.store
        if fault == "slow_store":
            proxy.slow(self.rng.uniform(*self.slow_s))
        elif fault == "cut_store":
            proxy.cut()
        elif fault == "half_open_store":
            proxy.half_open()
        try:
            await anyio.sleep(lasting)
        finally:
            proxy.heal()

    async def heal_all(self) -> None:
        for server in self.servers:
            server.process.signal(signal.SIGCONT)
        for target in self.targets:
            target.store.heal()
            target.signal(signal.SIGCONT)
