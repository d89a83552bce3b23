"""Oxia as a replicated cluster on loopback: Oxia's own coordinator and N data servers.

The same pinned binary as the standalone server, run the way a production cluster runs
it: ``oxia server`` processes holding the shards' replicas, and ``oxia coordinator``
(with the ``file`` metadata provider, its status under the stack's data directory)
electing a leader per shard and moving leadership when a server dies. Each data server
is a :class:`~app.localstack.processes.ManagedProcess` that a test can kill and start
again on the same ports and data.

Clients are given every server's public address, comma separated
(:attr:`OxiaCluster.service_address`): the broker's Oxia client takes its shard
assignments from whichever of them answers (``app/stores/oxia/patches.py``).
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.localstack.processes import (
    ManagedProcess,
    ProcessFailed,
    free_port,
    free_ports,
    port_open,
    stop_together,
    wait_until,
)

STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OxiaClusterConfig:
    """The shape of the cluster. ``ports``: each server's public and internal port,
    then the coordinator's internal port (``2 * servers + 1`` ports); empty means
    consecutive ports from the stack's Oxia port, so a second ``llog dev`` on the same
    data directory finds its servers where the coordinator's status says they are."""

    servers: int = 3
    replication: int = 3
    shards: int = 4
    ports: tuple[int, ...] = ()
    # Each data server's public address as clients are told it (``host:port`` of a
    # proxy or a Service in front of it), in server order; empty: where it listens.
    advertised: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.replication <= self.servers:
            raise ValueError("the replication factor must be between 1 and the servers")
        if self.ports and len(self.ports) != 2 * self.servers + 1:
            raise ValueError(f"expected {2 * self.servers + 1} ports")
        if self.advertised and len(self.advertised) != self.servers:
            raise ValueError(f"expected {self.servers} advertised addresses")

    @classmethod
    def on_free_ports(cls, servers: int = 3, *, replication: int = 3,
                      shards: int = 4) -> OxiaClusterConfig:
        return cls(servers=servers, replication=replication, shards=shards,
                   ports=tuple(free_ports(2 * servers + 1)))

    def resolved_ports(self, base: int) -> tuple[int, ...]:
        return self.ports or tuple(range(base, base + 2 * self.servers + 1))


@dataclass
class OxiaNode:
    """One data server: its addresses and its process (replaced on a restart).
    ``public`` is the address clients are given (the coordinator's configuration names
    it), ``listen`` where the server serves them: the same unless the cluster's
    configuration advertises another."""

    name: str
    public: str
    internal: str
    process: ManagedProcess
    listen: str = ""

    def __post_init__(self) -> None:
        self.listen = self.listen or self.public


@dataclass
class OxiaCluster:
    binary: Path
    base_dir: Path
    logs_dir: Path
    config: OxiaClusterConfig
    host: str = "127.0.0.1"
    first_port: int = 6648
    namespace: str = "default"
    startup_timeout_s: float = 60.0
    nodes: list[OxiaNode] = field(default_factory=list)
    coordinator: ManagedProcess | None = None
    # Every port the cluster listens on, so a metrics port never repeats one of them.
    _taken_ports: set[int] = field(default_factory=set, repr=False)

    @property
    def service_address(self) -> str:
        """Every data server's public address: any one of them serves the shard
        assignments, so a client keeps working while one is down."""
        return ",".join(n.public for n in self.nodes)

    @property
    def coordinator_address(self) -> str:
        """The coordinator's internal address (the data servers' health checks come
        from it; clients never use it)."""
        return f"{self.host}:{self.config.resolved_ports(self.first_port)[-1]}"

    def processes(self) -> dict[str, ManagedProcess]:
        out = {n.name: n.process for n in self.nodes}
        if self.coordinator is not None:
            out["oxia-coordinator"] = self.coordinator
        return out

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        ports = self.config.resolved_ports(self.first_port)
        self._taken_ports = set(ports)
        for i in range(self.config.servers):
            public, internal = ports[2 * i], ports[2 * i + 1]
            name = f"oxia-{i}"
            listen = f"{self.host}:{public}"
            advertised = self.config.advertised[i] if self.config.advertised else listen
            node = OxiaNode(name, advertised, f"{self.host}:{internal}",
                            self._server_process(name, public, internal), listen=listen)
            self.nodes.append(node)
        for node in self.nodes:
            self._launch(node)
        coordinator_port = ports[-1]
        self._ensure_free("Oxia coordinator", coordinator_port)
        self.coordinator = self._coordinator_process(coordinator_port)
        self.coordinator.start()
        self.wait_ready()

    def stop(self) -> None:
        """The coordinator first, so it does not chase the servers as they stop; then
        the servers all at once (one by one, each would wait for the others' streams).
        One still running after ``STOP_TIMEOUT_S`` is killed: its WAL is on disk."""
        if self.coordinator is not None:
            self.coordinator.stop()
        for node in self.nodes:
            node.process.signal(signal.SIGCONT)  # a paused one could not hear SIGTERM
        stop_together([node.process for node in self.nodes], timeout=STOP_TIMEOUT_S)

    def kill(self, index: int) -> OxiaNode:
        """SIGKILL data server ``index`` (its data stays on disk)."""
        node = self.nodes[index]
        node.process.kill()
        return node

    def pause(self, index: int) -> OxiaNode:
        """SIGSTOP data server ``index``: it holds its connections open and answers
        nothing, as a server cut off by the network or stalled does."""
        node = self.nodes[index]
        node.process.signal(signal.SIGSTOP)
        return node

    def resume(self, index: int) -> OxiaNode:
        node = self.nodes[index]
        node.process.signal(signal.SIGCONT)
        return node

    def restart(self, index: int) -> OxiaNode:
        """Start data server ``index`` again on its ports and data (after :meth:`kill`)."""
        node = self.nodes[index]
        node.process.stop()
        port, internal = (int(a.rsplit(":", 1)[1]) for a in (node.listen, node.internal))
        node.process = self._server_process(node.name, port, internal)
        self._launch(node)
        return node

    # -- processes -------------------------------------------------------------------

    def _metrics_port(self) -> int:
        """A metrics port none of the cluster's servers or other metrics listeners use."""
        taken = self._taken_ports
        port = free_port(self.host, avoid=taken)
        taken.add(port)
        return port

    def _server_process(self, name: str, public: int, internal: int) -> ManagedProcess:
        data = self.base_dir / name
        return ManagedProcess(
            name,
            [
                str(self.binary), "server",
                "--public-addr", f"{self.host}:{public}",
                "--internal-addr", f"{self.host}:{internal}",
                "--metrics-addr", f"{self.host}:{self._metrics_port()}",
                "--data-dir", str(data / "db"),
                "--wal-dir", str(data / "wal"),
            ],
            self.logs_dir / f"{name}.log",
        )

    def _launch(self, node: OxiaNode) -> None:
        for address in (node.listen, node.internal):
            self._ensure_free(f"Oxia server {node.name}", int(address.rsplit(":", 1)[1]))
        node.process.start()
        for address in (node.listen, node.internal):
            host, port = address.rsplit(":", 1)
            wait_until(f"Oxia server {node.name} on {address}",
                       lambda h=host, p=int(port): port_open(h, p),
                       timeout=self.startup_timeout_s, process=node.process)

    def _coordinator_process(self, port: int) -> ManagedProcess:
        conf = self.base_dir / "cluster.yaml"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(self._cluster_yaml())
        return ManagedProcess(
            "oxia-coordinator",
            [
                str(self.binary), "coordinator",
                "--conf", str(conf),
                "--metadata", "file",
                "--file-clusters-status-path", str(self.base_dir / "cluster-status.json"),
                "--internal-addr", f"{self.host}:{port}",
                "--metrics-addr", f"{self.host}:{self._metrics_port()}",
            ],
            self.logs_dir / "oxia-coordinator.log",
        )

    def _cluster_yaml(self) -> str:
        c = self.config
        lines = [
            "namespaces:",
            f"  - name: {self.namespace}",
            f"    initialShardCount: {c.shards}",
            f"    replicationFactor: {c.replication}",
            "servers:",
        ]
        for node in self.nodes:
            lines += [f"  - name: {node.name}",
                      f"    public: {node.public}",
                      f"    internal: {node.internal}"]
        return "\n".join(lines) + "\n"

    # -- readiness -------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every shard has a leader that answers a read."""
        deadline = time.monotonic() + (timeout or self.startup_timeout_s)
        last: Exception | None = None
        while time.monotonic() < deadline:
            for proc in self.processes().values():
                proc.check_alive()
            try:
                if self._all_shards_answer():
                    return
            except Exception as exc:  # not elected yet: the normal "not yet"
                last = exc
            time.sleep(0.25)
        assert self.coordinator is not None
        raise ProcessFailed(
            f"the Oxia cluster did not elect a leader for every shard within "
            f"{timeout or self.startup_timeout_s:.0f}s (last error: {last}); last lines of "
            f"{self.coordinator.log_path}:\n{self.coordinator.log_tail()}")

    def answers(self) -> bool:
        """Whether every shard has a leader that answers a read now (a readiness probe:
        False, never an error, while one is being elected)."""
        try:
            return self._all_shards_answer()
        except Exception:  # not elected yet, or a server is down
            return False

    def _all_shards_answer(self) -> bool:
        from app.stores.oxia import patches as oxia_patches

        client = oxia_patches.connect(self.service_address, namespace=self.namespace,
                                     request_timeout_s=2.0)
        try:
            if len(client._service_discovery.get_all_shards()) != self.config.shards:
                return False
            # A listing without a partition key asks every shard's leader.
            list(client.list("__llog_health__/", "__llog_health__//"))
            return True
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def _ensure_free(self, what: str, port: int) -> None:
        if port_open(self.host, port, timeout=0.2):
            raise ProcessFailed(f"{what} port {self.host}:{port} is already in use; stop "
                                "whatever listens there or choose another port")
