"""Process configuration: one pydantic-settings model read from ``LLOG_*`` variables and,
optionally, a TOML file (``LLOG_CONFIG_FILE``, ``llog serve --config``) with the same
setting names in lower case; variables win over the file.

Built once at start (``Settings.from_env()``) and passed down explicitly; nothing in the
package reads the environment on its own.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

Role = Literal["write", "read", "compact"]
# JWT signature algorithms a broker may accept: asymmetric only, so a public key can never
# be used as an HMAC secret ("none" and HS* are refused when the settings are read).
ASYMMETRIC_JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                             "ES256", "ES384", "ES512", "EdDSA")
ALL_ROLES: tuple[Role, ...] = ("write", "read", "compact")

# The share of the retry horizon within which a blob must be committed: the rest is the
# margin for clock skew between brokers and the object store, and for process pauses.
RETRY_HORIZON_SAFE_SHARE = 0.5
# A shorter LLOG_METRICS_TOKEN is refused: it could be guessed.
MIN_METRICS_TOKEN_CHARS = 16

# The largest LLOG_MAX_PARTITIONS_PER_REQUEST allowed: request models refuse a longer list
# of partitions as they read it, before the route (and the setting) sees the request.
MAX_PARTITIONS_PER_REQUEST_CEILING = 100_000

# A topic's default compression (the engine's app/storage/topic_compression.py reads it;
# settings import nothing of the engine, so the levels zstd takes are repeated here).
_COMPRESSION = re.compile(r"none|zstd(?::(-?[0-9]{1,3}))?")
ZSTD_LEVELS = range(-7, 20)
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*")

CONFIG_FILE_ENV = "LLOG_CONFIG_FILE"
# LLOG_* variables that are read elsewhere and are no settings.
NOT_SETTINGS = frozenset({CONFIG_FILE_ENV, "LLOG_BIN_CACHE_DIR", "LLOG_BROKER_URL",
                          "LLOG_SPARK_LOG_LEVEL"})
# The TOML file of the Settings being built (from_env sets it around the construction).
_config_file: ContextVar[Path | None] = ContextVar("llog_config_file", default=None)


class SettingsError(ValueError):
    """Invalid configuration; the message names each offending ``LLOG_*`` variable."""


class Settings(BaseSettings):
    """Every knob of a broker, compactor or job process."""

    model_config = SettingsConfigDict(
        env_prefix="LLOG_", extra="ignore", frozen=True, validate_default=True
    )

    # Coordination store.
    oxia_address: str = "127.0.0.1:6648"
    oxia_namespace: str = "default"
    oxia_session_timeout_ms: int = Field(default=15_000, ge=2_000, le=300_000)
    oxia_request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # How long a commit keeps retrying, from its first unanswered request, while an Oxia
    # shard elects a new leader, before the produce fails (503, or in doubt).
    oxia_outage_s: float = Field(default=10.0, ge=0, le=300)
    oxia_max_threads: int = Field(default=32, ge=1, le=512)
    # Gets (the control records and cursors reads wait on) on the event loop through
    # grpc.aio rather than the package in a worker thread (app/storage/oxia_reads.py).
    oxia_event_loop_reads: bool = True
    oxia_max_inflight_writes: int = Field(default=2, ge=1, le=64)
    # TLS to Oxia: the CA bundle that signs its certificate (none: the system's roots),
    # and a client certificate and key for servers that require one.
    oxia_tls: bool = False
    oxia_tls_ca_file: Path | None = None
    oxia_tls_cert_file: Path | None = None
    oxia_tls_key_file: Path | None = None

    # Object store.
    s3_endpoint: str | None = "http://127.0.0.1:9000"
    s3_bucket: str = "leaderless-log-wal"
    s3_region: str = "us-east-1"
    # Secrets: repr() and logs show "**********"; as_env() reveals them to child processes.
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    s3_max_pool_connections: int = Field(default=64, ge=1, le=1024)
    s3_request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    s3_max_attempts: int = Field(default=5, ge=1, le=20)
    # A PEM bundle of the CAs that sign the S3 endpoint's certificate (botocore's
    # ``verify=``); none: the system's trust store.
    s3_ca_bundle: Path | None = None
    # Uploads carry the body's CRC32C (x-amz-checksum-crc32c), which the store verifies
    # before it stores anything. SigV4 payload signing hashes every body with SHA-256 on
    # both sides as well; it adds tamper-proofing only on plain-HTTP links.
    s3_put_checksum: bool = True
    s3_sign_payload: bool = False
    # GETs, ranged GETs and WAL uploads are signed and sent by the broker itself
    # (app/storage/s3_lean.py) rather than through botocore's request pipeline, when an
    # endpoint and static keys are set.
    s3_lean_requests: bool = True

    root_prefix: str = "llog"

    # Garbage collection: an object may be deleted only when it is older than this and
    # unreferenced. Writers and compactors refuse to commit a blob older than
    # RETRY_HORIZON_SAFE_SHARE of it, so the two can never race (docs/protocol.md).
    retry_horizon_ms: int = Field(default=3_600_000, ge=60_000, le=30 * 86_400_000)

    # Broker identity and roles.
    broker_id: str = Field(default_factory=lambda: f"broker-{socket.gethostname()}")
    roles: Annotated[tuple[Role, ...], NoDecode] = ALL_ROLES
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    # On SIGTERM: how long to keep serving while not ready, so that load balancers stop
    # sending work first (longer than their health-check interval times fall count).
    drain_s: float = Field(default=10.0, ge=0, le=600)
    # Idle keep-alive of client connections. Behind a load balancer it must outlast the
    # proxy's own idle timeout for upstream connections (60 s in deploy/proxy/), or the
    # broker may close a connection just as the proxy sends a produce on it.
    keep_alive_s: float = Field(default=75.0, gt=0, le=3600)
    # Trust X-Forwarded-For / X-Forwarded-Proto from these addresses (comma separated,
    # "*" for any): the proxies in front, so logs, quotas and ACLs see the real client.
    proxy_headers: bool = True
    forwarded_allow_ips: str = "127.0.0.1"

    # HTTPS of `llog serve` (uvicorn's ssl options); client certificates are asked for
    # (optional) or required when ssl_ca_certs names the CAs that sign them.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_ca_certs: Path | None = None
    ssl_client_cert: Literal["none", "optional", "required"] = "none"
    # One access-log line per request; with auth on it names the principal.
    access_log: bool = True
    # Browsers on these origins may call the API (CORS); empty: CORS is off.
    cors_allow_origins: Annotated[tuple[str, ...], NoDecode] = ()
    # Codings a consume answer or stream may be compressed with, in order of preference,
    # among those the client accepts (empty: always raw). gzip is not offered unless set:
    # many HTTP stacks (Go's among them) accept gzip without asking for it, and gzip costs
    # the broker several times zstd's CPU per MiB (docs/http-api.md, Compression).
    answer_encodings: Annotated[tuple[Literal["zstd", "gzip"], ...], NoDecode] = ("zstd",)
    cors_max_age_s: int = Field(default=600, ge=0, le=86_400)

    # Access control (docs/operations.md, Security). Off: every endpoint is open. A broker
    # that listens beyond loopback with auth off warns at start (llog_insecure_listener),
    # unless LLOG_AUTH=off was set on purpose.
    auth: Literal["off", "on"] = "off"
    # Principals, their API key hashes, rights and quotas (TOML), re-read when it changes.
    auth_file: Path | None = None
    auth_reload_interval_s: float = Field(default=5.0, ge=0.1, le=3600)
    auth_file_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    # /metrics and /metrics/prometheus: open, or for authenticated principals only.
    auth_metrics: Literal["open", "authenticated"] = "open"
    # When set, /metrics and /metrics/prometheus of brokers and compactors answer only
    # "Authorization: Bearer <token>" (the scraper's), with auth on or off.
    metrics_token: SecretStr | None = None
    # Principals not named in the auth file (JWT subjects) that get their own metrics
    # label; the others share "other". And how many such principals have quota buckets.
    auth_metrics_max_principals: int = Field(default=100, ge=0, le=10_000)
    auth_max_tracked_principals: int = Field(default=10_000, ge=1, le=1_000_000)
    # JWTs: the issuer's keys (a JWKS file or URL), the claims a token must carry.
    auth_jwks_file: Path | None = None
    auth_jwks_url: str | None = None
    auth_jwt_issuer: str | None = None
    auth_jwt_audience: str | None = None
    auth_jwt_algorithms: Annotated[tuple[str, ...], NoDecode] = ASYMMETRIC_JWT_ALGORITHMS
    auth_jwt_leeway_s: float = Field(default=30.0, ge=0, le=300)
    auth_jwt_principal_claim: str = Field(default="sub", min_length=1, max_length=128)
    # The JWKS is fetched again this often, and at most this often when a token names
    # a key id it does not hold (a rotation); each fetch within the timeout.
    auth_jwks_refresh_s: float = Field(default=300.0, ge=1, le=86_400)
    auth_jwks_min_refresh_s: float = Field(default=30.0, ge=0, le=3600)
    auth_jwks_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # A key set is a few kilobytes: a larger document is refused rather than parsed.
    auth_jwks_max_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Stream tickets (app/auth/tickets.py): the HMAC secret, the same on every broker
    # behind one load balancer (unset: each process draws its own), and how long a
    # ticket may wait before it opens its stream.
    stream_ticket_secret: SecretStr | None = Field(default=None, min_length=32)
    stream_ticket_ttl_s: float = Field(default=30.0, gt=0, le=600)

    # Where an acknowledged produce entry lives (wal_uri, index_key) is told to every
    # caller (all), only to callers holding the admin right on its topic (admin; with auth
    # off every caller does), or to none: the names show the bucket and key layout.
    produce_locations: Literal["all", "admin", "none"] = "all"

    # Writer.
    commit_max_attempts: int = Field(default=64, ge=1, le=10_000)
    # Bodies of new WAL objects: bytes-batch-v3 (columns), or bytes-batch-v1 (and v2 for
    # records with more than a value), which releases before v3 read: set it during a
    # rolling upgrade from such a release until every reader understands v3.
    wal_encoding: Literal["bytes-batch-v3", "bytes-batch-v1"] = "bytes-batch-v3"

    # Batcher.
    batch_max_bytes: int = Field(default=4 * 1024 * 1024, ge=1, le=1024 * 1024 * 1024)
    batch_max_delay_ms: int = Field(default=5, ge=0, le=60_000)
    batch_buffer_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    batch_max_inflight: int = Field(default=4, ge=1, le=256)
    # Flushes of a batch below LLOG_BATCH_MAX_BYTES that may be in flight at once (a full
    # batch may use every slot): fewer, larger flushes cost less per record. With affinity
    # the members share it; below 1 a member spaces its flushes (app/batching/batcher.py).
    batch_eager_flushes: float = Field(default=1, gt=0, le=256)

    # -- cluster: membership
    # Affinity: "forward" makes each broker worker a member (an ephemeral Oxia record,
    # docs/protocol.md, MEMBER) so that every broker agrees on a preferred appender per
    # partition and sends appends there; "off": every broker appends what it receives.
    affinity: Literal["off", "forward"] = "off"
    # Where clients reach this broker (GET /cluster); none: http(s)://{host}:{port}.
    advertised_url: str | None = None
    # How often a member lists the live set again (a member that died leaves it when its
    # Oxia session expires, LLOG_OXIA_SESSION_TIMEOUT_MS).
    membership_refresh_s: float = Field(default=2.0, ge=0.05, le=600)

    # -- cluster: forwarding
    # Where this process listens for the appends other brokers forward to it (port 0: an
    # ephemeral one, announced in its membership record). Bind it to the pod's or the
    # loopback address only: it is no client API.
    forward_host: str = "127.0.0.1"
    forward_port: int = Field(default=0, ge=0, le=65535)
    # How long forwarded records may wait in the receiver's buffer before a flush takes
    # them (then they are answered expired, unwritten, and the forwarder appends them
    # itself), and how long after that the forwarder waits for an answer before it
    # counts the outcome as unknown.
    forward_deadline_ms: int = Field(default=1_000, ge=1, le=60_000)
    forward_answer_timeout_ms: int = Field(default=2_000, ge=1, le=600_000)
    # The HMAC secret both ends of a forward connection prove before any append crosses
    # it; the same on every broker (unset: connections are not authenticated).
    cluster_secret: SecretStr | None = Field(default=None, min_length=16)

    # Request limits.
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    max_records_per_request: int = Field(default=100_000, ge=1)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    max_key_bytes: int = Field(default=16 * 1024, ge=1)
    max_headers: int = Field(default=64, ge=0, le=65_535)
    max_header_bytes: int = Field(default=64 * 1024, ge=0)
    max_wait_ms_ceiling: int = Field(default=30_000, ge=0, le=600_000)
    max_concurrent_long_polls: int = Field(default=1_000, ge=1)
    # Server-Sent Events streams open at once per process (GET /topics/{topic}/stream).
    max_concurrent_streams: int = Field(default=100, ge=1, le=100_000)
    max_partitions_per_request: int = Field(default=1_000, ge=1,
                                            le=MAX_PARTITIONS_PER_REQUEST_CEILING)
    max_fetch_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    # Bytes the consume answers of one process may hold at once (records read, answers
    # being encoded or sent: app/broker/answer_budget.py); a read that does not fit waits
    # up to the wait below, then is refused with 503 and Retry-After.
    max_answer_bytes_in_flight: int = Field(default=1024 * 1024 * 1024, ge=1024 * 1024,
                                            le=1024 * 1024 * 1024 * 1024)
    answer_bytes_wait_ms: int = Field(default=1_000, ge=0, le=60_000)

    # Topics: producing to an unknown topic creates it (with this many partitions, or as
    # many as the partition named needs) and to a partition beyond the count grows it;
    # off, both are refused (404).
    auto_create_topics: bool = True
    auto_create_partitions: int = Field(default=1, ge=1, le=100_000)
    # The most partitions POST and PATCH /topics give a topic (describing a topic reads
    # every partition's state, so an operator may keep topics smaller than the format's
    # 100000).
    max_topic_partitions: int = Field(default=100_000, ge=1, le=100_000)
    topic_cache_ttl_s: float = Field(default=5.0, gt=0, le=3600)
    # How a topic created without a ``compression`` field (or on use) stores its
    # appends: "none", "zstd" or "zstd:LEVEL" (app/storage/topic_compression.py).
    topic_default_compression: str = "none"
    # How often the compactor applies a topic's retention to a partition.
    retention_check_interval_s: float = Field(default=60.0, gt=0)

    # Consumer groups: a member's session (the default, and the range a join may ask
    # for), and the bounds of a group and of one page of the group listing.
    group_session_timeout_ms: int = Field(default=30_000, ge=100, le=3_600_000)
    group_min_session_timeout_ms: int = Field(default=6_000, ge=100, le=3_600_000)
    group_max_session_timeout_ms: int = Field(default=300_000, ge=100, le=3_600_000)
    group_max_members: int = Field(default=1_000, ge=1, le=100_000)
    group_max_topics: int = Field(default=100, ge=1, le=10_000)
    group_max_partitions: int = Field(default=10_000, ge=1, le=1_000_000)
    group_list_max: int = Field(default=1_000, ge=1, le=100_000)

    # Compaction.
    compaction_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # Compacted blobs carry a chunk table with a row about every this many bytes, so a
    # reader fetches only the chunks it needs (app/storage/chunks.py).
    compaction_chunk_bytes: int = Field(default=1024 * 1024, ge=4096)
    # Compacted blobs: bytes-batch-v3 bodies, one per chunk, which a read cuts without
    # decoding (bytes-batch-v2 when a record has headers); or bytes-batch-v2 always, which
    # releases before bytes-batch-v3-chunked read: set it during a rolling upgrade from
    # such a release until every reader understands the new encoding.
    compaction_encoding: Literal["bytes-batch-v3-chunked", "bytes-batch-v2"] = (
        "bytes-batch-v3-chunked")
    # The zstd level compacted chunks of a zstd topic are recompressed at; None: the
    # topic's level + 3, at most 19 (app/compaction/recompress.py). Topics with none keep
    # raw chunks. On JSON events level 6 stores about a tenth less than 3 for about four
    # times the compression CPU, paid once per byte.
    compaction_zstd_level: int | None = Field(default=None, ge=-7, le=19)
    compaction_max_entries: int = Field(default=1000, ge=2)
    compaction_min_entries: int = Field(default=2, ge=2)
    compaction_min_entry_age_ms: int = Field(default=30_000, ge=0)
    compaction_interval_s: float = Field(default=5.0, gt=0)
    compaction_discovery_interval_s: float = Field(default=30.0, gt=0)
    compaction_concurrency: int = Field(default=2, ge=1, le=64)
    compaction_seed_targets: Annotated[tuple[str, ...], NoDecode] = ()

    # Metrics: how often the stored bytes/objects under the root prefix are re-counted.
    s3_usage_scan_interval_s: float = Field(default=300.0, ge=1.0)
    # `llog serve --workers N`: where the server's shared metrics directory is created
    # (none: the system's temporary directory), and how often each worker writes its
    # point-in-time figures there for the scrapes the other workers answer.
    metrics_dir: Path | None = None
    metrics_refresh_interval_s: float = Field(default=1.0, ge=0.05, le=60)

    # Logs: "text" (human) or "json" (one object per line); request ids taken from
    # X-Request-ID are at most this long (others are replaced by a generated one).
    log_format: Literal["text", "json"] = "text"
    request_id_max_length: int = Field(default=128, ge=16, le=1024)

    # Load-test runs: a JSON object describing the scenario, exported on /metrics as
    # llog_loadtest_scenario_info (strings) and llog_loadtest_scenario_<key> (numbers).
    loadtest_scenario: str | None = None

    # Reader: compacted and legacy objects kept in memory between reads, and how many
    # object downloads run at once (per consume request and per process).
    read_object_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    read_fetch_concurrency: int = Field(default=32, ge=1, le=256)
    read_max_concurrent_fetches: int = Field(default=64, ge=1, le=4096)
    # Compacted blobs read ahead at once (the chunks after a read, for the next), and as
    # many lookups made ahead of a catch-up's next read (app/storage/plan_ahead.py); 0: never.
    read_ahead_max_inflight: int = Field(default=8, ge=0, le=1024)
    # A shared WAL object whose wanted slices end within this many bytes is read whole
    # once for all its partitions (app/storage/wal_objects.py); 0: each slice its own GET.
    read_wal_object_max_bytes: int = Field(default=4 * 1024 * 1024, ge=0, le=1024 * 1024 * 1024)

    # Tail cache.
    tail_cache_dir: Path | None = None
    tail_cache_max_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    tail_cache_max_partitions: int = Field(default=10_000, ge=1)

    @field_validator("roles", mode="before")
    @classmethod
    def _parse_roles(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts:
                raise ValueError("at least one of write, read, compact")
            return tuple(parts)
        return value

    @field_validator("compaction_seed_targets", "cors_allow_origins", "auth_jwt_algorithms",
                     "answer_encodings", mode="before")
    @classmethod
    def _parse_targets(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("compaction_seed_targets")
    @classmethod
    def _check_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for target in value:
            topic, sep, partition = target.rpartition(":")
            if not sep or not topic or not partition.isascii() or not partition.isdigit():
                raise ValueError(f"{target!r}: expected topic:partition")
        return value

    @field_validator("auth_jwt_algorithms")
    @classmethod
    def _check_algorithms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one algorithm")
        for alg in value:
            if alg not in ASYMMETRIC_JWT_ALGORITHMS:
                raise ValueError(f"{alg!r} is not allowed; choose among "
                                 + ", ".join(ASYMMETRIC_JWT_ALGORITHMS))
        return value

    @field_validator("auth_jwks_url")
    @classmethod
    def _check_jwks_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("https://", "http://")):
            raise ValueError("expected an https:// (or http://) URL")
        return value

    @field_validator("roles")
    @classmethod
    def _dedupe_roles(cls, value: tuple[Role, ...]) -> tuple[Role, ...]:
        return tuple(dict.fromkeys(value))

    @field_validator("loadtest_scenario")
    @classmethod
    def _check_scenario(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ValueError("expected a JSON object") from None
        if not isinstance(parsed, dict):
            raise ValueError("expected a JSON object")
        return value

    @field_validator("s3_access_key", "s3_secret_key", "tail_cache_dir", "loadtest_scenario",
                     "metrics_dir",
                     "s3_ca_bundle", "oxia_tls_ca_file", "oxia_tls_cert_file",
                     "oxia_tls_key_file", "ssl_certfile", "ssl_keyfile", "ssl_ca_certs",
                     "auth_file", "auth_jwks_file", "auth_jwks_url", "auth_jwt_issuer",
                     "auth_jwt_audience", "metrics_token", "stream_ticket_secret",
                     "cluster_secret", "compaction_zstd_level", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("topic_default_compression")
    @classmethod
    def _check_compression(cls, value: str) -> str:
        found = _COMPRESSION.fullmatch(value.strip())
        if found is None or (found[1] is not None and int(found[1]) not in ZSTD_LEVELS):
            raise ValueError(f"must be none, zstd or zstd:LEVEL with a level from "
                             f"{ZSTD_LEVELS.start} to {ZSTD_LEVELS.stop - 1}, not {value!r}")
        return value.strip()

    @field_validator("oxia_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        # Several servers of one cluster, comma separated: any of them serves the shard
        # assignments (app/storage/oxia_discovery.py).
        if not all(_HOST_PORT.fullmatch(a) for a in value.split(",")):
            raise ValueError("expected host:port, or several separated by commas")
        return value

    @field_validator("s3_bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        if not _BUCKET.fullmatch(value):
            raise ValueError("not a valid S3 bucket name")
        return value

    @field_validator("root_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not _PREFIX.fullmatch(value):
            raise ValueError("segments of [A-Za-z0-9._-] separated by '/', no leading '/'")
        return value

    @field_validator("s3_endpoint", "advertised_url")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_batch(self) -> Settings:
        if self.batch_buffer_max_bytes < self.batch_max_bytes:
            raise ValueError(
                "LLOG_BATCH_BUFFER_MAX_BYTES must be at least LLOG_BATCH_MAX_BYTES"
            )
        return self

    @model_validator(mode="after")
    def _check_forwarding(self) -> Settings:
        # With access control on, the forward port would otherwise append for anyone
        # who can reach it, past every right checked on /produce.
        if self.affinity == "forward" and self.auth == "on" and self.cluster_secret is None:
            raise ValueError("LLOG_AFFINITY=forward with LLOG_AUTH=on needs "
                             "LLOG_CLUSTER_SECRET (the forward connections' key)")
        return self

    @model_validator(mode="after")
    def _check_topics(self) -> Settings:
        if self.auto_create_partitions > self.max_topic_partitions:
            raise ValueError(
                "LLOG_AUTO_CREATE_PARTITIONS must be at most LLOG_MAX_TOPIC_PARTITIONS")
        return self

    @model_validator(mode="after")
    def _check_sessions(self) -> Settings:
        if not (self.group_min_session_timeout_ms <= self.group_session_timeout_ms
                <= self.group_max_session_timeout_ms):
            raise ValueError(
                "LLOG_GROUP_SESSION_TIMEOUT_MS must lie between LLOG_GROUP_MIN_SESSION_"
                "TIMEOUT_MS and LLOG_GROUP_MAX_SESSION_TIMEOUT_MS"
            )
        return self

    @model_validator(mode="after")
    def _check_security(self) -> Settings:
        oxia_files = (self.oxia_tls_ca_file, self.oxia_tls_cert_file, self.oxia_tls_key_file)
        if not self.oxia_tls and any(f is not None for f in oxia_files):
            raise ValueError("LLOG_OXIA_TLS_*_FILE need LLOG_OXIA_TLS=true")
        if (self.oxia_tls_cert_file is None) != (self.oxia_tls_key_file is None):
            raise ValueError("LLOG_OXIA_TLS_CERT_FILE and LLOG_OXIA_TLS_KEY_FILE go together")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("LLOG_SSL_CERTFILE and LLOG_SSL_KEYFILE go together")
        if self.ssl_client_cert != "none" and self.ssl_ca_certs is None:
            raise ValueError("LLOG_SSL_CLIENT_CERT needs LLOG_SSL_CA_CERTS")
        if self.metrics_token is not None:
            if len(self.metrics_token.get_secret_value()) < MIN_METRICS_TOKEN_CHARS:
                raise ValueError(f"LLOG_METRICS_TOKEN: at least {MIN_METRICS_TOKEN_CHARS} "
                                 "characters (for example: openssl rand -hex 32)")
            if self.auth_metrics == "authenticated":
                raise ValueError("set one of LLOG_METRICS_TOKEN and "
                                 "LLOG_AUTH_METRICS=authenticated")
        if self.auth == "off":
            return self
        if self.auth_file is None:
            raise ValueError("LLOG_AUTH=on needs LLOG_AUTH_FILE (principals and rights)")
        if self.auth_jwks_file is not None and self.auth_jwks_url is not None:
            raise ValueError("set one of LLOG_AUTH_JWKS_FILE and LLOG_AUTH_JWKS_URL")
        if self.jwt_enabled and (self.auth_jwt_issuer is None or self.auth_jwt_audience is None):
            raise ValueError("JWTs (LLOG_AUTH_JWKS_*) need LLOG_AUTH_JWT_ISSUER and "
                             "LLOG_AUTH_JWT_AUDIENCE")
        return self

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "on"

    @property
    def auth_off_on_purpose(self) -> bool:
        """Auth is off because LLOG_AUTH=off was given (variable, file or argument),
        not by default."""
        return self.auth == "off" and "auth" in self.model_fields_set

    @property
    def jwt_enabled(self) -> bool:
        return self.auth_jwks_file is not None or self.auth_jwks_url is not None

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``LLOG_*`` variables, then the TOML file (if any)."""
        config_file = _config_file.get()
        toml = (TomlConfigSettingsSource(settings_cls, toml_file=config_file),) \
            if config_file is not None else ()
        return init_settings, env_settings, *toml, dotenv_settings, file_secret_settings

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Read the environment and the TOML file ``LLOG_CONFIG_FILE`` names, if any;
        raise :class:`SettingsError` naming each bad variable, or the file and key of
        each bad value in the file."""
        named = os.environ.get(CONFIG_FILE_ENV)
        config_file = Path(named) if named else None
        in_file = _read_config_file(config_file) if config_file is not None else {}
        token = _config_file.set(config_file)
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise SettingsError(describe_validation_error(
                exc, config_file, set(in_file) - set(overrides))) from None
        finally:
            _config_file.reset(token)

    @classmethod
    def unknown_variables(cls, environ: Mapping[str, str]) -> list[str]:
        """A warning for each ``LLOG_*`` variable that names no setting (so it changes
        nothing), with the closest setting's name when one is close."""
        known = {f"LLOG_{name.upper()}" for name in cls.model_fields} | NOT_SETTINGS
        warnings = []
        for name in sorted(environ):
            upper = name.upper()
            if upper.startswith("LLOG_") and upper not in known:
                close = difflib.get_close_matches(upper, known, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                warnings.append(f"{name} is not a setting and is ignored{hint}")
        return warnings

    @property
    def retry_horizon_safe_ms(self) -> int:
        """The age beyond which a writer or compactor no longer commits a blob."""
        return int(self.retry_horizon_ms * RETRY_HORIZON_SAFE_SHARE)

    def has_role(self, role: Role) -> bool:
        return role in self.roles

    @property
    def broker_url(self) -> str:
        """Where clients reach this broker: LLOG_ADVERTISED_URL, else the listener's."""
        if self.advertised_url is not None:
            return self.advertised_url
        scheme = "https" if self.ssl_certfile is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def as_env(self) -> dict[str, str]:
        """The settings as ``LLOG_*`` variables, for child processes."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                value = ""  # every optional setting reads "" as unset
            elif isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, tuple):
                value = ",".join(value)
            env[f"LLOG_{name.upper()}"] = str(value)
        return env


def describe_validation_error(exc: ValidationError, config_file: Path | None = None,
                              from_file: set[str] | frozenset[str] = frozenset()) -> str:
    """One line per problem, naming the variable, or the file and key it came from."""
    environ = {name.upper() for name in os.environ}
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = err.get("loc") or ()
        field = str(loc[0]) if loc else ""
        name = f"LLOG_{field.upper()}" if field else "(settings)"
        if field in from_file and name not in environ:
            name = f"{config_file}: {field}"
        lines.append(f"  {name}: {err.get('msg', 'invalid value')}")
    return "\n".join(lines)


def _read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML file; a file that cannot be read or parsed, or a key that
    names no setting, is a :class:`SettingsError` naming the file (and the key)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the configuration file: "
                            f"{exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: not a valid TOML file: {exc}") from None
    fields = set(Settings.model_fields)
    unknown = []
    for key in sorted(set(data) - fields):
        close = difflib.get_close_matches(key, fields, n=1)
        unknown.append(f"  {path}: {key}: not a setting"
                       + (f"; did you mean {close[0]}?" if close else ""))
    if unknown:
        raise SettingsError("\n".join(["invalid configuration:", *unknown]))
    return data
