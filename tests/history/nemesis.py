"""The nemesis: faults on a seeded schedule, each recorded when applied and when healed.

- ``kill``: SIGKILL of a broker (every process of it), started again after the fault's
  time on the same port with the same settings.
- ``pause``: SIGSTOP of a broker, SIGCONT after the fault's time (its Oxia session may
  expire meanwhile: peers drop it and take its partitions' appends over).
- ``clock``: a broker restarted with its wall clock set ahead or behind
  (``LLOG_TEST_CLOCK_OFFSET_MS``, up to ``clock_skew_s``), and again with the true time
  after the fault's time: its leases, sessions, fences and blob ages disagree with the
  others' meanwhile.
- Links, each through a real TCP proxy (:class:`FaultProxy`), of one broker to MinIO
  (``*_store``), into one broker's forward listener from its peers (``*_peer``: its
  membership record advertises the proxy), and between every client and one Oxia data
  server (``*_oxia``: on the three-node cluster, whose coordinator advertises the
  proxies): ``slow_*`` holds each answer 0.5-8 s (``slow_s``), ``cut_*`` closes every
  connection and refuses new ones, ``half_open_*`` keeps connections up with nothing
  flowing either way.
- ``delete_topic``: ``DELETE /topics/{topic}`` of the topic kept for deletes: its log
  start moves past everything (recorded as ``truncate`` operations by the run).
- ``pause_server``: SIGSTOP of a server (MinIO, Oxia, or one Oxia data server of the
  cluster), SIGCONT after the fault's time.
- ``kill_server``: SIGKILL of such a server, started again (same data, same port).

One fault at a time; everything is healed before the final reads. A fault whose target
this run does not have (an Oxia link without the cluster) is left out of the schedule.
"""

from __future__ import annotations

import functools
import random
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from app.localstack.processes import ManagedProcess, wait_until
from tests.history.model import Recorder
from tests.history.proxy import FaultProxy

LINK_FAULTS = ("slow", "cut", "half_open")
LINKS = ("store", "peer", "oxia")
FAULTS = ("kill", "pause", "clock", *(f"{f}_{link}" for link in LINKS for f in LINK_FAULTS),
          "delete_topic", "pause_server", "kill_server")
SERVER_FAULTS = ("pause_server", "kill_server")


@dataclass
class Target:
    """A broker, what starts it again (``reclock``: with its clock set that many
    milliseconds off), and the proxies of its links (``store``, ``peer``)."""

    name: str
    kill: Callable[[], None]
    signal: Callable[[int], None]
    restart: Callable[[], Awaitable[None]]
    reclock: Callable[[int], Awaitable[None]]
    links: dict[str, FaultProxy]


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
                 oxia_links: Sequence[tuple[str, FaultProxy]] = (),
                 faults: Sequence[str] = FAULTS, every_s: tuple[float, float] = (2.0, 6.0),
                 lasting_s: tuple[float, float] = (1.0, 8.0),
                 slow_s: tuple[float, float] = (0.5, 8.0),
                 clock_skew_s: tuple[float, float] = (1.0, 5.0)) -> None:
        self.rec, self.rng, self.targets = rec, rng, list(targets)
        self.servers = list(servers)
        self.oxia_links = list(oxia_links)
        self.slow_s, self.clock_skew_s = slow_s, clock_skew_s
        self.delete_topic = delete_topic
        self.every_s, self.lasting_s = every_s, lasting_s
        self.faults = [f for f in faults if self._possible(f)]
        self.applied: list[tuple[str, str]] = []

    def _possible(self, fault: str) -> bool:
        if fault in SERVER_FAULTS:
            return bool(self.servers)
        if fault.endswith("_oxia"):
            return bool(self.oxia_links)
        return bool(self.targets)

    async def run(self, stop: anyio.Event) -> None:
        while not stop.is_set() and self.faults:
            with anyio.move_on_after(self.rng.uniform(*self.every_s)):
                await stop.wait()
            if stop.is_set():
                return
            fault = self.rng.choice(self.faults)
            lasting = self.rng.uniform(*self.lasting_s)
            if fault in SERVER_FAULTS:
                server = self.rng.choice(self.servers)
                await self._recorded(fault, server.name, lasting,
                                     self._on_server(fault, server, lasting))
            elif fault.endswith("_oxia"):
                name, proxy = self.rng.choice(self.oxia_links)
                await self._recorded(fault, name, lasting,
                                     self._on_link(fault, proxy, lasting))
            elif fault == "clock":
                target = self.rng.choice(self.targets)
                skew_ms = round(self.rng.uniform(*self.clock_skew_s) * 1000)
                offset = skew_ms if self.rng.random() < 0.5 else -skew_ms
                await self._recorded(fault, target.name, lasting,
                                     self._reclock(target, offset, lasting),
                                     offset_ms=offset)
            else:
                target = self.rng.choice(self.targets)
                await self._recorded(fault, target.name, lasting,
                                     self._apply(fault, target, lasting))

    async def _recorded(self, fault: str, target: str, lasting: float,
                        action: Awaitable[None], **more: Any) -> None:
        self.rec.add("nemesis", "invoke", "nemesis", {"fault": fault, "target": target,
                                                      "seconds": round(lasting, 2), **more})
        self.applied.append((fault, target))
        try:
            await action
        finally:
            self.rec.add("nemesis", "ok", "nemesis", {"fault": fault, "target": target})

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
        link = fault.rsplit("_", 1)[1]
        await self._on_link(fault, target.links[link], lasting)

    async def _reclock(self, target: Target, offset_ms: int, lasting: float) -> None:
        await target.reclock(offset_ms)
        try:
            await anyio.sleep(lasting)
        finally:
            await target.reclock(0)

    async def _on_link(self, fault: str, proxy: FaultProxy, lasting: float) -> None:
        kind = fault.rsplit("_", 1)[0]
        if kind == "slow":
            proxy.slow(self.rng.uniform(*self.slow_s))
        elif kind == "cut":
            proxy.cut()
        else:
            proxy.half_open()
        try:
            await anyio.sleep(lasting)
        finally:
            proxy.heal()

    async def heal_all(self) -> None:
        for server in self.servers:
            server.process.signal(signal.SIGCONT)
        for _, proxy in self.oxia_links:
            proxy.heal()
        for target in self.targets:
            for proxy in target.links.values():
                proxy.heal()
            target.signal(signal.SIGCONT)
