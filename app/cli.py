"""The ``llog`` command line."""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from app.settings import CONFIG_FILE_ENV, ServerSettings, Settings, SettingsError

COMPACTOR_PORT = 8090
# After the drain (LLOG_DRAIN_S) the server stops accepting; requests in flight finish
# within this (then they are cancelled), before the broker's own shutdown begins:
# flushes, the batcher's last window, and an answer in doubt that waits out a forwarded
# frame's commit window (app/cluster/fences.py, claim_budget_for).
GRACEFUL_SHUTDOWN_S = 30


def _broker_available() -> bool:
    return importlib.util.find_spec("app.factory") is not None


def cmd_servers_build(args: argparse.Namespace) -> int:
    from app.localstack import binaries

    try:
        modules = binaries.by_name(args.names)
        built = binaries.ensure(modules)
    except binaries.BuildError as exc:
        print(f"llog servers build: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        for name, path in built.items():
            print(f"{name}: {path}")
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from app.localstack.dev import DevTopology, start_topology
    from app.localstack.processes import ProcessFailed
    from app.localstack.stack import LocalStack, StackConfig

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    config = StackConfig(
        data_dir=data_dir, oxia_port=args.oxia_port, s3_port=args.s3_port,
        **_cluster_options(args),
    )
    stack = LocalStack(config)
    topology: DevTopology | None = None
    stop = _event_on_signals()
    try:
        print(f"llog dev: starting Oxia and MinIO (data in {data_dir})", flush=True)
        stack.start()
        broker_url = None
        if _broker_available():
            topology = start_topology(stack, data_dir, args.port, args.brokers)
            broker_url = topology.url
        path = stack.write_stack_json(broker_url, **(topology.describe() if topology else {}))
        print(f"llog dev: Oxia {stack.oxia_address}, S3 {stack.s3_endpoint} "
              f"(bucket {config.bucket})")
        if stack.topology():
            print(f"llog dev: {stack.topology()}")
        if topology is not None and topology.proxy is not None:
            print(f"llog dev: {len(topology.brokers)} brokers behind Caddy: "
                  + ", ".join(b.url for b in topology.brokers))
        print(f"llog dev: stack description in {path}")
        _print_usage(broker_url)
        print("\nCtrl-C stops everything.", flush=True)
        while not stop.wait(0.5):
            for proc in stack.processes().values():
                proc.check_alive()
        return 0
    except ProcessFailed as exc:
        print(f"llog dev: {exc}", file=sys.stderr)
        return 1
    finally:
        print("llog dev: stopping", flush=True)
        if topology is not None:
            topology.stop()
        stack.stop()


def _cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """StackConfig fields for ``--oxia-cluster N`` and ``--minio-drives N``."""
    from app.localstack.oxia_cluster import OxiaClusterConfig

    out: dict[str, Any] = {"s3_drives": args.s3_drives}
    if args.oxia_cluster:
        out["oxia_cluster"] = OxiaClusterConfig(
            servers=args.oxia_cluster, replication=min(3, args.oxia_cluster),
            shards=args.oxia_shards)
    return out


def _event_on_signals() -> threading.Event:
    """An event that SIGINT or SIGTERM sets (instead of ending the process at once)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _print_usage(broker_url: str | None) -> None:
    if broker_url is None:
        print("llog dev: the broker is not part of this build yet; only Oxia and MinIO run.")
        return
    print(f"llog dev: broker on {broker_url}")
    print(f"llog dev: console on {broker_url}/console\n")
    print("Produce:")
    print(f"  curl -s {broker_url}/produce -H 'content-type: application/json' \\")
    print("    -d '{\"topic_partitions\":[{\"topic\":\"orders\",\"partition\":0,"
          "\"records\":[\"alpha\",{\"base64\":\"AAE=\"}]}]}'")
    print("Consume:")
    print(f"  curl -s {broker_url}/consume -H 'content-type: application/json' \\")
    print("    -d '{\"topic_partitions\":[{\"topic\":\"orders\",\"partition\":0,"
          "\"fetch_offset\":1}],\"max_wait_ms\":1000}'")


def _settings_for(command: str, args: argparse.Namespace, **overrides: object
                  ) -> Settings | None:
    """The settings of a server command (``--config`` and flags given included), or None
    after printing why they are invalid. Its workers re-read the environment, so the
    file and the flags that are settings become part of it."""
    if args.config is not None:
        os.environ[CONFIG_FILE_ENV] = str(Path(args.config).resolve())
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings.from_env(**given)
    except SettingsError as exc:
        print(f"llog {command}: {exc}", file=sys.stderr)
        return None
    env = settings.as_env()
    for name in given:
        os.environ[f"LLOG_{name.upper()}"] = env[f"LLOG_{name.upper()}"]
    return settings


def _share_stream_ticket_secret(settings: Settings, workers: int) -> None:
    """Workers of one server verify each other's stream tickets: with access control on
    and no ``LLOG_STREAM_TICKET_SECRET`` set, one secret is drawn here and handed to
    every worker through the environment (each would otherwise draw its own, and a
    ticket minted by one worker would fail on the next)."""
    if workers > 1 and settings.auth_enabled and settings.stream_ticket_secret is None:
        os.environ["LLOG_STREAM_TICKET_SECRET"] = secrets.token_urlsafe(48)


def cmd_serve(args: argparse.Namespace) -> int:
    if not _broker_available():
        print("llog serve: the broker is not part of this build yet", file=sys.stderr)
        return 2
    import uvicorn

    from app.telemetry.logs import log_config, warn_unknown_variables
    from app.telemetry.workers import serve

    settings = _settings_for(
        "serve", args, host=args.host, port=args.port,
        **{name: getattr(args, name) for name in (
            "access_log", "proxy_headers", "forwarded_allow_ips", "ssl_certfile",
            "ssl_keyfile", "ssl_ca_certs", "ssl_client_cert")})
    if settings is None:
        return 2
    _share_stream_ticket_secret(settings, args.workers)
    config = uvicorn.Config(
        "app.factory:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=args.workers,
        log_level=args.log_level,
        # With auth on the app logs each request itself, naming the principal.
        access_log=settings.access_log and not settings.auth_enabled,
        proxy_headers=settings.proxy_headers,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        timeout_keep_alive=int(settings.keep_alive_s),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="on",
        log_config=log_config(settings),  # applied here, and again by each worker
        **_tls(settings),
    )
    warn_unknown_variables(os.environ)  # once, in the supervisor; its logging is set up
    return serve(config, settings.metrics_dir)


def _tls(s: ServerSettings) -> dict[str, Any]:
    """uvicorn's TLS options from the settings (none: plain HTTP)."""
    import ssl

    if s.ssl_certfile is None:
        return {}
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED}[s.ssl_client_cert]
    return {"ssl_certfile": str(s.ssl_certfile), "ssl_keyfile": str(s.ssl_keyfile),
            "ssl_ca_certs": str(s.ssl_ca_certs) if s.ssl_ca_certs else None,
            "ssl_cert_reqs": reqs}


def cmd_compactor(args: argparse.Namespace) -> int:
    from app.compaction.commands import serve_compactor

    settings = _settings_for("compactor", args, host=args.host, port=args.port)
    if settings is None:
        return 2
    if "port" not in settings.model_fields_set:  # the compactor's own default
        settings = settings.model_copy(update={"port": COMPACTOR_PORT})
    return serve_compactor(settings, log_level=args.log_level)


def cmd_compact_once(args: argparse.Namespace) -> int:
    from app.compaction.commands import compact_once_main

    return compact_once_main(Settings.from_env(), args.topic, args.partition,
                             claim=not args.no_claim)


def cmd_loadtest(args: argparse.Namespace) -> int:
    from app.loadtest.cli import main as loadtest_main

    return loadtest_main(list(args.args))


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 16:
        raise argparse.ArgumentTypeError("must be between 1 and 16")
    return value


def _drives(text: str) -> int:
    """One drive, or an erasure set MinIO accepts that survives losing one (4 to 16)."""
    value = _positive(text)
    if 1 < value < 4:
        raise argparse.ArgumentTypeError("must be 1, or 4 to 16 (an erasure set)")
    return value


def _add_server_arguments(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default=None,
                        help="address to listen on (default LLOG_HOST, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port to listen on (default LLOG_PORT, else {default_port})")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML file of settings, named as LLOG_* variables are but in "
                             "lower case without the prefix; the variables win "
                             "(default LLOG_CONFIG_FILE)")


def _add_dev_and_serve(sub: Any) -> None:
    dev = sub.add_parser("dev", help="run Oxia, MinIO and a broker on loopback (foreground)")
    dev.add_argument("--port", type=int, default=8080,
                     help="where clients connect: the broker, or the proxy in front of "
                          "several (default 8080)")
    dev.add_argument("--brokers", type=_positive, default=1,
                     help="brokers to run; more than one run behind Caddy on --port")
    dev.add_argument("--data-dir", default=".llog/dev", help="state directory")
    dev.add_argument("--oxia-port", type=int, default=6648)
    dev.add_argument("--s3-port", type=int, default=9000)
    dev.add_argument("--oxia-cluster", type=_positive, default=None, metavar="N",
                     help="run Oxia as a cluster: its coordinator and N data servers "
                          "(replication factor min(N, 3)) on consecutive ports from "
                          "--oxia-port; default: one standalone server")
    dev.add_argument("--oxia-shards", type=_positive, default=4,
                     help="shards of the Oxia cluster (default 4)")
    dev.add_argument("--minio-drives", "--s3-drives", dest="s3_drives", type=_drives,
                     default=1, metavar="N",
                     help="MinIO drives; 4 or more are erasure coded and survive the loss "
                          "of a drive (default 1)")
    dev.set_defaults(func=cmd_dev)

    serve = sub.add_parser("serve", help="run the broker against configured Oxia and S3")
    _add_server_arguments(serve, default_port=8080)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                       help="log every request with the client's address (default on; "
                            "LLOG_ACCESS_LOG; with auth on, and the principal)")
    serve.add_argument("--proxy-headers", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips "
                            "(default on; LLOG_PROXY_HEADERS)")
    serve.add_argument("--forwarded-allow-ips", default=None,
                       help="comma-separated proxy addresses to trust, '*' for any "
                            "(default 127.0.0.1; LLOG_FORWARDED_ALLOW_IPS)")
    serve.add_argument("--ssl-certfile", default=None,
                       help="serve HTTPS with this certificate chain (PEM; LLOG_SSL_CERTFILE)")
    serve.add_argument("--ssl-keyfile", default=None,
                       help="the certificate's private key (PEM; LLOG_SSL_KEYFILE)")
    serve.add_argument("--ssl-ca-certs", default=None,
                       help="CAs that sign client certificates (LLOG_SSL_CA_CERTS)")
    serve.add_argument("--ssl-client-cert", choices=("none", "optional", "required"),
                       default=None,
                       help="ask clients for a certificate (default none; "
                            "LLOG_SSL_CLIENT_CERT)")
    serve.set_defaults(func=cmd_serve)


def add_broker_commands(sub: Any) -> None:
    """Add the broker's commands to ``llog`` (llog_client's command; the broker's
    pyproject.toml registers this in the entry-point group ``llog.commands``)."""
    from app.cli_auth import add_auth_commands

    client_commands = set(sub.choices)
    _add_dev_and_serve(sub)
    add_auth_commands(sub)

    compactor = sub.add_parser("compactor", help="run the standalone compaction service")
    _add_server_arguments(compactor, default_port=COMPACTOR_PORT)
    compactor.add_argument("--log-level", default="info")
    compactor.set_defaults(func=cmd_compactor)

    once = sub.add_parser("compact-once",
                          help="compact (or finish compacting) one partition and exit")
    once.add_argument("--topic", required=True)
    once.add_argument("--partition", type=int, required=True)
    once.add_argument("--no-claim", action="store_true",
                      help="skip the compactor claim (recovery work while no compactor runs)")
    once.set_defaults(func=cmd_compact_once)

    loadtest = sub.add_parser(
        "loadtest", help="load-test scenarios: up|status|precreate|run|down|verify|report|list",
        add_help=False,
    )
    loadtest.add_argument("args", nargs=argparse.REMAINDER)
    loadtest.set_defaults(func=cmd_loadtest, pass_through=_everything_to(cmd_loadtest))

    spark = sub.add_parser("spark", help="Spark jobs: audit|vacuum|backfill|export",
                           add_help=False)
    spark.add_argument("args", nargs=argparse.REMAINDER)
    spark.set_defaults(func=cmd_spark, pass_through=_everything_to(cmd_spark))

    servers = sub.add_parser("servers", help="manage the Go-built Oxia and MinIO binaries")
    servers_sub = servers.add_subparsers(dest="servers_command", required=True)
    build = servers_sub.add_parser("build", help="build (or find cached) the server binaries "
                                                 "and promtool")
    build.add_argument("names", nargs="*", metavar="NAME",
                       help="oxia, minio, caddy or promtool (default: all of them)")
    build.add_argument("--quiet", action="store_true",
                       help="print only what is built, not where every binary is")
    build.set_defaults(func=cmd_servers_build)
    for name in set(sub.choices) - client_commands:
        sub.choices[name].set_defaults(runner=_run)


def cmd_spark(args: argparse.Namespace) -> int:
    from jobs.spark.cli import main as spark_main

    return spark_main(list(args.args))


# Subcommands with their own argument parsers: everything after the name is theirs.
def _everything_to(command: Callable[[argparse.Namespace], int]) -> Callable[[list[str]], int]:
    return lambda argv: command(argparse.Namespace(args=argv))


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a broker command: bad settings and failed builds become a message."""
    try:
        return int(func(args))
    except SettingsError as exc:
        print(f"llog: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from app.localstack.binaries import BuildError

        if isinstance(exc, BuildError):
            print(f"llog: {exc}", file=sys.stderr)
            return 1
        raise


def build_parser() -> argparse.ArgumentParser:
    """``llog``'s parser with the broker's commands (whatever the entry points say)."""
    from llog_client._cli import build_parser as llog_parser

    return llog_parser([add_broker_commands])


def main(argv: list[str] | None = None) -> int:
    """``llog`` with the client's and the broker's commands: ``python -m app.cli`` runs
    it in a tree that is not installed (its entry points not registered)."""
    from llog_client._cli import main as llog_main

    return llog_main(argv, [add_broker_commands])


if __name__ == "__main__":
    sys.exit(main())
