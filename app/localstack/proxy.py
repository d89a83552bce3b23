"""A load balancer in front of local brokers: Caddy (built from its pinned Go module, so
no root is needed), or HAProxy and nginx from the OS packages where they are installed.

The configurations are the reference ones in ``deploy/proxy/`` with their placeholders
filled in; docs/operations.md explains each setting.
"""

from __future__ import annotations

import os
import shutil
import signal
import string
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.localstack import binaries
from app.localstack.processes import ManagedProcess, port_open, wait_until

ProxyKind = Literal["caddy", "haproxy", "nginx"]
TEMPLATES = binaries.REPO_ROOT / "deploy" / "proxy"
_FILES = {"caddy": "Caddyfile.tmpl", "haproxy": "haproxy.cfg.tmpl", "nginx": "nginx.conf.tmpl"}
_SYSTEM_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")


@dataclass(frozen=True)
class ProxyConfig:
    kind: ProxyKind
    listen_port: int
    upstreams: list[tuple[str, int]]
    max_request_bytes: int
    run_dir: Path
    listen_host: str = "127.0.0.1"
    # nginx: upstreams taken out of the pool (by port) before their broker restarts;
    # open-source nginx has no active health check to notice a draining broker itself.
    down: frozenset[int] = frozenset()


def render(config: ProxyConfig) -> str:
    """The reference configuration of ``config.kind`` for these ports."""
    servers = {
        "caddy": "",
        "haproxy": "\n".join(f"    server b{i} {h}:{p} check"
                             for i, (h, p) in enumerate(config.upstreams, 1)),
        "nginx": "\n".join(f"        server {h}:{p} max_fails=1 fail_timeout=1s"
                           f"{' down' if p in config.down else ''};"
                           for h, p in config.upstreams),
    }[config.kind]
    template = string.Template((TEMPLATES / _FILES[config.kind]).read_text())
    return template.substitute(
        listen_host=config.listen_host, listen_port=config.listen_port,
        max_request_bytes=config.max_request_bytes, run_dir=config.run_dir,
        upstreams=" ".join(f"{h}:{p}" for h, p in config.upstreams), servers=servers)


def find_binary(kind: ProxyKind) -> Path | None:
    """The proxy's executable: Caddy is built (or found in the cache); HAProxy and nginx
    come from the OS, and are None where they are not installed."""
    if kind == "caddy":
        return binaries.ensure_binary(binaries.CADDY)
    found = shutil.which(kind) or next(
        (str(Path(d) / kind) for d in _SYSTEM_DIRS if (Path(d) / kind).exists()), None)
    return Path(found) if found else None


def proxy_process(config: ProxyConfig, binary: Path, log_path: Path | None = None
                  ) -> ManagedProcess:
    """The proxy as a child process; its output goes to ``log_path`` (by default
    ``proxy.log`` in its run directory)."""
    (config.run_dir / "logs").mkdir(parents=True, exist_ok=True)  # nginx opens it first
    conf = config.run_dir / _FILES[config.kind].removesuffix(".tmpl")
    conf.write_text(render(config))
    argv = {
        "caddy": [str(binary), "run", "--config", str(conf), "--adapter", "caddyfile"],
        "haproxy": [str(binary), "-db", "-f", str(conf)],
        "nginx": [str(binary), "-p", str(config.run_dir), "-c", str(conf)],
    }[config.kind]
    return ManagedProcess(f"proxy-{config.kind}", argv,
                          log_path or config.run_dir / "proxy.log")


def reload(proc: ManagedProcess, config: ProxyConfig) -> None:
    """Rewrite the configuration and have nginx load it: new workers take the new pool,
    the old ones finish what they were serving."""
    assert config.kind == "nginx", "Caddy and HAProxy follow readiness on their own"
    conf = config.run_dir / _FILES[config.kind].removesuffix(".tmpl")
    conf.write_text(render(config))
    os.kill(proc.pid, signal.SIGHUP)


def wait_serving(proc: ManagedProcess, config: ProxyConfig, timeout: float = 30.0) -> None:
    """Until the proxy answers a readiness check through to a broker."""
    url = f"http://{config.listen_host}:{config.listen_port}/health/ready"

    def ready() -> bool:
        if not port_open(config.listen_host, config.listen_port):
            return False
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)

    wait_until(f"{config.kind} on port {config.listen_port}", ready, timeout=timeout,
               process=proc)
