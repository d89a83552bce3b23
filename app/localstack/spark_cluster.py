"""A Spark standalone cluster from the pyspark installation's own launcher, and
``spark-submit`` of the jobs to it.

The master and each worker are ``bin/spark-class`` processes (Spark's
``deploy.master.Master`` and ``deploy.worker.Worker``) bound to 127.0.0.1, with their
logs and work directories under the cluster's directory. A job goes to the cluster
through ``bin/spark-submit``: the driver runs ``jobs/spark/submit.py``, and the project's
code reaches the executors as a zip on ``--py-files`` (:func:`code_zip`). The executors'
Python is this one (``PYSPARK_PYTHON``), which has the project's dependencies; a cluster
on other hosts needs them installed there, or a packed environment on ``--archives``
(docs/operations.md, Spark on a cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.localstack.processes import ManagedProcess, free_port, port_open, wait_until

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "jobs")


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def code_zip(target: Path) -> Path:
    """The project's packages as one zip for ``--py-files`` (sources only)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for package in PACKAGES:
            for path in sorted((REPO / package).rglob("*.py")):
                z.write(path, path.relative_to(REPO))
    return target


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.update(extra or {})
    return env


class SparkJobTimeout(RuntimeError):
    """A job submitted to the cluster ran past its time (killed, with its output)."""


@dataclass
class SparkCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    directory: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    startup_timeout_s: float = 90.0
    # Options of the master's and the workers' JVMs (SPARK_DAEMON_JAVA_OPTS).
    daemon_java_options: str = ""
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> None:
        spark_class = str(spark_home() / "bin" / "spark-class")
        logs = self.directory / "logs"
        master = ManagedProcess("spark-master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port)],
            logs / "master.log", env=self._daemon_env())
        self.processes.append(master)
        master.start()
        wait_until("the Spark master", lambda: port_open("127.0.0.1", self.port),
                   timeout=self.startup_timeout_s, process=master)
        for i in range(self.workers):
            work = self.directory / f"worker-{i}"
            worker = ManagedProcess(f"spark-worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(work), "--webui-port", str(free_port()), self.master_url],
                logs / f"worker-{i}.log", env=self._daemon_env())
            self.processes.append(worker)
            worker.start()
        wait_until(f"{self.workers} Spark workers registered", self._all_registered,
                   timeout=self.startup_timeout_s, process=master)

    def _daemon_env(self) -> dict[str, str]:
        extra = {"SPARK_DAEMON_JAVA_OPTS": self.daemon_java_options} \
            if self.daemon_java_options else {}
        return _env(extra)

    def _state(self) -> dict[str, object]:
        """The master's own account of the cluster (its web UI's ``/json/``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                    timeout=5) as r:
            state: dict[str, object] = json.load(r)
        return state

    def alive_workers(self) -> int:
        return int(str(self._state().get("aliveworkers", 0)))

    def completed_applications(self) -> list[str]:
        """Names of the applications that ran on the cluster and finished."""
        apps = self._state().get("completedapps", [])
        return [str(a.get("name")) for a in apps if isinstance(a, dict)] \
            if isinstance(apps, list) else []

    def _all_registered(self) -> bool:
        try:
            return self.alive_workers() >= self.workers
        except OSError:
            return False

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(timeout=20)
        self.processes.clear()

    def submit(self, job_args: Sequence[str], *, env: Mapping[str, str] | None = None,
               conf: Mapping[str, str] | None = None, timeout: float = 600
               ) -> subprocess.CompletedProcess[str]:
        """``spark-submit`` one job (``audit --report …``) to this cluster."""
        return submit(self.master_url, job_args, self.directory / "llog-code.zip",
                      env=env, conf=conf, timeout=timeout)


def submit(master: str, job_args: Sequence[str], zip_path: Path, *,
           env: Mapping[str, str] | None = None, conf: Mapping[str, str] | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``spark-submit --master MASTER --py-files <code zip> jobs/spark/submit.py …``."""
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", master,
            "--py-files", str(code_zip(zip_path))]
    for key, value in (conf or {}).items():
        argv += ["--conf", f"{key}={value}"]
    argv += [str(REPO / "jobs" / "spark" / "submit.py"), *job_args]
    try:
        return subprocess.run(argv, env=_env(env), cwd=REPO, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        # run() killed it; what it printed says how far the job came (its stages, its
        # executors registering), which a bare timeout would not.
        printed = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
        raise SparkJobTimeout(f"spark-submit {' '.join(job_args[:1])} did not finish "
                              f"in {timeout:.0f}s; the last of what it printed:\n"
                              f"{printed[-4000:]}") from None
