"""The alert and recording rules of deploy/prometheus/: well formed, wired into the
Prometheus configurations, every expression on metrics the code exports, and checked and
unit-tested by Prometheus's own promtool (built from its pinned module)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.compactor_app import create_compactor_app
from app.localstack import binaries
from app.localstack.stack import LocalStack
from jobs.spark.textfile import job_metrics
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import BrokerFactory, make_settings

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
# Series Prometheus makes itself, not the code.
PROMETHEUS_OWN = {"up"}
_DURATION = re.compile(r"[0-9]+[smhd]")


def _all_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _rules() -> list[dict[str, Any]]:
    return [rule for rule in _all_rules() if "alert" in rule]


def _recording_rules() -> list[dict[str, Any]]:
    return [rule for rule in _all_rules() if "record" in rule]


def exported_names(text: str) -> set[str]:
    """Every name a query may use for the families of one exposition."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name} | {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type in ("histogram", "summary"):
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def test_every_rule_is_complete() -> None:
    rules = _rules()
    assert len(rules) >= 8
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert _DURATION.fullmatch(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    # What operations asked to be alerted on.
    expressions = " ".join(rule["expr"] for rule in rules)
    for name in ("llog_produce_requests_total", "llog_batcher_rejected_total",
                 "llog_compaction_lag_records_max", "llog_broker_ready",
                 "llog_audit_findings"):
        assert name in expressions, name


def test_the_recording_rules_give_coordination_cost_per_target() -> None:
    """Ratios of counters per flush and per 1,000 records, summed per scrape target as
    the alerts are (their values are unit-tested in alerts.test.yml)."""
    recording = _recording_rules()
    rules = {rule["record"]: rule["expr"] for rule in recording}
    assert len(rules) == len(recording)
    assert set(rules) == {"llog:oxia_requests_per_flush", "llog:oxia_requests_per_1k_records",
                          "llog:cas_conflicts_per_1k_records", "llog:forwarded_ratio"}
    for rule in recording:
        assert set(rule) <= {"record", "expr", "labels"}, rule["record"]
    for name, expr in rules.items():
        assert expr.count("sum by (job, instance) (rate(") == 2, name
        assert "[5m]" in expr, name
    tested = (PROMETHEUS / "alerts.test.yml").read_text()
    for name in rules:
        assert f"expr: {name}\n" in tested, f"{name} has no promtool unit test"


def test_the_dashboard_plots_only_recorded_series() -> None:
    dashboard = (ROOT / "deploy" / "grafana" / "dashboards" / "llog.json").read_text()
    used = set(re.findall(r"\bllog:[a-z0-9_:]+", dashboard))
    assert used == {rule["record"] for rule in _recording_rules()}


def test_the_prometheus_configurations_load_the_rules() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    compose_config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert compose_config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    host_config = yaml.safe_load((PROMETHEUS / "prometheus-loadtest.yml").read_text())
    assert (PROMETHEUS / host_config["rule_files"][0]).resolve() == RULES


async def _broker_names(brokers: BrokerFactory, topic: str) -> set[str]:
    # With affinity, so the membership and forwarding series are declared too.
    broker = brokers.start(affinity="forward", forward_host="127.0.0.1")
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        assert (await client.post("/produce", json=produce_body(topic, "a"))).status_code == 200
        assert (await client.post("/consume", json=consume_body(topic))).status_code == 200
        return exported_names((await client.get("/metrics/prometheus")).text)


async def _compactor_names(stack: LocalStack) -> set[str]:
    app = create_compactor_app(make_settings(stack, broker_id="rules-compactor"))
    transport = httpx.ASGITransport(app=app)
    with anyio.fail_after(60):
        async with app.router.lifespan_context(app), \
                httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            return exported_names((await client.get("/metrics/prometheus")).text)


def _audit_names() -> set[str]:
    summary = {"job": "audit", "started_ms": 0, "finished_ms": 1000, "exit_code": 1,
               "findings_by_severity": {"corruption": 1, "warning": 0, "info": 0,
                                        "error": 0},
               "orphans": {"count": 0}}
    return exported_names(generate_latest(job_metrics(summary)).decode())


async def test_every_expression_uses_exported_metrics(
        brokers: BrokerFactory, stack: LocalStack, topic: str) -> None:
    exported = (await _broker_names(brokers, topic) | await _compactor_names(stack)
                | _audit_names() | PROMETHEUS_OWN)
    for rule in _all_rules():
        name = rule.get("alert") or rule["record"]
        used = set(re.findall(r"\b(?:llog_[a-z0-9_]+|up)\b(?=\s*[{\[)=<>!]|\s*$)",
                              rule["expr"]))
        assert used, name
        assert used <= exported, f"{name}: {sorted(used - exported)} not exported"


@pytest.mark.timeout(1800)  # the first run builds promtool (minutes); later ones are cached
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = binaries.ensure_binary(binaries.PROMTOOL)
    for argv in (["check", "rules", RULES.name], ["test", "rules", "alerts.test.yml"]):
        run = subprocess.run([str(promtool), *argv], cwd=PROMETHEUS, capture_output=True,
                             text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "SUCCESS" in run.stdout
