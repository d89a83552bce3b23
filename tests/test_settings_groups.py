"""The settings in groups (app/settings_groups.py): every flat field declared in exactly
one group, the surface operators and callers see unchanged (``LLOG_*`` names, TOML keys,
``Settings(**flat)``), and each component built from its group alone."""

from __future__ import annotations

import typing
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from app.auth.control import AccessControl
from app.auth.jwts import JwtVerifier
from app.broker.consume_call import Consuming
from app.broker.event_stream import Streaming
from app.broker.produce_call import Producing
from app.compaction.compactor import CompactionConfig
from app.compaction.metrics import CompactionMetrics
from app.compaction.scheduler import (
    DEFAULT_VISIT_TIMEOUT_S,
    CompactionScheduler,
    visit_timeout_s,
)
from app.compaction.service import build_scheduler
from app.groups.group_records import GroupMember
from app.groups.membership import GroupMembership
from app.groups.service import GroupService
from app.localstack.stack import LocalStack
from app.settings import (
    AuthSettings,
    BatchSettings,
    ClusterSettings,
    CompactionSettings,
    GroupSettings,
    LimitSettings,
    ObservabilitySettings,
    OxiaSettings,
    ReadSettings,
    S3Settings,
    ServerSettings,
    Settings,
    StoreSettings,
    TailCacheSettings,
    TopicSettings,
    WriterSettings,
    default_broker_id,
)
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3 import lean as s3_lean
from app.stores.s3.lean import LeanS3
from app.stores.s3.store import S3Store
from tests.helpers.stack import make_settings

# Every LLOG_* variable as it was named before the settings were grouped: grouping moves
# declarations, never a name (the TOML keys are the same names in lower case).
ENV_NAMES = (
    "LLOG_ACCESS_LOG", "LLOG_ADVERTISED_URL", "LLOG_AFFINITY", "LLOG_ANSWER_BYTES_WAIT_MS",
    "LLOG_ANSWER_ENCODINGS", "LLOG_AUTH", "LLOG_AUTH_FILE", "LLOG_AUTH_FILE_MAX_BYTES",
    "LLOG_AUTH_JWKS_FILE", "LLOG_AUTH_JWKS_MAX_BYTES", "LLOG_AUTH_JWKS_MIN_REFRESH_S",
    "LLOG_AUTH_JWKS_REFRESH_S", "LLOG_AUTH_JWKS_TIMEOUT_S", "LLOG_AUTH_JWKS_URL",
    "LLOG_AUTH_JWT_ALGORITHMS", "LLOG_AUTH_JWT_AUDIENCE", "LLOG_AUTH_JWT_ISSUER",
    "LLOG_AUTH_JWT_LEEWAY_S", "LLOG_AUTH_JWT_PRINCIPAL_CLAIM", "LLOG_AUTH_MAX_TRACKED_PRINCIPALS",
    "LLOG_AUTH_METRICS", "LLOG_AUTH_METRICS_MAX_PRINCIPALS", "LLOG_AUTH_RELOAD_INTERVAL_S",
    "LLOG_AUTO_CREATE_PARTITIONS", "LLOG_AUTO_CREATE_TOPICS", "LLOG_BATCH_BUFFER_MAX_BYTES",
    "LLOG_BATCH_EAGER_FLUSHES", "LLOG_BATCH_MAX_BYTES", "LLOG_BATCH_MAX_DELAY_MS",
    "LLOG_BATCH_MAX_INFLIGHT", "LLOG_BROKER_ID", "LLOG_CLUSTER_SECRET",
    "LLOG_COMMIT_MAX_ATTEMPTS", "LLOG_COMPACTION_CHUNK_BYTES", "LLOG_COMPACTION_CONCURRENCY",
    "LLOG_COMPACTION_DISCOVERY_INTERVAL_S", "LLOG_COMPACTION_ENCODING",
    "LLOG_COMPACTION_INTERVAL_S", "LLOG_COMPACTION_MAX_BYTES",
    "LLOG_COMPACTION_MAX_BYTES_PER_S", "LLOG_COMPACTION_MAX_ENTRIES",
    "LLOG_COMPACTION_MIN_ENTRIES", "LLOG_COMPACTION_MIN_ENTRY_AGE_MS",
    "LLOG_COMPACTION_SEED_TARGETS", "LLOG_COMPACTION_ZSTD_LEVEL", "LLOG_COMPACTOR_URL",
    "LLOG_CONSOLE",
    "LLOG_CORS_ALLOW_ORIGINS",
    "LLOG_CORS_MAX_AGE_S", "LLOG_DRAIN_S", "LLOG_FORWARDED_ALLOW_IPS",
    "LLOG_FORWARD_ADVERTISED_ADDRESS", "LLOG_FORWARD_ANSWER_TIMEOUT_MS",
    "LLOG_FORWARD_DEADLINE_MS", "LLOG_FORWARD_HOST",
    "LLOG_FORWARD_PORT", "LLOG_GC_FREEZE_AFTER_START", "LLOG_GC_YOUNG_THRESHOLD",
    "LLOG_GROUP_LIST_MAX", "LLOG_GROUP_MAX_MEMBERS",
    "LLOG_GROUP_MAX_PARTITIONS", "LLOG_GROUP_MAX_SESSION_TIMEOUT_MS", "LLOG_GROUP_MAX_TOPICS",
    "LLOG_GROUP_MIN_SESSION_TIMEOUT_MS", "LLOG_GROUP_PENDING_COMMITS",
    "LLOG_GROUP_SESSION_TIMEOUT_MS", "LLOG_HOST",
    "LLOG_KEEP_ALIVE_S", "LLOG_LOADTEST_SCENARIO", "LLOG_LOG_FORMAT", "LLOG_LOOP_STALL_S",
    "LLOG_MAX_ANSWER_BYTES_IN_FLIGHT", "LLOG_MAX_CONCURRENT_LONG_POLLS",
    "LLOG_MAX_CONCURRENT_STREAMS", "LLOG_MAX_FETCH_BYTES", "LLOG_MAX_HEADERS",
    "LLOG_MAX_HEADER_BYTES", "LLOG_MAX_KEY_BYTES", "LLOG_MAX_PARTITIONS_PER_REQUEST",
    "LLOG_MAX_RECORDS_PER_REQUEST", "LLOG_MAX_RECORD_BYTES", "LLOG_MAX_REQUEST_BYTES",
    "LLOG_MAX_TOPIC_PARTITIONS", "LLOG_MAX_WAIT_MS_CEILING", "LLOG_MEMBERSHIP_REFRESH_S",
    "LLOG_METRICS_DIR", "LLOG_METRICS_REFRESH_INTERVAL_S", "LLOG_METRICS_TOKEN",
    "LLOG_OXIA_ADDRESS", "LLOG_OXIA_EVENT_LOOP_READS", "LLOG_OXIA_EVENT_LOOP_WRITES",
    "LLOG_OXIA_MAX_INFLIGHT_WRITES",
    "LLOG_OXIA_MAX_THREADS", "LLOG_OXIA_NAMESPACE", "LLOG_OXIA_OUTAGE_S",
    "LLOG_OXIA_REQUEST_TIMEOUT_S", "LLOG_OXIA_SESSION_TIMEOUT_MS", "LLOG_OXIA_TLS",
    "LLOG_OXIA_TLS_CA_FILE", "LLOG_OXIA_TLS_CERT_FILE", "LLOG_OXIA_TLS_KEY_FILE", "LLOG_PORT",
    "LLOG_PRODUCE_COMMIT_DEADLINE_MS", "LLOG_PRODUCE_LOCATIONS", "LLOG_PROXY_HEADERS",
    "LLOG_READ_AHEAD_MAX_INFLIGHT",
    "LLOG_READ_FETCH_CONCURRENCY", "LLOG_READ_MAX_CONCURRENT_FETCHES",
    "LLOG_READ_OBJECT_CACHE_BYTES", "LLOG_READ_WAL_OBJECT_MAX_BYTES",
    "LLOG_REQUEST_ID_MAX_LENGTH", "LLOG_RETENTION_CHECK_INTERVAL_S", "LLOG_RETRY_HORIZON_MS",
    "LLOG_ROLES", "LLOG_ROOT_PREFIX", "LLOG_S3_ACCESS_KEY", "LLOG_S3_BUCKET", "LLOG_S3_CA_BUNDLE",
    "LLOG_S3_ENDPOINT", "LLOG_S3_LEAN_REQUESTS", "LLOG_S3_MAX_ATTEMPTS",
    "LLOG_S3_MAX_POOL_CONNECTIONS", "LLOG_S3_PUT_CHECKSUM", "LLOG_S3_REGION",
    "LLOG_S3_REQUEST_TIMEOUT_S", "LLOG_S3_SECRET_KEY", "LLOG_S3_SIGN_PAYLOAD",
    "LLOG_S3_USAGE_SCAN_INTERVAL_S", "LLOG_SSL_CA_CERTS", "LLOG_SSL_CERTFILE",
    "LLOG_SSL_CLIENT_CERT", "LLOG_SSL_KEYFILE", "LLOG_STREAM_TICKET_SECRET",
    "LLOG_STREAM_TICKET_TTL_S", "LLOG_TAIL_CACHE_DIR", "LLOG_TAIL_CACHE_MAX_BYTES",
    "LLOG_TAIL_CACHE_MAX_PARTITIONS", "LLOG_TOPIC_CACHE_TTL_S", "LLOG_TOPIC_DEFAULT_COMPRESSION",
    "LLOG_TOPIC_DELETE_WAIT_MS",
    "LLOG_WAL_ENCODING",
)

# The accessor on Settings of each group, and the group it hands out.
ACCESSORS: dict[str, type[BaseModel]] = {
    "oxia": OxiaSettings, "s3": S3Settings, "store": StoreSettings, "writer": WriterSettings,
    "batching": BatchSettings, "read_path": ReadSettings, "tail_cache": TailCacheSettings,
    "compaction": CompactionSettings, "consumer_groups": GroupSettings,
    "access": AuthSettings, "limits": LimitSettings, "topic_rules": TopicSettings,
    "cluster": ClusterSettings, "server": ServerSettings,
    "observability": ObservabilitySettings,
}
GROUPS = tuple(ACCESSORS.values())
KEYS = {"s3_access_key": "AKIDEXAMPLE", "s3_secret_key": "secret"}


def _declared(group: type[BaseModel]) -> set[str]:
    """The fields a group declares itself (not those of the group it extends)."""
    inherited = {name for base in group.__bases__ if issubclass(base, BaseModel)
                 for name in base.model_fields}
    return set(group.model_fields) - inherited


def test_each_setting_is_declared_in_exactly_one_group() -> None:
    owners: dict[str, list[str]] = defaultdict(list)
    for group in GROUPS:
        for name in _declared(group):
            owners[name].append(group.__name__)
    assert {name: found for name, found in owners.items() if len(found) != 1} == {}
    assert set(owners) == set(Settings.model_fields)
    # Settings declares nothing of its own: it is the union of the groups.
    assert all(issubclass(Settings, group) for group in GROUPS)


def test_the_environment_names_are_unchanged() -> None:
    assert sorted(f"LLOG_{name.upper()}" for name in Settings.model_fields) == list(ENV_NAMES)


@pytest.mark.parametrize(("accessor", "variable", "value", "expected"), [
    ("oxia", "LLOG_OXIA_NAMESPACE", "ns-2", "ns-2"),
    ("s3", "LLOG_S3_BUCKET", "bucket-2", "bucket-2"),
    ("store", "LLOG_RETRY_HORIZON_MS", "120000", 120_000),
    ("writer", "LLOG_OXIA_OUTAGE_S", "3", 3.0),
    ("writer", "LLOG_RETRY_HORIZON_MS", "120000", 120_000),
    ("batching", "LLOG_BATCH_MAX_DELAY_MS", "9", 9),
    ("read_path", "LLOG_READ_FETCH_CONCURRENCY", "3", 3),
    ("tail_cache", "LLOG_TAIL_CACHE_MAX_PARTITIONS", "7", 7),
    ("compaction", "LLOG_COMPACTION_SEED_TARGETS", "t:0, u:1", ("t:0", "u:1")),
    ("compaction", "LLOG_COMPACTION_MIN_ENTRY_AGE_MS", "5", 5),
    ("compaction", "LLOG_COMPACTION_MAX_BYTES_PER_S", "4194304", 4 * 1024 * 1024),
    ("compaction", "LLOG_COMPACTION_MAX_BYTES_PER_S", "Unlimited", None),
    ("compaction", "LLOG_COMPACTION_MAX_BYTES_PER_S", "", None),
    ("consumer_groups", "LLOG_GROUP_MAX_MEMBERS", "5", 5),
    ("access", "LLOG_AUTH_JWT_ALGORITHMS", "RS256,ES256", ("RS256", "ES256")),
    ("limits", "LLOG_MAX_HEADERS", "3", 3),
    ("topic_rules", "LLOG_TOPIC_DEFAULT_COMPRESSION", " zstd:4 ", "zstd:4"),
    ("cluster", "LLOG_ADVERTISED_URL", "http://b.example/", "http://b.example"),
    ("server", "LLOG_ROLES", "read,read", ("read",)),
    ("observability", "LLOG_METRICS_DIR", "", None),
])
def test_a_group_carries_the_value_of_its_flat_variable(
        monkeypatch: pytest.MonkeyPatch, accessor: str, variable: str, value: str,
        expected: object) -> None:
    monkeypatch.setenv(variable, value)
    settings = Settings.from_env()
    field = variable.removeprefix("LLOG_").lower()
    group = getattr(settings, accessor)
    assert type(group) is ACCESSORS[accessor]
    assert getattr(group, field) == getattr(settings, field) == expected


def test_a_group_holds_its_fields_only_and_follows_a_copy() -> None:
    settings = Settings(s3_bucket="bucket-1", **KEYS)  # type: ignore[arg-type]
    for accessor, group in ACCESSORS.items():
        found = getattr(settings, accessor)
        assert type(found) is group
        assert found.model_dump() == settings.model_dump(include=set(group.model_fields))
    assert not hasattr(settings.s3, "oxia_address")
    copied = settings.model_copy(update={"s3_bucket": "bucket-2"})
    assert copied.s3.s3_bucket == "bucket-2" and settings.s3.s3_bucket == "bucket-1"


def test_a_group_checks_its_own_fields() -> None:
    with pytest.raises(ValidationError, match="not a valid S3 bucket name"):
        S3Settings(s3_bucket="Not_A_Bucket")
    with pytest.raises(ValidationError, match="LLOG_BATCH_BUFFER_MAX_BYTES"):
        BatchSettings(batch_max_bytes=10, batch_buffer_max_bytes=5)
    with pytest.raises(ValidationError, match="LLOG_GROUP_SESSION_TIMEOUT_MS"):
        GroupSettings(group_session_timeout_ms=1_000)
    with pytest.raises(ValidationError):
        OxiaSettings(oxia_addres="typo:1")  # a group refuses a name it does not hold
    assert ServerSettings(roles="write, read,write").roles == ("write", "read")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="greater than or equal to 65536"):
        CompactionSettings(compaction_max_bytes_per_s=1000)


@pytest.mark.parametrize(("function", "parameter", "group"), [
    (LeanS3.__init__, "s3", S3Settings),
    (s3_lean.usable, "s3", S3Settings),
    (S3Store.__init__, "s3", S3Settings),
    (OxiaStore.__init__, "oxia", OxiaSettings),
    (LogWriter.from_settings, "writer", WriterSettings),
    (GroupService.__init__, "groups", GroupSettings),
    (GroupMembership.__init__, "groups", GroupSettings),
    (JwtVerifier.__init__, "auth", AuthSettings),
    (AccessControl.__init__, "auth", AuthSettings),
    (CompactionConfig.from_settings, "settings", CompactionSettings),
    (CompactionScheduler.__init__, "compaction", CompactionSettings),
    (Producing, "limits", LimitSettings),
    (Streaming, "limits", LimitSettings),
    (Consuming, "limits", LimitSettings),
])
def test_components_name_their_group(function: Any, parameter: str,
                                     group: type[BaseModel]) -> None:
    assert typing.get_type_hints(function)[parameter] is group


def test_the_s3_clients_build_from_their_group_alone() -> None:
    s3 = S3Settings(s3_endpoint="http://s3.local:9000/", s3_bucket="bkt", **KEYS)  # type: ignore[arg-type]
    assert s3_lean.usable(s3)
    assert not s3_lean.usable(s3.model_copy(update={"s3_lean_requests": False}))
    lean = LeanS3(s3)
    assert (lean._scheme, lean._host_port, lean._base_path) == ("http", ("s3.local", 9000),
                                                                  "/bkt")
    assert S3Store(s3, StoreMetrics()).bucket == "bkt"


def test_a_writer_takes_the_commit_rules_of_its_group() -> None:
    class Captured(LogWriter):
        def __init__(self, *_: object, **options: Any) -> None:
            self.options = options

    writer = WriterSettings(retry_horizon_ms=600_000, compaction_min_entry_age_ms=10_000,
                            commit_max_attempts=7, wal_encoding="bytes-batch-v1",
                            oxia_outage_s=3)
    built = Captured.from_settings(None, None, None, None, writer)  # type: ignore[arg-type]
    assert built.options == {"max_attempts": 7, "commit_horizon_ms": 300_000,
                             "pending_reread_ms": 5_000, "encoding": "bytes-batch-v1",
                             "outage_s": 3.0}


def test_compaction_takes_its_group_and_the_store_rules() -> None:
    config = CompactionConfig.from_settings(CompactionSettings(
        retry_horizon_ms=600_000, compaction_min_entry_age_ms=9, compaction_max_bytes=4096))
    assert (config.commit_horizon_ms, config.min_entry_age_ms, config.max_bytes) == (
        300_000, 9, 4096)


def test_a_visit_is_bounded_by_the_request_deadlines_of_the_settings() -> None:
    settings = Settings(s3_request_timeout_s=60, oxia_request_timeout_s=20)
    assert visit_timeout_s(settings.s3, settings.oxia) == 4 * 60 + 8 * 20
    assert DEFAULT_VISIT_TIMEOUT_S == visit_timeout_s(S3Settings(), OxiaSettings()) == 200
    metrics = StoreMetrics()
    scheduler = build_scheduler(settings, OxiaStore(settings.oxia, metrics),
                                S3Store(settings.s3, metrics),
                                CompactionMetrics(CollectorRegistry()))
    assert scheduler._task_timeout_s == 400
    assert scheduler.compactor_id == settings.broker_id


def test_a_lease_names_the_broker_given() -> None:
    async def count(_: str) -> int:
        return 1

    member = GroupMember(member_id="m-1", topics=("t",), session_timeout_ms=10_000,
                    joined_at_ms=0)
    named = GroupMembership(None, GroupSettings(), count, broker_id="b-7")  # type: ignore[arg-type]
    assert named._lease(member).broker_id == "b-7"
    unnamed = GroupMembership(None, GroupSettings(), count)  # type: ignore[arg-type]
    assert unnamed._lease(member).broker_id == default_broker_id()


def test_access_control_builds_from_its_group_alone(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text("")
    auth = AuthSettings(auth="on", auth_file=auth_file, auth_jwks_file=tmp_path / "jwks.json",
                        auth_jwt_issuer="iss", auth_jwt_audience="aud",
                        stream_ticket_ttl_s=12)
    control = AccessControl(auth, CollectorRegistry())
    assert control.settings is auth and control.jwt is not None


async def test_the_store_clients_work_from_their_groups(stack: LocalStack) -> None:
    settings = make_settings(stack)
    metrics = StoreMetrics()
    key = f"groups-{uuid.uuid4().hex}"
    async with OxiaStore(settings.oxia, metrics, identity="groups-test") as oxia, \
            S3Store(settings.s3, metrics) as s3:
        await oxia.put(key, b"v", key)
        found = await oxia.get(key, key)
        assert found is not None and found.value == b"v"
        await s3.put(f"{settings.root_prefix}/{key}", b"body")
        assert await s3.get(f"{settings.root_prefix}/{key}") == b"body"
