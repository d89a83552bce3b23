"""The topology of ``llog dev``: one Oxia and MinIO stack, then either one broker on the
broker port, or N brokers on free ports behind Caddy on the broker port, and one
compactor (``llog compactor``) beside them.

Compaction runs in its own process, as in the reference deployment: in a broker it shared
the broker's event loop and core with produce and consume, and a broker that compacts as
well took a third to a half of the produce throughput of one that does not
(docs/performance.md, "As users run it").

Caddy is the proxy here because it builds from its pinned Go module like the servers, so a
fresh machine runs it without root; HAProxy and nginx need OS packages. Its configuration
is the reference one in ``deploy/proxy/Caddyfile.tmpl``.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import ManagedProcess, free_port, free_ports, stop_together
from app.localstack.proxy import ProxyConfig, find_binary, proxy_process, wait_serving
from app.localstack.stack import LocalStack
from app.settings import Settings

# Brokers of `llog dev` drain for 2 s on SIGTERM: four of Caddy's 500 ms health checks.
DEV_DRAIN_S = "2"
# How long the brokers and the compactor get to stop before they are killed.
STOP_TIMEOUT_S = 45.0
COMPACTOR_NICE = 10
# What new topics of the shipped setups store their appends with (docs/cost.md).
SHIPPED_COMPRESSION = "zstd:1"
# The compactor's byte rate (LLOG_COMPACTION_MAX_BYTES_PER_S): it shares the broker's
# cores, and so do the S3 and Oxia servers it keeps busy, which `nice` does not reach.
# Unthrottled it cost 15-18% of sustained produce once entries came of age; throttled,
# it falls behind while a load above the rate lasts and catches up when it stops
# (docs/performance.md, "As users run it").
DEV_COMPACTION_MAX_BYTES_PER_S = str(4 * 1024 * 1024)
# The most WAL bytes one of its runs rewrites (LLOG_COMPACTION_MAX_BYTES; 64 MiB
# elsewhere). A run is paid for once done, so the rate above is an average over bursts
# of a run each: a 64 MiB run's reads and PUT held up the broker's own PUTs to the same
# MinIO for 100-340 ms, and every produce in flight with them (a paced producer at
# 130,000 records/s: 42-69 of ~8,000 requests over 100 ms in 100 s, a 10 s p99 above
# 250 ms in 2-3 of 8; with 8 MiB runs, 5 and none; with the compactor stopped, 0).
DEV_COMPACTION_MAX_BYTES = str(8 * 1024 * 1024)


@dataclass
class DevBroker:
    name: str
    url: str
    process: ManagedProcess

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "pid": self.process.pid}


@dataclass
class DevTopology:
    """What ``llog dev`` runs on top of the stack; ``url`` is where clients go."""

    url: str
    brokers: list[DevBroker] = field(default_factory=list)
    proxy: ManagedProcess | None = None
    compactor: DevBroker | None = None

    def processes(self) -> list[ManagedProcess]:
        found = [b.process for b in self.brokers]
        if self.compactor is not None:
            found.append(self.compactor.process)
        return [*found, self.proxy] if self.proxy is not None else found

    def stop(self) -> None:
        """Brokers and the compactor drain together (each broker keeps answering while
        the proxy moves its clients away), then the proxy stops."""
        # Bounded as one broker's stop was: its drain and uvicorn's graceful shutdown.
        stop_together((b.process for b in [*self.brokers, *filter(None, [self.compactor])]),
                      timeout=STOP_TIMEOUT_S)
        if self.proxy is not None:
            self.proxy.stop()

    def describe(self) -> dict[str, Any]:
        """The ``brokers`` and ``proxy`` fields of stack.json."""
        proxy = None
        if self.proxy is not None:
            proxy = {"kind": "caddy", "url": self.url, "pid": self.proxy.pid}
        compactor = None if self.compactor is None else self.compactor.describe()
        return {"brokers": [b.describe() for b in self.brokers], "proxy": proxy,
                "compactor": compactor}


# Drawn once per `llog dev` process, so that all the brokers it starts share it.
_CLUSTER_SECRET = secrets.token_urlsafe(32)


def broker_env(stack: LocalStack, data_dir: Path, name: str) -> dict[str, str]:
    """The environment of broker ``name`` as ``llog dev`` starts it (bench/perf.py measures
    the same broker from it, so the benchmark follows what dev ships)."""
    return {
        **stack.settings_env(),
        "LLOG_BROKER_ID": os.environ.get("LLOG_BROKER_ID", "broker-dev")
        + ("" if name == "broker" else f"-{name}"),
        "LLOG_ROLES": "write,read",  # compaction: the compactor beside them
        "LLOG_DRAIN_S": os.environ.get("LLOG_DRAIN_S", DEV_DRAIN_S),
        # Each partition appended by one preferred broker, the others forwarding to it
        # over loopback: --brokers N would otherwise collide on every commit
        # (docs/operations.md, Affinity).
        "LLOG_AFFINITY": "forward",
        "LLOG_FORWARD_HOST": "127.0.0.1",
        # One key for every broker of this run (forwarding with access control on needs
        # one; with it off it still keeps other local processes off the forward ports).
        "LLOG_CLUSTER_SECRET": os.environ.get("LLOG_CLUSTER_SECRET") or _CLUSTER_SECRET,
        # New topics store their records zstd-compressed: 6-7x fewer bytes stored and
        # read for JSON and log lines at a few percent of produce CPU (docs/cost.md).
        # The code default stays none for rolling upgrades from releases that read no
        # compressed slices; a fresh stack has none of those.
        "LLOG_TOPIC_DEFAULT_COMPRESSION": os.environ.get(
            "LLOG_TOPIC_DEFAULT_COMPRESSION", SHIPPED_COMPRESSION),
    }


def compactor_env(stack: LocalStack) -> dict[str, str]:
    """The environment of the compactor ``llog dev`` runs beside its brokers: throttled,
    in runs of 8 MiB, unless the user's environment sets LLOG_COMPACTION_MAX_BYTES_PER_S
    (to a rate, or to "unlimited" or "" for none) or LLOG_COMPACTION_MAX_BYTES."""
    return {**stack.settings_env(),
            "LLOG_BROKER_ID": os.environ.get("LLOG_BROKER_ID", "broker-dev") + "-compactor",
            # As short as the brokers': no balancer routes to a compactor, and its running
            # visits finish within the shutdown's grace either way.
            "LLOG_DRAIN_S": os.environ.get("LLOG_DRAIN_S", DEV_DRAIN_S),
            "LLOG_COMPACTION_MAX_BYTES_PER_S": os.environ.get(
                "LLOG_COMPACTION_MAX_BYTES_PER_S", DEV_COMPACTION_MAX_BYTES_PER_S),
            "LLOG_COMPACTION_MAX_BYTES": os.environ.get(
                "LLOG_COMPACTION_MAX_BYTES", DEV_COMPACTION_MAX_BYTES)}


def start_compactor(stack: LocalStack, data_dir: Path, *, log_level: str = "warning",
                    env: Mapping[str, str] | None = None, port: int | None = None
                    ) -> tuple[ManagedProcess, str]:
    """Start ``llog compactor`` on ``port`` (None: a free one; registered in
    ``stack.extra``, so the stack stops it too); the process and its URL. The caller
    waits for it. ``env``: settings over :func:`compactor_env`'s (a benchmark gives it a
    key space of its own)."""
    port = free_port() if port is None else port
    proc = ManagedProcess(
        "compactor",
        # Niced: on a developer's machine the broker's produce and consume come first and
        # compaction catches up in the time they leave (its lag only makes reads of the
        # newest data go through WAL objects, which read whole, docs/performance.md).
        ["nice", "-n", str(COMPACTOR_NICE), sys.executable, "-m", "app.cli", "compactor",
         "--host", "127.0.0.1",
         "--port", str(port), "--log-level", log_level],
        data_dir / "logs" / "compactor.log",
        env={**os.environ, **compactor_env(stack), **(env or {})})
    stack.extra["compactor"] = proc
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


def start_topology(stack: LocalStack, data_dir: Path, port: int, brokers: int
                   ) -> DevTopology:
    """Start the brokers (and the proxy when there are several) and wait until clients
    get answers on ``port``. Every process is also in ``stack.extra``, so
    ``stack.stop()`` stops whatever :meth:`DevTopology.stop` did not."""
    if brokers == 1:
        ports = {"broker": port}
    else:
        ports = {f"b{i}": p for i, p in enumerate(free_ports(brokers, avoid={port}), 1)}
    topology = DevTopology(url=f"http://127.0.0.1:{port}")
    # The compactor's port is chosen first: each broker's console shows it.
    (compactor_port,) = free_ports(1, avoid={port, *ports.values()})
    compactor_url = f"http://127.0.0.1:{compactor_port}"
    for name, broker_port in ports.items():
        url = f"http://127.0.0.1:{broker_port}"
        proc = broker_process(name, broker_port, {**broker_env(stack, data_dir, name),
                                                  "LLOG_COMPACTOR_URL": compactor_url},
                              data_dir / "logs" / f"{name}.log")
        stack.extra[name] = proc
        proc.start()
        topology.brokers.append(DevBroker(name, url, proc))
    compactor = start_compactor(stack, data_dir, port=compactor_port)
    topology.compactor = DevBroker("compactor", compactor[1], compactor[0])
    for broker in [*topology.brokers, topology.compactor]:
        wait_healthy(broker.process, broker.url)
    if brokers > 1:
        topology.proxy = _start_proxy(stack, data_dir, port, list(ports.values()))
    return topology


def _start_proxy(stack: LocalStack, data_dir: Path, port: int, upstreams: list[int]
                 ) -> ManagedProcess:
    binary = find_binary("caddy")
    assert binary is not None, "Caddy is built from its module; it is never missing"
    config = ProxyConfig(
        kind="caddy", listen_port=port,
        upstreams=[("127.0.0.1", p) for p in upstreams],
        max_request_bytes=Settings.from_env().max_request_bytes,
        run_dir=data_dir / "proxy",
    )
    proc = proxy_process(config, binary)
    stack.extra["proxy"] = proc
    proc.start()
    wait_serving(proc, config)
    return proc
