"""Every metric a live broker and the compactor export follows Prometheus naming:
cumulative values are counters ending ``_total``, gauges never end ``_total``, times are
in seconds (no millisecond unit in a name), and every family says what it is."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.compactor_app import create_compactor_app
from app.localstack.stack import LocalStack
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import BrokerFactory, make_settings

# A unit other than seconds for a time, anywhere in a name.
_NOT_SECONDS = re.compile(r"_(ms|msec|millis|milliseconds|us|micros|ns|nanos|minutes|hours)"
                          r"(_|$)")
SCENARIO = {"name": "naming", "brokers": 1, "duration_s": 3, "batch_max_delay_ms": 5}


def naming_problems(text: str) -> list[str]:
    """What breaks the naming rules in one exposition."""
    problems = []
    for family in text_string_to_metric_families(text):
        names = {s.name for s in family.samples if not s.name.endswith("_created")}
        if not family.documentation.strip():
            problems.append(f"{family.name}: no help text")
        if family.type == "counter":
            problems += [f"{n}: a counter sample not ending _total" for n in names
                         if not n.endswith("_total")]
        elif family.name.endswith("_total") or any(n.endswith("_total") for n in names):
            problems.append(f"{family.name}: a {family.type} named _total")
        if _NOT_SECONDS.search(family.name):
            problems.append(f"{family.name}: a time not in seconds")
    return problems


def test_the_rules_catch_what_they_are_about() -> None:
    bad = "\n".join([
        "# HELP a_total x", "# TYPE a_total gauge", "a_total 1",
        "# HELP b_lag_ms x", "# TYPE b_lag_ms gauge", "b_lag_ms 1",
        "# TYPE c gauge", "c 1",
    ]) + "\n"
    assert naming_problems(bad) == ["a_total: a gauge named _total",
                                    "b_lag_ms: a time not in seconds", "c: no help text"]


async def _exercise_and_scrape(url: str, topic: str) -> tuple[str, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        assert (await client.post("/produce", json=produce_body(topic, "a", "b"))
                ).status_code == 200
        assert (await client.post("/consume", json=consume_body(topic, 1))).status_code == 200
        assert (await client.post("/produce", json={"bad": 1})).status_code == 400
        text = (await client.get("/metrics/prometheus")).text
        snapshot: dict[str, Any] = (await client.get("/metrics")).json()
    return text, snapshot


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_live_broker_names_its_metrics_by_the_rules(
        brokers: BrokerFactory, topic: str, workers: int) -> None:
    broker = brokers.start(workers=workers, loadtest_scenario=json.dumps(SCENARIO),
                           affinity="forward")
    text, snapshot = await _exercise_and_scrape(broker.url, topic)
    assert not naming_problems(text)
    families = {f.name for f in text_string_to_metric_families(text)}
    # Families from every kind of source are in the walk (native, snapshots, views).
    assert {"llog_produce_requests", "llog_batcher_buffered_bytes", "llog_tail_cache_hits",
            "llog_s3_estimated_request_cost_usd", "llog_compaction_lag_records",
            "llog_broker_info", "llog_loadtest_scenario_batch_max_delay_seconds",
            "llog_http_request_duration_seconds", "llog_membership_members",
            "llog_membership_changes"} <= families
    # The JSON snapshot carries the same sample names.
    for name in snapshot["metrics"]:
        assert not _NOT_SECONDS.search(name), name
    assert "llog_s3_usage_scan_timestamp_seconds" in snapshot["metrics"]


async def test_the_compactor_names_its_metrics_by_the_rules(stack: LocalStack) -> None:
    app = create_compactor_app(make_settings(stack, broker_id="naming-compactor"))
    transport = httpx.ASGITransport(app=app)
    with anyio.fail_after(60):
        async with app.router.lifespan_context(app), \
                httpx.AsyncClient(transport=transport, base_url="http://compactor") as client:
            text = (await client.get("/metrics/prometheus")).text
    assert not naming_problems(text)
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"llog_compaction_lag_records", "llog_compaction_partitions_known",
            "llog_s3_estimated_request_cost_usd", "llog_compactor_info"} <= families
