"""TLS in tests: a throwaway CA with server and client certificates (trustme), and a
stack whose Oxia and MinIO speak only TLS."""

from __future__ import annotations

import shutil
import ssl
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

from app.localstack.processes import ManagedProcess, free_port, port_open, wait_until
from app.localstack.stack import LocalStack
from app.stores.oxia import patches as oxia_patches


@dataclass
class Certs:
    """PEM files: the CA, a server certificate for 127.0.0.1 and localhost, a client's."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path
    client_key_file: Path

    @classmethod
    def make(cls, folder: Path) -> Certs:
        folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client@llog.test")
        certs = cls(folder / "ca.pem", folder / "cert.pem", folder / "key.pem",
                    folder / "client.pem", folder / "client-key.pem")
        ca.cert_pem.write_to_path(str(certs.ca_file))
        for issued, cert_file, key_file in ((server, certs.cert_file, certs.key_file),
                                            (client, certs.client_cert_file,
                                             certs.client_key_file)):
            issued.private_key_pem.write_to_path(str(key_file))
            for i, pem in enumerate(issued.cert_chain_pems):
                pem.write_to_path(str(cert_file), append=i > 0)
        return certs

    def context(self, *, client_cert: bool = False) -> ssl.SSLContext:
        """A client context that trusts the CA (and presents the client certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client_cert:
            context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context


@dataclass
class TlsStack(LocalStack):
    """Oxia as a coordinator and one server whose public port speaks TLS (the standalone
    mode has no TLS), and MinIO over HTTPS (its certificates in ``$HOME/.minio/certs``)."""

    certs: Certs | None = field(default=None)

    @property
    def s3_endpoint(self) -> str:
        return f"https://{self.config.host}:{self.config.s3_port}"

    def settings_overrides(self) -> dict[str, Any]:
        assert self.certs is not None
        return {"oxia_tls": True, "oxia_tls_ca_file": self.certs.ca_file,
                "s3_ca_bundle": self.certs.ca_file}

    def _start_oxia(self, binary: Path) -> None:
        c = self.config
        base = c.data_dir / "oxia"
        base.mkdir(parents=True, exist_ok=True)
        internal = f"{c.host}:{free_port(c.host)}"
        (base / "cluster.yaml").write_text(
            f"namespaces:\n  - name: {c.oxia_namespace}\n    initialShardCount: 1\n"
            f"    replicationFactor: 1\nservers:\n  - public: {self.oxia_address}\n"
            f"    internal: {internal}\n")
        assert self.certs is not None
        self.oxia = ManagedProcess("oxia", [
            str(binary), "server", "--public-addr", self.oxia_address,
            "--internal-addr", internal, "--metrics-addr", f"{c.host}:{free_port(c.host)}",
            "--data-dir", str(base / "db"), "--wal-dir", str(base / "wal"),
            "--tls-cert-file", str(self.certs.cert_file),
            "--tls-key-file", str(self.certs.key_file)], c.data_dir / "logs" / "oxia.log")
        self.oxia.start()
        wait_until("Oxia server", lambda: port_open(c.host, c.oxia_port),
                   timeout=c.startup_timeout_s, process=self.oxia)
        coordinator = self.extra["oxia-coordinator"] = ManagedProcess("oxia-coordinator", [
            str(binary), "coordinator", "--conf", str(base / "cluster.yaml"),
            "--internal-addr", f"{c.host}:{free_port(c.host)}",
            "--metrics-addr", f"{c.host}:{free_port(c.host)}",
            "--file-clusters-status-path", str(base / "status.json")],
            c.data_dir / "logs" / "oxia-coordinator.log")
        coordinator.start()
        wait_until("Oxia over TLS", self._oxia_answers_tls, timeout=c.startup_timeout_s,
                   process=self.oxia, interval=0.5)

    def _oxia_answers_tls(self) -> bool:
        assert self.certs is not None
        client = oxia_patches.connect(self.oxia_address, request_timeout_s=5,
                                     namespace=self.config.oxia_namespace,
                                     tls=oxia_patches.TlsFiles(self.certs.ca_file))
        try:
            client.put("__llog_health__", b"ok")
            return True
        finally:
            client.close()

    def _start_minio(self, binary: Path) -> None:
        assert self.certs is not None
        certs = self.config.data_dir / ".minio" / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.certs.cert_file, certs / "public.crt")
        shutil.copy(self.certs.key_file, certs / "private.key")
        super()._start_minio(binary)

    def _minio_live(self) -> bool:
        assert self.certs is not None
        with urllib.request.urlopen(f"{self.s3_endpoint}/minio/health/live", timeout=1,
                                    context=self.certs.context()) as resp:
            return bool(resp.status == 200)

    def s3_client(self) -> Any:
        import botocore.session
        from botocore.config import Config

        assert self.certs is not None
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.s3_endpoint, region_name=self.config.region,
            aws_access_key_id=self.config.access_key,
            aws_secret_access_key=self.config.secret_key, verify=str(self.certs.ca_file),
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))
