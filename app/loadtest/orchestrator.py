"""``llog loadtest up|status|precreate|run|down``: the run lifecycle.

``up`` prepares ``results/<utc-timestamp>-<scenario>/`` (resolved scenario, stack.json
with ports and broker layout, routing manifest, git and environment snapshots) and
starts the supervisor (app/loadtest/supervisor.py) detached; the supervisor starts Oxia
and MinIO, pre-creates the partitions if the scenario says so, starts the brokers and
records every pid in stack.json. ``run`` brings a stack up if none is running for the
scenario, starts the collector, runs the hammer (and any scheduled faults), takes a
final sample, writes summary.json and report.html, and stops the stack it started
unless the scenario (or ``--keep``) keeps it. ``down`` stops a run's processes by the
pids in stack.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from app.loadtest import rundir
from app.loadtest.collector import Collector
from app.loadtest.hammer import HammerError, build_hammer, hammer_config, start_hammer
from app.loadtest.precreate import precreate
from app.loadtest.report import render_report
from app.loadtest.routing import build_manifest
from app.loadtest.rundir import (
    DEFAULT_RESULTS,
    RunDir,
    kill_ref,
    latest_run_dir,
    new_run_dir,
    process_ref,
    read_json,
    read_jsonl,
    ref_alive,
    wait_gone,
    write_json,
)
from app.loadtest.scenario import Scenario, from_resolved, resolved
from app.loadtest.snapshots import environment_snapshot, git_snapshot
from app.loadtest.summary import artifact_presence, build_summary
from app.loadtest.verify import verify_acked
from app.localstack.binaries import REPO_ROOT
from app.localstack.processes import free_ports
from app.localstack.proxy import find_binary
from app.localstack.stack import LocalStack, StackConfig

COMPOSE_FILE_SD = REPO_ROOT / "deploy" / "prometheus" / "file_sd"
_ARTIFACTS_OF_A_RUN = (rundir.HAMMER_CONFIG, rundir.CLIENT_INTERVALS, rundir.CLIENT_SUMMARY,
                       rundir.REMAP_EVENTS, rundir.RETRY_EVENTS, rundir.ACKED, rundir.METRICS,
                       rundir.METRICS_FINAL, rundir.SUMMARY, rundir.REPORT, rundir.VERIFY,
                       rundir.FAULTS)


class LoadTestError(RuntimeError):
    """A load-test step failed; the message says which and where to look."""


def log(message: str) -> None:
    print(f"llog loadtest: {message}", flush=True)


# -- up ------------------------------------------------------------------------------


def _initial_stack(run: RunDir, scenario: Scenario) -> dict[str, Any]:
    # Every port of the run at once, all different (the supervisor binds them later).
    names = ["oxia", "oxia_metrics", "s3", "s3_console",
             *(f"broker:{bid}" for bid in scenario.broker_ids()),
             *(["proxy"] if scenario.stack.proxy != "none" else [])]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    config = StackConfig(data_dir=run.stack_data, oxia_port=ports["oxia"],
                         s3_port=ports["s3"], oxia_shards=scenario.stack.oxia_shards)
    local = LocalStack(config)
    brokers = []
    for bid in scenario.broker_ids():
        port = ports[f"broker:{bid}"]
        brokers.append({
            "id": bid, "host": "127.0.0.1", "listen": scenario.brokers.host, "port": port, "url": f"http://127.0.0.1:{port}",
            "workers": scenario.brokers.workers, "roles": scenario.roles_of(bid),
            "log": str(run.logs / f"broker-{bid}.log"), "status": "pending",
        })
    proxy = None
    if scenario.stack.proxy != "none":
        proxy = {"kind": scenario.stack.proxy, "port": ports["proxy"],
                 "url": f"http://127.0.0.1:{ports['proxy']}",
                 "log": str(run.logs / f"proxy-{scenario.stack.proxy}.log"),
                 "status": "pending"}
    return {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "scenario": scenario.name,
        "status": "created",
        "created_at": time.time(),
        "keep": scenario.stack.keep,
        "ports": ports,
        "oxia": {"address": local.oxia_address, "namespace": config.oxia_namespace,
                 "metrics": f"127.0.0.1:{ports['oxia_metrics']}", "shards": config.oxia_shards},
        "minio": {"endpoint": local.s3_endpoint, "bucket": config.bucket,
                  "region": config.region, "access_key": config.access_key,
                  "secret_key": config.secret_key},
        "root_prefix": config.root_prefix,
        "settings_env": local.settings_env(),
        "brokers": brokers,
        "proxy": proxy,
        "logs": str(run.logs),
    }


def prepare(scenario: Scenario, results: Path = DEFAULT_RESULTS) -> RunDir:
    """Create the run directory and every file that describes the run before it starts."""
    run = new_run_dir(results, scenario.name)
    write_json(run / rundir.RESOLVED, resolved(scenario))
    write_json(run / rundir.GIT, git_snapshot())
    write_json(run / rundir.ENVIRONMENT, environment_snapshot())
    write_json(run / rundir.MANIFEST, build_manifest(scenario))
    run.write_stack(_initial_stack(run, scenario))
    return run


def _supervisor_log_tail(run: RunDir, lines: int = 25) -> str:
    try:
        text = (run.logs / "supervisor.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_supervisor(run: RunDir) -> None:
    scenario = from_resolved(run.resolved())
    with (run.logs / "supervisor.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.loadtest.supervisor", str(run.path)],
            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=os.environ.copy(),
        )
    # Reap it when it exits (it outlives us if we exit first: that is the point).
    threading.Thread(target=proc.wait, name="supervisor-reaper", daemon=True).start()
    # Binaries may have to be built on a first run: allow for it.
    deadline = time.monotonic() + scenario.stack.startup_timeout_s \
        + scenario.brokers.startup_timeout_s + 900
    while time.monotonic() < deadline:
        doc = run.stack()
        status = doc.get("status")
        if status == "up":
            return
        if status in ("failed", "down") or proc.poll() is not None:
            time.sleep(0.2)
            doc = run.stack()
            detail = doc.get("error") or (f"last lines of {run.logs / 'supervisor.log'}:\n"
                                          f"{_supervisor_log_tail(run)}")
            raise LoadTestError(f"the stack of {run.run_id} did not come up (status "
                                f"{doc.get('status')}): {detail}")
        time.sleep(0.2)
    down(run)
    raise LoadTestError(f"the stack of {run.run_id} was not up in time; stopped it")


def up(scenario: Scenario, results: Path = DEFAULT_RESULTS) -> RunDir:
    kind = scenario.stack.proxy
    # Caddy is built on demand (by the supervisor); the others must be installed.
    if kind in ("haproxy", "nginx") and find_binary(kind) is None:
        raise LoadTestError(f"stack.proxy = {kind!r}: {kind} is not installed here "
                            "(scripts/bootstrap.sh installs it as root with apt-get)")
    run = prepare(scenario, results)
    log(f"run directory {run.path}")
    started = time.monotonic()
    start_supervisor(run)
    write_file_sd(run, scenario)
    doc = run.stack()
    log(f"stack up in {time.monotonic() - started:.1f}s: Oxia {doc['oxia']['address']}, "
        f"S3 {doc['minio']['endpoint']}, brokers "
        + ", ".join(f"{b['id']}={b['url']}" for b in doc["brokers"])
        + (f"; {doc['proxy']['kind']} in front on {doc['proxy']['url']}"
           if doc.get("proxy") else ""))
    return run


# -- observability -------------------------------------------------------------------


def _targets(run: RunDir, scenario: Scenario, host: str | None = None) -> list[dict[str, Any]]:
    doc = run.stack()
    return [{"targets": [f"{host or b['host']}:{b['port']}"],
             "labels": {"run": run.run_id, "scenario": scenario.name, "broker_id": b["id"]}}
            for b in doc["brokers"]]


def _published_file_sd(run: RunDir) -> list[Path]:
    return [run.path.parent / "file_sd" / f"{run.run_id}.json",
            COMPOSE_FILE_SD / f"{run.run_id}.json"]


def write_file_sd(run: RunDir, scenario: Scenario) -> None:
    """Prometheus file-based service discovery of the run's brokers.

    - ``prometheus-targets.json`` and a standalone ``prometheus.yml`` in the run dir;
    - ``results/file_sd/<run>.json`` for deploy/prometheus/prometheus-loadtest.yml;
    - with ``observability.compose_file_sd``, deploy/prometheus/file_sd/<run>.json,
      addressed through ``observability.docker_host``, for the compose Prometheus.
    The published copies are removed again by ``down``.
    """
    targets = _targets(run, scenario)
    write_json(run / rundir.FILE_SD, targets)
    (run / rundir.PROMETHEUS).write_text(
        "# Prometheus for this run: prometheus --config.file=prometheus.yml\n"
        "global:\n  scrape_interval: 5s\n  scrape_timeout: 4s\n"
        "scrape_configs:\n  - job_name: llog-loadtest\n"
        "    metrics_path: /metrics/prometheus\n    file_sd_configs:\n"
        f"      - files: [{json.dumps(str(run / rundir.FILE_SD))}]\n"
        "        refresh_interval: 5s\n")
    shared, compose = _published_file_sd(run)
    shared.parent.mkdir(parents=True, exist_ok=True)
    write_json(shared, targets)
    if scenario.observability.compose_file_sd:
        COMPOSE_FILE_SD.mkdir(parents=True, exist_ok=True)
        write_json(compose, _targets(run, scenario, scenario.observability.docker_host))


# -- status, precreate, down ---------------------------------------------------------


def _healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


def status(run: RunDir) -> dict[str, Any]:
    doc = run.stack()
    processes = {name: {"pid": doc[name].get("pid"), "alive": ref_alive(doc[name])}
                 for name in ("supervisor", "oxia", "minio") if isinstance(doc.get(name), dict)}
    brokers = [{"id": b["id"], "url": b["url"], "pid": b.get("pid"),
                "alive": ref_alive(b), "healthy": _healthy(b["url"]),
                "recorded_status": b.get("status")} for b in doc.get("brokers", [])]
    proxy = doc.get("proxy")
    if isinstance(proxy, dict):
        proxy = {"kind": proxy["kind"], "url": proxy["url"], "pid": proxy.get("pid"),
                 "alive": ref_alive(proxy), "healthy": _healthy(proxy["url"])}
    return {"run_id": run.run_id, "run_dir": str(run.path), "scenario": doc.get("scenario"),
            "status": doc.get("status"), "error": doc.get("error"),
            "stack_up": stack_up(run), "processes": processes, "brokers": brokers,
            "proxy": proxy,
            "oxia": doc.get("oxia", {}).get("address"),
            "s3": doc.get("minio", {}).get("endpoint")}


def stack_up(run: RunDir) -> bool:
    doc = run.stack()
    proxy = doc.get("proxy")
    return doc.get("status") == "up" and ref_alive(doc.get("supervisor")) \
        and ref_alive(doc.get("oxia")) and ref_alive(doc.get("minio")) \
        and (proxy is None or ref_alive(proxy))


def precreate_run(run: RunDir) -> dict[str, Any]:
    doc = run.stack()
    if not ref_alive(doc.get("oxia")):
        raise LoadTestError(f"Oxia of {run.run_id} is not running (status "
                            f"{doc.get('status')}); start the stack with `up` first")
    scenario = from_resolved(run.resolved())
    result = precreate(doc["settings_env"], [(t.name, t.partitions) for t in scenario.topics])
    write_json(run / rundir.PRECREATE, result)
    log(f"pre-created {result['partitions']} partitions in {result['seconds']}s")
    return result


def down(run: RunDir, timeout: float = 60.0) -> dict[str, Any]:
    """Stop every process of the run by its recorded pid (supervisor first)."""
    doc = run.stack()
    stopped: list[str] = []
    sup = doc.get("supervisor")
    if ref_alive(sup):
        assert sup is not None
        os.kill(int(sup["pid"]), signal.SIGTERM)
        wait_gone([sup], timeout)
        stopped.append("supervisor")
    doc = run.stack()  # the supervisor's last word
    refs = {name: doc[name] for name in ("supervisor", "oxia", "minio")
            if isinstance(doc.get(name), dict)}
    refs.update({f"broker:{b['id']}": b for b in doc.get("brokers", [])})
    if isinstance(doc.get("proxy"), dict):
        refs["proxy"] = doc["proxy"]
    leftovers = {name: ref for name, ref in refs.items() if ref_alive(ref)}
    for ref in leftovers.values():
        kill_ref(ref, signal.SIGTERM)
    if leftovers and not wait_gone(list(leftovers.values()), 15):
        for ref in leftovers.values():
            kill_ref(ref, signal.SIGKILL)
        wait_gone(list(leftovers.values()), 5)
    stopped.extend(leftovers)
    for path in _published_file_sd(run):
        path.unlink(missing_ok=True)
    if doc.get("status") not in ("down", "failed"):
        doc["status"] = "down"
    doc["down_at"] = doc.get("down_at") or time.time()
    run.write_stack(doc)
    still = [n for n, r in refs.items() if ref_alive(r)]
    return {"run_id": run.run_id, "stopped": stopped, "still_running": still}


# -- run -----------------------------------------------------------------------------


def _archive_previous(run: RunDir) -> None:
    present = [n for n in _ARTIFACTS_OF_A_RUN if (run / n).exists()]
    if not present:
        return
    target = run.path / "previous" / rundir.utc_stamp()
    target.mkdir(parents=True, exist_ok=True)
    for name in present:
        (run / name).replace(target / name)
    log(f"this stack ran before; earlier artifacts moved to {target}")


class _Faults(threading.Thread):
    """Kills brokers at scheduled times after the hammer started (scenario ``faults``)."""

    def __init__(self, rd: RunDir, scenario: Scenario, t0: float) -> None:
        super().__init__(name="faults", daemon=True)
        self.rd, self.scenario, self.t0 = rd, scenario, t0
        self.done = threading.Event()

    def run(self) -> None:
        for fault in sorted(self.scenario.faults, key=lambda f: f.at_s):
            if self.done.wait(max(0.0, self.t0 + fault.at_s - time.time())):
                return
            broker = next(b for b in self.rd.stack()["brokers"]
                          if b["id"] == fault.kill_broker)
            killed = kill_ref(broker, signal.SIGKILL)
            event = {"ts": time.time(), "at_s": round(time.time() - self.t0, 3),
                     "event": "kill_broker", "broker": fault.kill_broker,
                     "pid": broker.get("pid"), "signal": "SIGKILL", "delivered": killed}
            with (self.rd / rundir.FAULTS).open("a") as out:
                out.write(json.dumps(event) + "\n")
            log(f"fault: killed broker {fault.kill_broker} (pid {broker.get('pid')})")


def _reader_url(run: RunDir) -> str | None:
    for broker in run.stack()["brokers"]:
        if "read" in broker["roles"] and _healthy(broker["url"]):
            return str(broker["url"])
    return None


def execute(run: RunDir, binary: Path) -> dict[str, Any]:
    """Collector, hammer, faults, final sample, read-back, summary.json and report.html."""
    scenario = from_resolved(run.resolved())
    manifest = read_json(run / rundir.MANIFEST)
    _archive_previous(run)
    config = hammer_config(run, scenario, run.stack(), manifest)
    hammer_ref: dict[str, Any] = {}
    collector = Collector(run, scenario.collector.interval_s,
                          extra_processes=lambda: {"hammer": hammer_ref} if hammer_ref else {})
    collector.start()
    t0 = time.time()
    proc = start_hammer(binary, run, config)
    hammer_ref.update(process_ref(proc.pid))
    faults = _Faults(run, scenario, t0)
    faults.start()
    w = scenario.workload
    limit = w.duration_s + scenario.consumer.drain_timeout_s + w.longest_request_s + 60
    log(f"hammer running for {w.duration_s:g}s ({w.mode} loop, {w.connections} connections"
        + (f", {w.rate:g} req/s" if w.mode == "open" else "") + ")")
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        log(f"the hammer did not finish within {limit:.0f}s and was killed")
    finally:
        faults.done.set()
    collector.stop()
    extra: dict[str, Any] = {"hammer_exit_code": code, "hammer_binary": binary.name}
    if code != 0:
        log(f"hammer exited with {code}; see {run.logs / 'hammer.log'}")
    if scenario.hammer.record_acks and (run / rundir.ACKED).is_file():
        url = _reader_url(run)
        if url is None:
            extra["verify"] = {"ok": False, "error": "no healthy broker with the read role"}
        else:
            extra["verify"] = verify_acked(run / rundir.ACKED, url)
        write_json(run / rundir.VERIFY, extra["verify"])
    return finish(run, scenario, extra)


def finish(run: RunDir, scenario: Scenario, extra: dict[str, Any]) -> dict[str, Any]:
    samples = read_jsonl(run / rundir.METRICS)
    summary = build_summary(run, scenario, samples, extra)
    summary["artifacts"] = {}
    (run / rundir.REPORT).write_text(render_report(run, summary, run.resolved()))
    write_json(run / rundir.SUMMARY, summary)
    summary["artifacts"] = artifact_presence(run, scenario)
    missing = [k for k, v in summary["artifacts"].items() if not v]
    if missing:
        summary["warnings"].append(f"missing artifacts: {', '.join(missing)}")
    (run / rundir.REPORT).write_text(render_report(run, summary, run.resolved()))
    write_json(run / rundir.SUMMARY, summary)
    return summary


def run_scenario(scenario: Scenario | None, *, run_dir: RunDir | None = None,
                 results: Path = DEFAULT_RESULTS, keep: bool | None = None
                 ) -> tuple[RunDir, dict[str, Any]]:
    """``run``: reuse the live stack of ``run_dir`` (or of the scenario's latest run), or
    bring one up; then load, measure, summarise, and stop the stack if we started it."""
    started_here = False
    binary_box: dict[str, Any] = {}

    def build() -> None:
        try:
            binary_box["path"] = build_hammer()
        except Exception as exc:
            binary_box["error"] = exc

    builder = threading.Thread(target=build, name="hammer-build", daemon=True)
    builder.start()
    if run_dir is None and scenario is not None:
        latest = latest_run_dir(results, scenario.name)
        if latest is not None and stack_up(latest):
            run_dir = latest
            log(f"using the running stack of {latest.run_id}")
    if run_dir is not None:
        run = run_dir
        if not stack_up(run):
            raise LoadTestError(f"the stack of {run.run_id} is not up "
                                f"(status {run.stack().get('status')}); run `up` or start "
                                "a new run without --run-dir")
    else:
        assert scenario is not None
        run = up(scenario, results)
        started_here = True
    resolved_scenario = from_resolved(run.resolved())
    keep_stack = resolved_scenario.stack.keep if keep is None else keep
    try:
        builder.join()
        if "error" in binary_box:
            raise HammerError(str(binary_box["error"]))
        summary = execute(run, binary_box["path"])
    finally:
        if started_here and not keep_stack:
            result = down(run)
            log(f"stack stopped ({', '.join(result['stopped']) or 'nothing was running'})")
        elif started_here:
            log(f"stack kept; stop it with: llog loadtest down --run-dir {run.path}")
    return run, summary
