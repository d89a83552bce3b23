"""`llog dev` brings the stack up, describes it in stack.json, and stops every child; every
`llog` command answers --help."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import oxia
import psutil
import pytest

from app.localstack import dev
from app.localstack.processes import free_ports
from tests.helpers.auth import Keys

pytestmark = pytest.mark.slow
# `llog dev` runs servers of its own: those tests go one at a time with the others that do.
OWN_SERVERS = pytest.mark.own_servers

HELP_COMMANDS = [[], ["dev"], ["serve"], ["compactor"], ["compact-once"], ["servers"],
                 ["servers", "build"], ["loadtest"], ["loadtest", "run"], ["spark"],
                 ["auth"], ["auth", "new-key"], ["auth", "check"]]

STACK_FIELDS = {
    "broker_url", "oxia_address", "oxia_namespace", "s3_endpoint", "s3_bucket", "s3_region",
    "s3_access_key", "s3_secret_key", "root_prefix", "pids", "brokers", "proxy", "compactor",
}


def _alive(pid: int) -> bool:
    try:
        # A zombie still has a pid; it has exited all the same.
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_dev(data_dir: Path, ports: dict[str, int], *more: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "dev", "--data-dir", str(data_dir),
         "--port", str(ports["broker"]), "--oxia-port", str(ports["oxia"]),
         "--s3-port", str(ports["s3"]), *more],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})},
    )


def _wait_ready(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # bounded by the test timeout
        seen.append(line)
        if "Ctrl-C stops everything" in line:
            return "".join(seen)
    raise AssertionError("llog dev exited early:\n" + "".join(seen))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def _ports() -> dict[str, int]:
    """The ports of one `llog dev`, chosen together: all different."""
    return dict(zip(("broker", "oxia", "s3"), free_ports(3), strict=True))


@OWN_SERVERS
def test_llog_dev_lifecycle_and_persistence(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    ports = _ports()
    key = f"dev-test/{uuid.uuid4().hex}"

    proc = _start_dev(data_dir, ports)
    try:
        output = _wait_ready(proc)
        stack = json.loads((data_dir / "stack.json").read_text())
        assert set(stack) == STACK_FIELDS
        assert stack["oxia_address"] == f"127.0.0.1:{ports['oxia']}"
        assert stack["s3_endpoint"] == f"http://127.0.0.1:{ports['s3']}"
        assert stack["s3_bucket"] == "leaderless-log-wal"
        assert stack["root_prefix"] == "llog"
        pids = stack["pids"]
        assert {"oxia", "minio"} <= set(pids)
        assert all(_alive(pid) for pid in pids.values())
        if stack["broker_url"] is not None:
            assert "curl" in output
            # The console's URL is printed, and it answers there.
            assert f"console on {stack['broker_url']}/console" in output
            page = httpx.get(f"{stack['broker_url']}/console", timeout=10)
            assert page.status_code == 200 and "llog console" in page.text
        client = oxia.Client(stack["oxia_address"])
        try:
            client.put(key, b"kept")
        finally:
            client.close()
    finally:
        _stop(proc)
    assert not any(_alive(pid) for pid in pids.values()), "a child outlived llog dev"

    # A second run on the same data directory keeps the data.
    proc = _start_dev(data_dir, ports)
    try:
        _wait_ready(proc)
        client = oxia.Client(f"127.0.0.1:{ports['oxia']}")
        try:
            assert client.get(key)[1] == b"kept"
        finally:
            client.close()
    finally:
        _stop(proc)


def _produced_by(broker_url: str) -> int:
    text = httpx.get(f"{broker_url}/metrics/prometheus", timeout=30).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith('llog_produce_requests_total{status="200"}'))


def _forwarded_by(broker_url: str) -> int:
    text = httpx.get(f"{broker_url}/metrics/prometheus", timeout=30).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("llog_affinity_groups_total{")
               and 'route="forwarded"' in line)


def _until_members(broker_url: str, members: set[str]) -> None:
    """Until GET /cluster at ``broker_url`` lists ``members`` (a member lists the
    others every LLOG_MEMBERSHIP_REFRESH_S: polled, bounded)."""
    deadline = time.monotonic() + 60
    while True:
        seen = {m["member_id"] for m in httpx.get(f"{broker_url}/cluster",
                                                  timeout=30).json()["members"]}
        if seen == members:
            return
        assert time.monotonic() < deadline, f"{broker_url} sees {seen}, not {members}"
        time.sleep(0.2)


@OWN_SERVERS
def test_llog_dev_compacts_in_a_compactor_beside_the_broker(tmp_path: Path) -> None:
    """The broker of ``llog dev`` only writes and reads; the compactor it runs beside it
    compacts what was written, and stops with it."""
    data_dir = tmp_path / "dev"
    ports = _ports()
    proc = _start_dev(data_dir, ports, env={"LLOG_COMPACTION_MIN_ENTRY_AGE_MS": "0",
                                            "LLOG_COMPACTION_INTERVAL_S": "0.2",
                                            "LLOG_COMPACTION_DISCOVERY_INTERVAL_S": "0.5"})
    try:
        _wait_ready(proc)
        stack = json.loads((data_dir / "stack.json").read_text())
        compactor = stack["compactor"]
        assert compactor["pid"] in stack["pids"].values() and _alive(compactor["pid"])
        assert psutil.Process(compactor["pid"]).nice() == dev.COMPACTOR_NICE  # broker first
        broker = stack["brokers"][0]["url"]
        with httpx.Client(timeout=30) as client:
            for i in range(3):  # three WAL objects: something to compact
                client.post(f"{broker}/produce", json={"topic_partitions": [{
                    "topic": "dev-compacted", "partition": 0,
                    "records": [f"r{i}-{j}" for j in range(10)]}]}).raise_for_status()
            deadline = time.monotonic() + 120  # an outer bound; the compactor polls often
            while _compacted_records(client, compactor["url"]) < 30:
                assert time.monotonic() < deadline, "the compactor compacted nothing"
                time.sleep(0.2)
    finally:
        _stop(proc)
    assert not _alive(compactor["pid"]), "the compactor outlived llog dev"


def _compacted_records(client: httpx.Client, url: str) -> float:
    metrics = client.get(f"{url}/metrics").json().get("metrics", {})
    return sum(float(v) for v in metrics.get("llog_compaction_records_total", {}).values())


@OWN_SERVERS
def test_llog_dev_runs_several_brokers_behind_caddy(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    ports = _ports()
    proc = _start_dev(data_dir, ports, "--brokers", "2")
    try:
        output = _wait_ready(proc)
        assert "2 brokers behind Caddy" in output
        stack = json.loads((data_dir / "stack.json").read_text())
        url = f"http://127.0.0.1:{ports['broker']}"
        assert stack["broker_url"] == url
        assert stack["proxy"]["kind"] == "caddy" and stack["proxy"]["url"] == url
        assert [b["name"] for b in stack["brokers"]] == ["b1", "b2"]
        assert {b["pid"] for b in stack["brokers"]} | {stack["proxy"]["pid"]} <= set(
            stack["pids"].values())
        # Affinity: each broker is a cluster member, and each sees the other.
        members = {"broker-dev-b1.w0", "broker-dev-b2.w0"}
        for b in stack["brokers"]:
            _until_members(b["url"], members)
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(20):
                r = client.post("/produce", json={"topic_partitions": [
                    {"topic": "dev-lb", "partition": 0, "records": [f"r{i}"]}]})
                assert r.status_code == 200 and r.json()["results"][0]["ok"]
        # Topics created on use store their records compressed, as llog dev ships.
        with httpx.Client(base_url=url, timeout=30) as client:
            described = client.get("/topics/dev-lb").json()
        assert (described["compression"], described["compression_level"]) == ("zstd", 1)
        # Round robin: both brokers took produce requests; the one that does not prefer
        # partition 0 forwarded its records to the one that does.
        assert all(_produced_by(b["url"]) > 0 for b in stack["brokers"])
        assert sum(_forwarded_by(b["url"]) for b in stack["brokers"]) > 0
        pids = stack["pids"]
    finally:
        _stop(proc)
    assert not any(_alive(pid) for pid in pids.values()), "a child outlived llog dev"


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: " ".join(c) or "llog")
def test_every_command_answers_help(command: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "app.cli", *command, "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {' '.join(['llog', *command])}")


@OWN_SERVERS
def test_llog_dev_with_access_control_serves_groups_to_a_token(tmp_path: Path) -> None:
    """LLOG_AUTH=on turns access control on for the brokers of ``llog dev``."""
    keys = Keys()
    keys.new("app")
    stored = keys.entries["app"]
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(f'[principals.app]\nkeys = ["{stored}"]\n'
                         'produce = ["dev-*"]\nconsume = ["dev-*"]\ngroup = ["dev-*"]\n')
    ports = _ports()
    proc = _start_dev(tmp_path / "dev", ports,
                      env={"LLOG_AUTH": "on", "LLOG_AUTH_FILE": str(auth_file)})
    token = {"authorization": f"Bearer {keys.tokens['app']}"}
    produce = {"topic_partitions": [{"topic": "dev-auth", "partition": 0,
                                     "records": ["a", "b"]}]}
    try:
        _wait_ready(proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{ports['broker']}", timeout=30) as http:
            refused = http.post("/produce", json=produce)
            assert refused.status_code == 401, refused.text
            assert refused.json()["error_type"] == "Unauthenticated"
            assert http.post("/produce", json=produce, headers=token).status_code == 200
            r = http.post("/groups/dev-g/join", json={"topics": ["dev-auth"]}, headers=token)
            assert r.status_code == 200, r.text
            r = http.post("/consume", headers=token, json={
                "topic_partitions": [{"topic": "dev-auth", "partition": 0,
                                      "fetch_offset": "committed"}],
                "group": "dev-g", "max_wait_ms": 0, "commit": True,
                "member_id": r.json()["member_id"], "generation": r.json()["generation"]})
            assert r.status_code == 200, r.text
            assert [x["value"] for x in r.json()["results"][0]["records"]] == ["a", "b"]
            described = http.get("/groups/dev-g", headers=token).json()
            assert described["partitions"][0]["committed_offset"] == 2
            assert http.get("/groups/other", headers=token).status_code == 403
    finally:
        _stop(proc)
