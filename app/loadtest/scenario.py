"""Load-test scenarios: a TOML or JSON file, validated and resolved into one document.

The resolved scenario (``resolved-config.json`` in the run directory) has every default
filled in and the broker layout expanded; together with ``stack.json`` it is the source
of truth for the later ``status``, ``precreate``, ``run`` and ``down`` calls.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.localstack.binaries import REPO_ROOT
from app.storage.names import NAME_RULE, is_name

SCENARIO_DIR = REPO_ROOT / "deploy" / "loadtest" / "scenarios"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RoleName = Literal["write", "read", "compact"]
ProxyName = Literal["none", "caddy", "haproxy", "nginx"]
_ALL_ROLES: tuple[RoleName, ...] = ("write", "read", "compact")


class ScenarioError(ValueError):
    """The scenario file is missing or invalid; the message says where."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokersSpec(_Model):
    count: int = Field(default=2, ge=1, le=64)
    workers: int = Field(default=1, ge=1, le=32)
    roles: list[RoleName] = Field(default_factory=lambda: list(_ALL_ROLES))
    # Per-broker roles by id (b1, b2, ...), replacing ``roles`` for that broker.
    roles_by_broker: dict[str, list[RoleName]] = Field(default_factory=dict)
    # "auto": a tail cache directory per broker when it has several workers, else memory.
    tail_cache: Literal["auto", "memory", "per_broker", "shared"] = "auto"
    # Extra broker settings, as LLOG_* variables.
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=90.0, gt=0)
    # Listen address; 0.0.0.0 lets a containerised Prometheus scrape them. Clients use
    # 127.0.0.1 either way.
    host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _check(self) -> BrokersSpec:
        for key in self.env:
            if not key.startswith("LLOG_"):
                raise ValueError(f"brokers.env: {key!r} is not an LLOG_* variable")
        ids = {f"b{i + 1}" for i in range(self.count)}
        for bid in self.roles_by_broker:
            if bid not in ids:
                raise ValueError(f"brokers.roles_by_broker: no broker {bid!r} "
                                 f"(ids b1..b{self.count})")
        return self


class TopicSpec(_Model):
    name: str
    partitions: int = Field(ge=1, le=100_000)

    @model_validator(mode="after")
    def _check(self) -> TopicSpec:
        if not is_name(self.name):
            raise ValueError(f"topic {self.name!r}: {NAME_RULE}")
        return self


class BatchSpec(_Model):
    max_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    max_delay_ms: int = Field(default=5, ge=0)
    buffer_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)


class WorkloadSpec(_Model):
    mode: Literal["closed", "open"] = "closed"
    connections: int = Field(default=8, ge=1, le=10_000)
    # Open loop: produce requests started per second (each carries records_per_request).
    rate: float = Field(default=0.0, ge=0)
    duration_s: float = Field(default=30.0, gt=0)
    warmup_s: float = Field(default=0.0, ge=0)
    record_bytes: int = Field(default=1024, ge=32, le=8 * 1024 * 1024)
    records_per_request: int = Field(default=10, ge=1, le=100_000)
    # Entries (distinct partitions of one owner set) per produce request.
    entries_per_request: int = Field(default=1, ge=1, le=1000)
    request_timeout_s: float = Field(default=10.0, gt=0)
    # Attempts after the first for entries whose outcome is unknown or retriable.
    max_retries: int = Field(default=3, ge=0, le=100)
    retry_backoff_ms: int = Field(default=50, ge=0)
    retry_backoff_max_ms: int = Field(default=1000, ge=0)
    # false: entries carry no idempotency key, so a retry may store them twice.
    idempotency_keys: bool = True

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.mode == "open" and self.rate <= 0:
            raise ValueError("workload.rate must be > 0 in open-loop mode")
        if self.warmup_s >= self.duration_s:
            raise ValueError("workload.warmup_s must be shorter than duration_s")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("workload.retry_backoff_max_ms must be at least retry_backoff_ms")
        return self

    @property
    def longest_request_s(self) -> float:
        """How long one request can take with all its retries."""
        return (self.request_timeout_s * (self.max_retries + 1)
                + self.retry_backoff_max_ms * self.max_retries / 1000)


class ConsumerSpec(_Model):
    enabled: bool = False
    max_wait_ms: int = Field(default=500, ge=0)
    max_partitions_per_request: int = Field(default=16, ge=1)
    max_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    drain_timeout_s: float = Field(default=5.0, gt=0)


class RoutingSpec(_Model):
    policy: Literal["round_robin", "least_inflight"] = "round_robin"
    owner_set_size: int = Field(default=2, ge=1)
    seed: int | None = None  # default: the scenario seed


class StackSpec(_Model):
    keep: bool = False  # `run` leaves the stack up (stop it with `down`)
    precreate: bool = True  # `up` creates every partition before the brokers start
    oxia_shards: int = Field(default=1, ge=1, le=64)
    startup_timeout_s: float = Field(default=120.0, gt=0)
    # The stack stops itself after this long, in case nobody calls `down`.
    ttl_s: float = Field(default=6 * 3600.0, gt=0)
    # A load balancer in front of every broker (the reference configuration of
    # deploy/proxy/): the hammer then sends every request to it, not to owner sets.
    proxy: ProxyName = "none"


class CollectorSpec(_Model):
    interval_s: float = Field(default=30.0, gt=0)


class HammerSpec(_Model):
    interval_s: float = Field(default=30.0, gt=0)
    # Write every acknowledged (topic, partition, offset, value hash, broker) to acked.tsv
    # and read them back after the run.
    record_acks: bool = False
    down_backoff_ms: int = Field(default=500, ge=10)


class FaultSpec(_Model):
    at_s: float = Field(ge=0)  # seconds after the hammer starts
    kill_broker: str  # broker id; SIGKILL of its whole process group


class ObservabilitySpec(_Model):
    # Also publish the run's targets for the compose Prometheus (deploy/docker-compose.yml
    # mounts deploy/prometheus/file_sd), addressed through docker_host.
    compose_file_sd: bool = False
    docker_host: str = "host.docker.internal"


class Scenario(_Model):
    name: str
    description: str = ""
    seed: int = 1
    brokers: BrokersSpec = Field(default_factory=BrokersSpec)
    topics: list[TopicSpec] = Field(default_factory=lambda: [TopicSpec(name="loadtest",
                                                                       partitions=8)])
    batch: BatchSpec = Field(default_factory=BatchSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    consumer: ConsumerSpec = Field(default_factory=ConsumerSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    stack: StackSpec = Field(default_factory=StackSpec)
    collector: CollectorSpec = Field(default_factory=CollectorSpec)
    hammer: HammerSpec = Field(default_factory=HammerSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if not _NAME.fullmatch(self.name):
            raise ValueError("name: 1..64 characters of [A-Za-z0-9._-]")
        if not self.topics:
            raise ValueError("topics: at least one topic")
        names = [t.name for t in self.topics]
        if len(set(names)) != len(names):
            raise ValueError("topics: names must be unique")
        ids = set(self.broker_ids())
        writers = [b for b in self.broker_ids() if "write" in self.roles_of(b)]
        if not writers:
            raise ValueError("brokers: at least one broker needs the write role")
        if self.routing.owner_set_size > len(writers):
            raise ValueError(f"routing.owner_set_size {self.routing.owner_set_size} exceeds "
                             f"the {len(writers)} broker(s) with the write role")
        if self.stack.proxy != "none":
            partial = [b for b in self.broker_ids()
                       if not {"write", "read"} <= set(self.roles_of(b))]
            if partial:
                raise ValueError(f"stack.proxy = {self.stack.proxy!r} sends any request to "
                                 f"any broker: {', '.join(partial)} need(s) the write and "
                                 "read roles")
        for fault in self.faults:
            if fault.kill_broker not in ids:
                raise ValueError(f"faults: no broker {fault.kill_broker!r}")
        if self.batch.buffer_max_bytes < self.batch.max_bytes:
            raise ValueError("batch.buffer_max_bytes must be at least batch.max_bytes")
        return self

    def broker_ids(self) -> list[str]:
        return [f"b{i + 1}" for i in range(self.brokers.count)]

    def roles_of(self, broker_id: str) -> list[str]:
        return list(self.brokers.roles_by_broker.get(broker_id, self.brokers.roles))

    @property
    def routing_seed(self) -> int:
        return self.routing.seed if self.routing.seed is not None else self.seed

    @property
    def partition_count(self) -> int:
        return sum(t.partitions for t in self.topics)

    def metrics_info(self, run_id: str) -> dict[str, Any]:
        """The flat object passed to brokers as LLOG_LOADTEST_SCENARIO: strings become
        labels of llog_loadtest_scenario_info, numbers llog_loadtest_scenario_<key>."""
        w = self.workload
        return {
            "name": self.name,
            "run_id": run_id,
            "mode": w.mode,
            "routing_policy": self.routing.policy,
            "proxy": self.stack.proxy,
            "topics": ",".join(t.name for t in self.topics),
            "brokers": self.brokers.count,
            "workers": self.brokers.workers,
            "partitions": self.partition_count,
            "record_bytes": w.record_bytes,
            "records_per_request": w.records_per_request,
            "connections": w.connections,
            "rate": w.rate,
            "duration_s": w.duration_s,
            "batch_max_bytes": self.batch.max_bytes,
            "batch_max_delay_ms": self.batch.max_delay_ms,
            "owner_set_size": self.routing.owner_set_size,
            "seed": self.routing_seed,
            "consumer": int(self.consumer.enabled),
        }


def find_scenario(ref: str | Path) -> Path:
    """A path, or the name of a file in deploy/loadtest/scenarios (``smoke``)."""
    path = Path(ref)
    if path.is_file():
        return path
    for suffix in (".toml", ".json"):
        candidate = SCENARIO_DIR / f"{ref}{suffix}"
        if candidate.is_file():
            return candidate
    raise ScenarioError(f"no scenario file {ref!r} (nor {ref}.toml/.json in {SCENARIO_DIR})")


def parse_scenario(data: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: invalid scenario:"]
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ())) or "(scenario)"
            lines.append(f"  {loc}: {err.get('msg', 'invalid')}")
        raise ScenarioError("\n".join(lines)) from None


def load_scenario(ref: str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read and validate a scenario file; ``overrides`` are dotted keys (``workload.rate``)."""
    path = find_scenario(ref)
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a table/object at the top")
    for key, value in (overrides or {}).items():
        apply_override(data, key, value)
    return parse_scenario(data, str(path))


def apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"override {dotted}: {part} is not a table")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; the value is read as JSON when it parses."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ScenarioError(f"--set {text!r}: expected key=value")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def resolved(scenario: Scenario) -> dict[str, Any]:
    """The scenario with every default, as written to resolved-config.json."""
    doc = scenario.model_dump(mode="json")
    doc["routing"]["seed"] = scenario.routing_seed
    doc["broker_layout"] = [
        {"id": bid, "roles": scenario.roles_of(bid), "workers": scenario.brokers.workers}
        for bid in scenario.broker_ids()
    ]
    return doc


def from_resolved(doc: dict[str, Any]) -> Scenario:
    data = {k: v for k, v in doc.items() if k != "broker_layout"}
    return parse_scenario(data, "resolved-config.json")
