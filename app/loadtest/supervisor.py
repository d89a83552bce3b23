"""The process that owns a run's stack: Oxia, MinIO, the brokers and, with
``stack.proxy``, the load balancer in front of them.

``llog loadtest up`` starts it detached (its own session, no parent-death signal), so
the stack outlives the command that started it. It starts the servers with the same code
as ``llog dev`` (their children die with it), records every pid in ``stack.json``, then
waits. SIGTERM (what ``down`` sends) stops the brokers (they drain while the proxy moves
its clients away), then the proxy, then MinIO and Oxia. A broker that dies (a fault
injected by ``run``, or a crash) is recorded and the rest keep going.

    python -m app.loadtest.supervisor RUN_DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from app.loadtest import rundir
from app.loadtest.precreate import precreate
from app.loadtest.rundir import RunDir, process_ref, write_json
from app.loadtest.scenario import Scenario, from_resolved
from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import ManagedProcess
from app.localstack.proxy import ProxyConfig, find_binary, proxy_process, wait_serving
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings


class ProxyMissing(RuntimeError):
    """The scenario's proxy is not installed on this machine."""


def broker_env(scenario: Scenario, run: RunDir, stack_env: dict[str, str],
               broker: dict[str, Any]) -> dict[str, str]:
    env = dict(stack_env)
    env.update({
        "LLOG_BROKER_ID": broker["id"],
        "LLOG_ROLES": ",".join(broker["roles"]),
        "LLOG_BATCH_MAX_BYTES": str(scenario.batch.max_bytes),
        "LLOG_BATCH_MAX_DELAY_MS": str(scenario.batch.max_delay_ms),
        "LLOG_BATCH_BUFFER_MAX_BYTES": str(scenario.batch.buffer_max_bytes),
        "LLOG_LOADTEST_SCENARIO": json.dumps(scenario.metrics_info(run.run_id)),
    })
    mode = scenario.brokers.tail_cache
    if mode == "auto":
        mode = "per_broker" if broker["workers"] > 1 else "memory"
    if mode == "per_broker":
        env["LLOG_TAIL_CACHE_DIR"] = str(run.stack_data / "tail-cache" / broker["id"])
    elif mode == "shared":
        env["LLOG_TAIL_CACHE_DIR"] = str(run.stack_data / "tail-cache" / "shared")
    env.update(scenario.brokers.env)
    return env


class Supervisor:
    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.doc = run.stack()
        self.scenario = from_resolved(run.resolved())
        self.stop_event = threading.Event()
        self.local: LocalStack | None = None
        self.brokers: dict[str, ManagedProcess] = {}
        self.proxy: ManagedProcess | None = None
        self.lock = threading.Lock()

    def save(self, **changes: Any) -> None:
        with self.lock:
            self.doc.update(changes)
            self.run.write_stack(self.doc)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_event.set()

    def start(self) -> None:
        sc = self.scenario
        ports = self.doc["ports"]
        config = StackConfig(
            data_dir=self.run.stack_data, oxia_port=ports["oxia"],
            oxia_metrics_port=ports["oxia_metrics"], s3_port=ports["s3"],
            s3_console_port=ports["s3_console"], oxia_shards=sc.stack.oxia_shards,
            startup_timeout_s=sc.stack.startup_timeout_s,
        )
        self.local = LocalStack(config)
        self.local.start()
        assert self.local.oxia is not None and self.local.minio is not None
        self.save(
            status="stack-up",
            oxia={**self.doc["oxia"], **process_ref(self.local.oxia.pid),
                  "log": str(self.local.oxia.log_path)},
            minio={**self.doc["minio"], **process_ref(self.local.minio.pid),
                   "log": str(self.local.minio.log_path)},
        )
        if self.stop_event.is_set():
            return
        if sc.stack.precreate:
            result = precreate(self.doc["settings_env"],
                               [(t.name, t.partitions) for t in sc.topics])
            write_json(self.run / rundir.PRECREATE, result)
            self.save(precreated=True)
        self.start_brokers()
        if self.doc.get("proxy") and not self.stop_event.is_set():
            self.start_proxy()
        self.save(status="up", up_at=time.time())

    def start_brokers(self) -> None:
        entries = self.doc["brokers"]
        for entry in entries:
            env = broker_env(self.scenario, self.run, self.doc["settings_env"], entry)
            proc = broker_process(entry["id"], entry["port"], env, Path(entry["log"]),
                                  workers=entry["workers"],
                                  host=entry.get("listen", entry["host"]))
            proc.start()
            self.brokers[entry["id"]] = proc
            entry.update(process_ref(proc.pid))
            entry["status"] = "starting"
        self.save(brokers=entries)
        timeout = self.scenario.brokers.startup_timeout_s
        for entry in entries:
            wait_healthy(self.brokers[entry["id"]], entry["url"], timeout=timeout)
            entry["status"] = "up"
        self.save(brokers=entries)

    def start_proxy(self) -> None:
        """The reference configuration of the scenario's proxy, every broker upstream;
        up once it answers a readiness check through to a broker."""
        entry = self.doc["proxy"]
        binary = find_binary(entry["kind"])
        if binary is None:
            raise ProxyMissing(f"stack.proxy = {entry['kind']!r}: {entry['kind']} is not "
                               "installed here (scripts/bootstrap.sh installs it as root "
                               "with apt-get)")
        max_body = self.scenario.brokers.env.get(
            "LLOG_MAX_REQUEST_BYTES", Settings.model_fields["max_request_bytes"].default)
        config = ProxyConfig(
            kind=entry["kind"], listen_port=entry["port"],
            upstreams=[(b["host"], b["port"]) for b in self.doc["brokers"]],
            max_request_bytes=int(max_body), run_dir=self.run.stack_data / "proxy")
        self.proxy = proxy_process(config, binary, Path(entry["log"]))
        self.proxy.start()
        entry.update(process_ref(self.proxy.pid), status="starting")
        self.save(proxy=entry)
        wait_serving(self.proxy, config, timeout=self.scenario.stack.startup_timeout_s)
        entry["status"] = "up"
        self.save(proxy=entry)

    def watch(self) -> None:
        deadline = time.monotonic() + self.scenario.stack.ttl_s
        while not self.stop_event.wait(0.5):
            if time.monotonic() > deadline:
                self.save(note=f"stopped after its ttl of {self.scenario.stack.ttl_s:.0f}s")
                break
            changed = False
            for entry in self.doc["brokers"]:
                proc = self.brokers.get(entry["id"])
                if proc is not None and entry.get("status") == "up" and not proc.alive():
                    entry["status"] = "exited"
                    entry["exited_at"] = time.time()
                    changed = True
            assert self.local is not None
            for name, proc in (("oxia", self.local.oxia), ("minio", self.local.minio),
                               ("the proxy", self.proxy)):
                if proc is not None and not proc.alive() and self.doc.get("status") == "up":
                    self.doc["status"] = "degraded"
                    self.doc["error"] = f"{name} exited"
                    changed = True
            if changed:
                self.save()

    def shutdown(self) -> None:
        threads = [threading.Thread(target=p.stop, daemon=True) for p in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        for entry in self.doc["brokers"]:
            if entry.get("status") in ("up", "starting"):
                entry["status"] = "stopped"
        if self.proxy is not None:  # after the brokers: it served while they drained
            self.proxy.stop()
            self.doc["proxy"]["status"] = "stopped"
        if self.local is not None:
            self.local.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m app.loadtest.supervisor RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(RunDir(Path(argv[0]).resolve()))
    signal.signal(signal.SIGTERM, sup.on_signal)
    signal.signal(signal.SIGINT, sup.on_signal)
    sup.save(supervisor=process_ref(os.getpid()), status="starting")
    code = 0
    try:
        sup.start()
        if not sup.stop_event.is_set():
            sup.watch()
        sup.save(status="stopping")
    except Exception as exc:  # ProcessFailed, BuildError, storage errors
        traceback.print_exc()
        sup.save(status="failed", error=f"{type(exc).__name__}: {exc}")
        code = 1
    finally:
        sup.shutdown()
        final = "failed" if code else "down"
        sup.save(status=final, down_at=time.time())
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
