"""A reference load balancer (Caddy, HAProxy or nginx, deploy/proxy/) in front of test
brokers, for as long as a ``with`` block runs."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.localstack.processes import ManagedProcess, free_port
from app.localstack.proxy import (
    ProxyConfig,
    ProxyKind,
    find_binary,
    proxy_process,
    reload,
    wait_serving,
)
from tests.helpers.stack import Broker


@dataclass
class Proxy:
    url: str
    config: ProxyConfig
    process: ManagedProcess

    def set_down(self, broker: Broker | None) -> None:
        """nginx only: take ``broker`` out of the pool (None: put everyone back)."""
        down = frozenset() if broker is None else frozenset({port_of(broker)})
        self.config = dataclasses.replace(self.config, down=down)
        reload(self.process, self.config)


def port_of(broker: Broker) -> int:
    return int(broker.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def behind(kind: ProxyKind, brokers: list[Broker], run_dir: Path, *,
           spare_ports: Iterable[int] = ()) -> Iterator[Proxy]:
    """``kind`` in front of ``brokers``; ``spare_ports``: more upstreams in its pool
    with no broker yet (one started there later is routed to once it is ready, as a
    broker an operator adds to a pool that already names it)."""
    binary = find_binary(kind)
    if binary is None:
        pytest.skip(f"{kind} is not installed here (scripts/bootstrap.sh installs it as "
                    "root with apt-get)")
    upstreams = [("127.0.0.1", port_of(b)) for b in brokers]
    upstreams += [("127.0.0.1", p) for p in spare_ports]
    config = ProxyConfig(kind, free_port(), upstreams, 16 * 1024 * 1024, run_dir)
    proc = proxy_process(config, binary)
    proc.start()
    try:
        wait_serving(proc, config)
        yield Proxy(f"http://127.0.0.1:{config.listen_port}", config, proc)
    finally:
        proc.stop()
