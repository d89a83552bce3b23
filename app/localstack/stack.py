"""Real Oxia and MinIO servers on loopback: the stack behind `llog dev` and the tests."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.localstack import binaries
from app.localstack.oxia_cluster import OxiaCluster, OxiaClusterConfig
from app.localstack.processes import (
    ManagedProcess,
    ProcessFailed,
    free_port,
    free_ports,
    port_open,
    wait_until,
)

DEV_ACCESS_KEY = "llog-dev"
DEV_SECRET_KEY = "llog-dev-secret"


@dataclass
class StackConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    oxia_port: int = 6648
    oxia_metrics_port: int | None = None
    s3_port: int = 9000
    s3_console_port: int | None = None
    bucket: str = "leaderless-log-wal"
    region: str = "us-east-1"
    access_key: str = DEV_ACCESS_KEY
    secret_key: str = DEV_SECRET_KEY
    root_prefix: str = "llog"
    oxia_namespace: str = "default"
    oxia_shards: int = 1
    # None: one `oxia standalone`; else Oxia's coordinator and data servers (its module).
    oxia_cluster: OxiaClusterConfig | None = None
    # MinIO drives: 1 is a plain directory; 4 or more, erasure coding across them.
    s3_drives: int = 1
    startup_timeout_s: float = 60.0

    @classmethod
    def ephemeral(cls, data_dir: Path, **overrides: Any) -> StackConfig:
        """A config on free ports, for tests and load-test runs."""
        oxia_port, s3_port = free_ports(2)
        values: dict[str, Any] = {"oxia_port": oxia_port, "s3_port": s3_port}
        values.update(overrides)
        return cls(data_dir=data_dir, **values)


@dataclass
class LocalStack:
    config: StackConfig
    oxia: ManagedProcess | None = None
    minio: ManagedProcess | None = None
    oxia_cluster: OxiaCluster | None = None
    extra: dict[str, ManagedProcess] = field(default_factory=dict)

    @property
    def oxia_address(self) -> str:
        """Where clients find Oxia: with a cluster, every data server, comma separated."""
        if self.oxia_cluster is not None:
            return self.oxia_cluster.service_address
        return f"{self.config.host}:{self.config.oxia_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.config.host}:{self.config.s3_port}"

    def settings_env(self) -> dict[str, str]:
        """``LLOG_*`` variables that point a broker, compactor or job at this stack."""
        c = self.config
        return {
            "LLOG_OXIA_ADDRESS": self.oxia_address,
            "LLOG_OXIA_NAMESPACE": c.oxia_namespace,
            "LLOG_S3_ENDPOINT": self.s3_endpoint,
            "LLOG_S3_BUCKET": c.bucket,
            "LLOG_S3_REGION": c.region,
            "LLOG_S3_ACCESS_KEY": c.access_key,
            "LLOG_S3_SECRET_KEY": c.secret_key,
            "LLOG_ROOT_PREFIX": c.root_prefix,
        }

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        paths = binaries.ensure(binaries.STACK)
        try:
            self._start_oxia(paths["oxia"])
            self._start_minio(paths["minio"])
            self.create_bucket()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in [*self.extra.values(), self.minio, self.oxia]:
            if proc is not None:
                proc.stop()
        if self.oxia_cluster is not None:
            self.oxia_cluster.stop()

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def processes(self) -> dict[str, ManagedProcess]:
        """Every server process of the stack (and ``extra``), by name."""
        out = {"oxia": self.oxia, "minio": self.minio}
        if self.oxia_cluster is not None:
            out.update(self.oxia_cluster.processes())
        return {name: p for name, p in {**out, **self.extra}.items() if p is not None}

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes().items() if p.alive()}

    # -- Oxia ------------------------------------------------------------------------

    def _start_oxia(self, binary: Path) -> None:
        c = self.config
        base = c.data_dir / "oxia"
        if c.oxia_cluster is not None:
            self.oxia_cluster = OxiaCluster(
                binary, base, c.data_dir / "logs", c.oxia_cluster, host=c.host,
                first_port=c.oxia_port, namespace=c.oxia_namespace,
                startup_timeout_s=c.startup_timeout_s)
            self.oxia_cluster.start()
            return
        metrics_port = c.oxia_metrics_port or free_port(c.host, avoid={c.oxia_port, c.s3_port})
        self.oxia = ManagedProcess(
            "oxia",
            [
                str(binary),
                "standalone",
                "--data-dir", str(base / "db"),
                "--wal-dir", str(base / "wal"),
                "--public-addr", self.oxia_address,
                "--metrics-addr", f"{c.host}:{metrics_port}",
                "--shards", str(c.oxia_shards),
            ],
            c.data_dir / "logs" / "oxia.log",
        )
        self._ensure_port_free("Oxia", c.oxia_port)
        self.oxia.start()
        # Oxia's standalone (v0.14) serves its public port before it sets the dispatcher
        # of shard assignments, and a client's first call (GetShardAssignments) in that
        # window panics the server (a nil dereference). Its metrics port opens only after
        # the dispatcher is set, so that port, not the public one, says a client may call.
        wait_until(
            f"Oxia's metrics on {c.host}:{metrics_port} (it opens once clients may call)",
            lambda: port_open(c.host, metrics_port),
            timeout=c.startup_timeout_s,
            process=self.oxia,
        )
        wait_until(
            f"Oxia on {self.oxia_address}",
            self._oxia_answers,
            timeout=c.startup_timeout_s,
            process=self.oxia,
            interval=0.5,
        )

    def _oxia_answers(self) -> bool:
        import oxia

        from app.stores.oxia import patches  # noqa: F401  (fixes a client start-up race)

        client = oxia.Client(self.oxia_address, namespace=self.config.oxia_namespace)
        try:
            with contextlib.suppress(oxia.ex.KeyNotFound):
                client.get("__llog_health__")
            return True
        finally:
            client.close()

    # -- MinIO -----------------------------------------------------------------------

    def minio_drives(self) -> list[Path]:
        """MinIO's drive directories: one, or ``s3_drives`` erasure-coded ones."""
        base = self.config.data_dir / "minio"
        if self.config.s3_drives == 1:
            return [base]
        return [base / f"drive{i}" for i in range(1, self.config.s3_drives + 1)]

    def _start_minio(self, binary: Path) -> None:
        c = self.config
        drives = str(c.data_dir / "minio")
        if c.s3_drives > 1:
            # MinIO's own ellipsis notation: one erasure set over drive1 ... driveN.
            drives = str(c.data_dir / "minio" / f"drive{{1...{c.s3_drives}}}")
        console = c.s3_console_port or free_port(c.host, avoid={c.oxia_port, c.s3_port})
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(c.data_dir),
            "MINIO_ROOT_USER": c.access_key,
            "MINIO_ROOT_PASSWORD": c.secret_key,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_CI_CD": "1",
            "MINIO_REGION": c.region,
        }
        self.minio = ManagedProcess(
            "minio",
            [
                str(binary),
                "server",
                drives,
                "--address", f"{c.host}:{c.s3_port}",
                "--console-address", f"{c.host}:{console}",
                "--quiet",
            ],
            c.data_dir / "logs" / "minio.log",
            env=env,
        )
        self._ensure_port_free("MinIO", c.s3_port)
        self.minio.start()
        wait_until(
            f"MinIO on {self.s3_endpoint}",
            self._minio_live,
            timeout=c.startup_timeout_s,
            process=self.minio,
        )

    def _minio_live(self) -> bool:
        # Erasure coded, the process is live before its drives are formatted; the
        # cluster check answers 200 once writes reach a quorum of drives.
        check = "cluster" if self.config.s3_drives > 1 else "live"
        url = f"{self.s3_endpoint}/minio/health/{check}"
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)

    def s3_client(self) -> Any:
        """A synchronous botocore S3 client for this stack (setup and tests)."""
        import botocore.session
        from botocore.config import Config

        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name=self.config.region,
            aws_access_key_id=self.config.access_key,
            aws_secret_access_key=self.config.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def create_bucket(self) -> None:
        client = self.s3_client()
        try:
            client.create_bucket(Bucket=self.config.bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()

    # -- helpers ---------------------------------------------------------------------

    def _ensure_port_free(self, what: str, port: int) -> None:
        if port_open(self.config.host, port, timeout=0.2):
            raise ProcessFailed(
                f"{what} port {self.config.host}:{port} is already in use; stop whatever "
                f"listens there or choose another port"
            )

    def describe(self, broker_url: str | None = None, **more: Any) -> dict[str, Any]:
        """The ``stack.json`` document; ``more`` adds fields (the brokers and proxy of
        ``llog dev``)."""
        c = self.config
        return {
            "broker_url": broker_url,
            "oxia_address": self.oxia_address,
            "oxia_namespace": c.oxia_namespace,
            "s3_endpoint": self.s3_endpoint,
            "s3_bucket": c.bucket,
            "s3_region": c.region,
            "s3_access_key": c.access_key,
            "s3_secret_key": c.secret_key,
            "root_prefix": c.root_prefix,
            "pids": self.pids(),
            **self._cluster_fields(),
            **more,
        }

    def _cluster_fields(self) -> dict[str, Any]:
        """Only with a cluster topology: the Oxia servers and the MinIO drives."""
        c, out = self.config, dict[str, Any]()
        if self.oxia_cluster is not None and c.oxia_cluster is not None:
            out["oxia_cluster"] = {
                "servers": [{"name": n.name, "public": n.public, "internal": n.internal}
                            for n in self.oxia_cluster.nodes],
                "coordinator": self.oxia_cluster.coordinator_address,
                "replication_factor": c.oxia_cluster.replication,
                "shards": c.oxia_cluster.shards,
            }
        if c.s3_drives > 1:
            out["s3_drives"] = [str(d) for d in self.minio_drives()]
        return out

    def topology(self) -> str:
        """One line on the cluster topology, empty for single servers."""
        c, parts = self.config, []
        if c.oxia_cluster is not None:
            parts.append(f"Oxia cluster of {c.oxia_cluster.servers} data servers, "
                         f"replication factor {c.oxia_cluster.replication}, "
                         f"{c.oxia_cluster.shards} shards")
        if c.s3_drives > 1:
            parts.append(f"MinIO erasure coded over {c.s3_drives} drives")
        return "; ".join(parts)

    def write_stack_json(self, broker_url: str | None = None, **more: Any) -> Path:
        path = self.config.data_dir / "stack.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.describe(broker_url, **more), indent=2) + "\n")
        tmp.replace(path)
        return path
