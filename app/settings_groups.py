"""The settings, in groups: one frozen model per part of the process that reads them.

Each field is declared once, here, in the group of the component that uses it, with the
checks of its own value (and those between fields of one group). The flat
:class:`app.settings.Settings` (the input surface: ``LLOG_*`` variables, TOML keys,
``Settings(**flat)``) inherits every group; app/settings.py says why. Field names are
the flat names, so that a setting is called the same in code, in the environment and in
the TOML file. The package imports these classes from app.settings.

This module imports nothing of the package: settings come first.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

Role = Literal["write", "read", "compact"]
# JWT signature algorithms a broker may accept: asymmetric only, so a public key can never
# be used as an HMAC secret ("none" and HS* are refused when the settings are read).
ASYMMETRIC_JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                             "ES256", "ES384", "ES512", "EdDSA")
ALL_ROLES: tuple[Role, ...] = ("write", "read", "compact")

# One label of a DNS name (RFC 1123): what an advertised host may be made of.
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

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


def default_broker_id() -> str:
    """``LLOG_BROKER_ID`` when unset; also the Oxia client's and a lease's name when a
    caller names none."""
    return f"broker-{socket.gethostname()}"


def _empty_is_unset(value: object) -> object:
    """An optional setting given as "" is unset (as_env() writes unset ones so)."""
    return None if value == "" else value


def _unlimited_is_unset(value: object) -> object:
    """A limit given as "" or "unlimited" (any case) is no limit."""
    if isinstance(value, str) and value.strip().lower() in ("", "unlimited"):
        return None
    return value


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    return value


def _check_url(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    assert value is not None
    if not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value.rstrip("/")


class _Group(BaseModel):
    """A group of settings: frozen, checked as the flat settings check each field."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class OxiaSettings(_Group):
    """Oxia, the coordination store: where it is, how this process talks to it."""

    oxia_address: str = "127.0.0.1:6648"
    oxia_namespace: str = "default"
    oxia_session_timeout_ms: int = Field(default=15_000, ge=2_000, le=300_000)
    oxia_request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    oxia_max_threads: int = Field(default=32, ge=1, le=512)
    # Gets (the control records and cursors reads wait on) on the event loop through
    # grpc.aio rather than the package in a worker thread (app/stores/oxia/reads.py).
    oxia_event_loop_reads: bool = True
    # The group puts of commits likewise (app/stores/oxia/writes.py); ephemeral puts,
    # deletes and sessions stay with the package.
    oxia_event_loop_writes: bool = True
    oxia_max_inflight_writes: int = Field(default=2, ge=1, le=64)
    # TLS to Oxia: the CA bundle that signs its certificate (none: the system's roots),
    # and a client certificate and key for servers that require one.
    oxia_tls: bool = False
    oxia_tls_ca_file: Path | None = None
    oxia_tls_cert_file: Path | None = None
    oxia_tls_key_file: Path | None = None

    _oxia_unset = field_validator(
        "oxia_tls_ca_file", "oxia_tls_cert_file", "oxia_tls_key_file", mode="before",
    )(_empty_is_unset)

    @field_validator("oxia_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        # Several servers of one cluster, comma separated: any of them serves the shard
        # assignments (app/stores/oxia/discovery.py).
        if not all(_HOST_PORT.fullmatch(a) for a in value.split(",")):
            raise ValueError("expected host:port, or several separated by commas")
        return value


class S3Settings(_Group):
    """The object store: where it is, the credentials, how requests are made."""

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
    # (app/stores/s3/lean.py) rather than through botocore's request pipeline, when an
    # endpoint and static keys are set, on connections of its own
    # (app/stores/s3/wire.py): one pool for GETs and one for uploads (so a flush never
    # waits behind reads), each up to s3_max_pool_connections.
    s3_lean_requests: bool = True

    _s3_unset = field_validator(
        "s3_access_key", "s3_secret_key", "s3_ca_bundle", mode="before",
    )(_empty_is_unset)
    _s3_endpoint = field_validator("s3_endpoint")(_check_url)

    @field_validator("s3_bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        if not _BUCKET.fullmatch(value):
            raise ValueError("not a valid S3 bucket name")
        return value


class StoreSettings(_Group):
    """Where the log lives and the rules every writer and compactor of one store must
    agree on (the garbage collector deletes by the same horizon)."""

    root_prefix: str = "llog"
    # Garbage collection: an object may be deleted only when it is older than this and
    # unreferenced. Writers and compactors refuse to commit a blob older than
    # RETRY_HORIZON_SAFE_SHARE of it, so the two can never race (docs/protocol.md).
    retry_horizon_ms: int = Field(default=3_600_000, ge=60_000, le=30 * 86_400_000)
    # Compaction takes entries at least this old; a writer reads a cached pending append
    # again at half that age.
    compaction_min_entry_age_ms: int = Field(default=30_000, ge=0)

    @field_validator("root_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not _PREFIX.fullmatch(value):
            raise ValueError("segments of [A-Za-z0-9._-] separated by '/', no leading '/'")
        return value

    @property
    def retry_horizon_safe_ms(self) -> int:
        """The age beyond which a writer or compactor no longer commits a blob."""
        return int(self.retry_horizon_ms * RETRY_HORIZON_SAFE_SHARE)


class WriterSettings(StoreSettings):
    """How a writer commits appends (with the store's rules it shares with compaction)."""

    # How long a commit keeps retrying, from its first unanswered request, while an Oxia
    # shard elects a new leader, before the produce fails (503, or in doubt).
    oxia_outage_s: float = Field(default=10.0, ge=0, le=300)
    commit_max_attempts: int = Field(default=64, ge=1, le=10_000)
    # Bodies of new WAL objects: bytes-batch-v3 (columns), or bytes-batch-v1 (and v2 for
    # records with more than a value), which releases before v3 read: set it during a
    # rolling upgrade from such a release until every reader understands v3.
    wal_encoding: Literal["bytes-batch-v3", "bytes-batch-v1"] = "bytes-batch-v3"


class BatchSettings(_Group):
    """The batcher: how appends are gathered into WAL objects."""

    batch_max_bytes: int = Field(default=4 * 1024 * 1024, ge=1, le=1024 * 1024 * 1024)
    batch_max_delay_ms: int = Field(default=5, ge=0, le=60_000)
    batch_buffer_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    batch_max_inflight: int = Field(default=4, ge=1, le=256)
    # Flushes of a batch below LLOG_BATCH_MAX_BYTES that may be in flight at once (a full
    # batch may use every slot): fewer, larger flushes cost less per record. With affinity
    # the members share it; below 1 a member spaces its flushes (app/batching/batcher.py).
    batch_eager_flushes: float = Field(default=1, gt=0, le=256)

    @model_validator(mode="after")
    def _check_batch(self) -> BatchSettings:
        if self.batch_buffer_max_bytes < self.batch_max_bytes:
            raise ValueError(
                "LLOG_BATCH_BUFFER_MAX_BYTES must be at least LLOG_BATCH_MAX_BYTES"
            )
        return self


class ReadSettings(_Group):
    """The read path: the object cache and how many downloads run at once."""

    read_object_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    read_fetch_concurrency: int = Field(default=32, ge=1, le=256)
    read_max_concurrent_fetches: int = Field(default=64, ge=1, le=4096)
    # Compacted blobs read ahead at once (the chunks after a read, for the next), and as
    # many lookups made ahead of a catch-up's next read (app/storage/plan_ahead.py); 0: never.
    read_ahead_max_inflight: int = Field(default=8, ge=0, le=1024)
    # A shared WAL object whose wanted slices end within this many bytes is read whole
    # once for all its partitions (app/storage/wal_objects.py); 0: each slice its own GET.
    read_wal_object_max_bytes: int = Field(default=4 * 1024 * 1024, ge=0, le=1024 * 1024 * 1024)


class TailCacheSettings(_Group):
    """The tail cache of recent appends (memory, or files in ``tail_cache_dir``)."""

    tail_cache_dir: Path | None = None
    tail_cache_max_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    tail_cache_max_partitions: int = Field(default=10_000, ge=1)

    _tail_cache_unset = field_validator("tail_cache_dir", mode="before")(_empty_is_unset)


class CompactionSettings(StoreSettings):
    """Compaction and retention (with the store's rules it shares with writers)."""

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
    compaction_interval_s: float = Field(default=5.0, gt=0)
    compaction_discovery_interval_s: float = Field(default=30.0, gt=0)
    compaction_concurrency: int = Field(default=2, ge=1, le=64)
    # At most this many WAL bytes (as decompressed) rewritten per second by one compactor
    # process, runs paid for once done (app/compaction/throttle.py). None, "" or
    # "unlimited": no limit (the default: a compactor on its own CPU should catch up at
    # full speed). `llog dev` sets 4 MiB/s: there it shares the broker's cores.
    compaction_max_bytes_per_s: int | None = Field(default=None, ge=64 * 1024)
    compaction_seed_targets: Annotated[tuple[str, ...], NoDecode] = ()
    # How often the compactor applies a topic's retention to a partition.
    retention_check_interval_s: float = Field(default=60.0, gt=0)

    _compaction_unset = field_validator("compaction_zstd_level", mode="before")(_empty_is_unset)
    _compaction_unlimited = field_validator("compaction_max_bytes_per_s", mode="before")(
        _unlimited_is_unset)
    _compaction_targets = field_validator("compaction_seed_targets", mode="before")(_comma_list)

    @field_validator("compaction_seed_targets")
    @classmethod
    def _check_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for target in value:
            topic, sep, partition = target.rpartition(":")
            if not sep or not topic or not partition.isascii() or not partition.isdigit():
                raise ValueError(f"{target!r}: expected topic:partition")
        return value


class GroupSettings(_Group):
    """Consumer groups: a member's session (the default, and the range a join may ask
    for), and the bounds of a group and of one page of the group listing."""

    group_session_timeout_ms: int = Field(default=30_000, ge=100, le=3_600_000)
    group_min_session_timeout_ms: int = Field(default=6_000, ge=100, le=3_600_000)
    group_max_session_timeout_ms: int = Field(default=300_000, ge=100, le=3_600_000)
    group_max_members: int = Field(default=1_000, ge=1, le=100_000)
    group_max_topics: int = Field(default=100, ge=1, le=10_000)
    group_max_partitions: int = Field(default=10_000, ge=1, le=1_000_000)
    group_list_max: int = Field(default=1_000, ge=1, le=100_000)
    # Commits written pending and confirmed after their check (docs/protocol.md, Commit).
    # Off only while upgrading from a release before them: those releases neither read
    # a pending commit nor fence one, so commits are written directly until none remains.
    group_pending_commits: bool = True

    @model_validator(mode="after")
    def _check_sessions(self) -> GroupSettings:
        if not (self.group_min_session_timeout_ms <= self.group_session_timeout_ms
                <= self.group_max_session_timeout_ms):
            raise ValueError(
                "LLOG_GROUP_SESSION_TIMEOUT_MS must lie between LLOG_GROUP_MIN_SESSION_"
                "TIMEOUT_MS and LLOG_GROUP_MAX_SESSION_TIMEOUT_MS"
            )
        return self


class AuthSettings(_Group):
    """Access control (docs/operations.md, Security), JWTs, stream tickets, and what an
    answer may show."""

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

    _auth_unset = field_validator(
        "auth_file", "auth_jwks_file", "auth_jwks_url", "auth_jwt_issuer", "auth_jwt_audience",
        "metrics_token", "stream_ticket_secret", mode="before",
    )(_empty_is_unset)
    _auth_algorithms = field_validator("auth_jwt_algorithms", mode="before")(_comma_list)

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

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "on"

    @property
    def jwt_enabled(self) -> bool:
        return self.auth_jwks_file is not None or self.auth_jwks_url is not None


class LimitSettings(_Group):
    """Request limits, and the bounds of what one process holds for its requests at once."""

    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    max_records_per_request: int = Field(default=100_000, ge=1)
    max_record_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    max_key_bytes: int = Field(default=16 * 1024, ge=1)
    max_headers: int = Field(default=64, ge=0, le=65_535)
    max_header_bytes: int = Field(default=64 * 1024, ge=0)
    max_wait_ms_ceiling: int = Field(default=30_000, ge=0, le=600_000)
    # How long a produce request's records may take to be committed, from the request's
    # arrival (a client's Llog-Commit-Deadline-Ms may shorten it): no commit of theirs
    # expects a control version read later, so a client that sends them again after it
    # cannot meet a late first copy (docs/protocol.md, The produce commit deadline).
    # Below the Python client's default timeout (30 s), so that its resend comes after.
    produce_commit_deadline_ms: int = Field(default=25_000, ge=1_000, le=600_000)
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


class TopicSettings(_Group):
    """Topics: creation on use, bounds, the topic cache, the default compression."""

    # Topics: producing to an unknown topic creates it (with this many partitions, or as
    # many as the partition named needs) and to a partition beyond the count grows it;
    # off, both are refused (404).
    auto_create_topics: bool = True
    auto_create_partitions: int = Field(default=1, ge=1, le=100_000)
    # The most partitions POST and PATCH /topics give a topic. Measured
    # (bench/topic_limits.py): a topic of 10,000 written partitions takes 15 s to write
    # one record to each and about 65 s to delete (in the background), and every
    # compaction pass visits each partition; the format allows 100,000.
    max_topic_partitions: int = Field(default=10_000, ge=1, le=100_000)
    topic_cache_ttl_s: float = Field(default=5.0, gt=0, le=3600)
    # How long DELETE /topics/{topic} waits for the deletion to finish before it answers
    # 202 (still deleting, in the background) instead of 200 (deleted). A deletion lasts
    # at least LLOG_TOPIC_CACHE_TTL_S and a second (every broker has seen the mark), so
    # the default answers 200 for a small topic, within schemathesis' 10 s.
    topic_delete_wait_ms: int = Field(default=8_000, ge=0, le=60_000)
    # How a topic created without a ``compression`` field (or on use) stores its
    # appends: "none", "zstd" or "zstd:LEVEL" (app/storage/topic_compression.py).
    topic_default_compression: str = "none"

    @field_validator("topic_default_compression")
    @classmethod
    def _check_compression(cls, value: str) -> str:
        found = _COMPRESSION.fullmatch(value.strip())
        if found is None or (found[1] is not None and int(found[1]) not in ZSTD_LEVELS):
            raise ValueError(f"must be none, zstd or zstd:LEVEL with a level from "
                             f"{ZSTD_LEVELS.start} to {ZSTD_LEVELS.stop - 1}, not {value!r}")
        return value.strip()

    @model_validator(mode="after")
    def _check_topics(self) -> TopicSettings:
        if self.auto_create_partitions > self.max_topic_partitions:
            raise ValueError(
                "LLOG_AUTO_CREATE_PARTITIONS must be at most LLOG_MAX_TOPIC_PARTITIONS")
        return self


class ClusterSettings(_Group):
    """Affinity: membership and forwarding of appends between brokers."""

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
    # Where the other members reach that listener (host:port), when it is not where it
    # listens: behind NAT, a Kubernetes Service, a proxy. None: the listener's address.
    # Each worker needs an address of its own, so set it with one worker per process.
    forward_advertised_address: str | None = None
    # How long forwarded records may wait in the receiver's buffer before a flush takes
    # them (then they are answered expired, unwritten, and the forwarder appends them
    # itself), and how long after that the forwarder waits for an answer before it
    # counts the outcome as unknown.
    forward_deadline_ms: int = Field(default=1_000, ge=1, le=60_000)
    forward_answer_timeout_ms: int = Field(default=2_000, ge=1, le=600_000)
    # The HMAC secret both ends of a forward connection prove before any append crosses
    # it; the same on every broker (unset: connections are not authenticated).
    cluster_secret: SecretStr | None = Field(default=None, min_length=16)

    _cluster_unset = field_validator("cluster_secret", mode="before")(_empty_is_unset)
    _cluster_advertised = field_validator("advertised_url")(_check_url)

    _advertised_unset = field_validator("forward_advertised_address", mode="before")(
        _empty_is_unset)

    @field_validator("forward_advertised_address")
    @classmethod
    def _check_advertised_address(cls, value: str | None) -> str | None:
        """``host:port``: a DNS name or an IPv4 address, or an IPv6 one in brackets,
        and a port a socket can reach (1-65535)."""
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{value!r}: expected host:port with a port of 1-65535")
        if host.startswith("[") and host.endswith("]"):
            with contextlib.suppress(ValueError):
                ipaddress.IPv6Address(host[1:-1])
                return value
        elif all(_DNS_LABEL.fullmatch(label) for label in host.split(".")) and len(host) <= 253:
            return value
        raise ValueError(f"{value!r}: the host must be a DNS name, an IPv4 address or an "
                         "IPv6 address in brackets")

    @model_validator(mode="after")
    def _check_forward_wait(self) -> ClusterSettings:
        # An unanswered frame is settled by its fence, which neither side claims more
        # than 5 minutes after sending (app/cluster/fences.py): a longer wait would
        # leave every unanswered frame in doubt.
        if self.forward_deadline_ms + self.forward_answer_timeout_ms > 240_000:
            raise ValueError("LLOG_FORWARD_DEADLINE_MS + LLOG_FORWARD_ANSWER_TIMEOUT_MS "
                             "must be at most 240000 (4 minutes)")
        return self


class ServerSettings(_Group):
    """This process: identity and roles, the HTTP listener, TLS, CORS, answer codings."""

    broker_id: str = Field(default_factory=default_broker_id)
    roles: Annotated[tuple[Role, ...], NoDecode] = ALL_ROLES
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    # On SIGTERM: how long to keep serving while not ready, so that load balancers stop
    # sending work first (longer than their health-check interval times fall count).
    drain_s: float = Field(default=10.0, ge=0, le=600)
    # A worker whose event loop has not run for this long ends its Oxia session (peers
    # drop it from their view) and exits (app/broker/loop_watchdog.py); 0: never.
    loop_stall_s: float = Field(default=15.0, ge=0, le=3600)
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
    # The web console at /console (docs/console.md): its page, assets and metrics ring.
    console: Literal["on", "off"] = "on"
    # Where the standalone compactor beside the brokers serves /health and /metrics, for
    # the console's overview (none: it shows only a compactor in this process).
    compactor_url: str | None = None
    # Browsers on these origins may call the API (CORS); empty: CORS is off.
    cors_allow_origins: Annotated[tuple[str, ...], NoDecode] = ()
    # Codings a consume answer or stream may be compressed with, in order of preference,
    # among those the client accepts (empty: always raw). gzip is not offered unless set:
    # many HTTP stacks (Go's among them) accept gzip without asking for it, and gzip costs
    # the broker several times zstd's CPU per MiB (docs/http-api.md, Compression).
    answer_encodings: Annotated[tuple[Literal["zstd", "gzip"], ...], NoDecode] = ("zstd",)
    cors_max_age_s: int = Field(default=600, ge=0, le=86_400)
    # Python's collector in `llog serve` and compactor processes (app/gc_policy.py): the
    # youngest generation is collected after this many net allocations (0: Python's own
    # 700, under which full collections stall the event loop every few seconds); and
    # what exists once the process has started is frozen, out of full collections.
    gc_young_threshold: int = Field(default=50_000, ge=0, le=10_000_000)
    gc_freeze_after_start: bool = True

    _server_unset = field_validator(
        "ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "compactor_url", mode="before",
    )(_empty_is_unset)
    _server_lists = field_validator("cors_allow_origins", "answer_encodings", mode="before")(
        _comma_list)

    @field_validator("roles", mode="before")
    @classmethod
    def _parse_roles(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts:
                raise ValueError("at least one of write, read, compact")
            return tuple(parts)
        return value

    @field_validator("roles")
    @classmethod
    def _dedupe_roles(cls, value: tuple[Role, ...]) -> tuple[Role, ...]:
        return tuple(dict.fromkeys(value))

    def has_role(self, role: Role) -> bool:
        return role in self.roles


class ObservabilitySettings(_Group):
    """Metrics, logs and load-test labels."""

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

    _observability_unset = field_validator("loadtest_scenario", "metrics_dir", mode="before")(
        _empty_is_unset)

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
