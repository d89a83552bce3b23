"""A job's outcome for Prometheus: ``--metrics-file PATH`` writes it in the text format
that node_exporter's textfile collector reads (``--collector.textfile.directory``), so
that alerts fire on audit findings and on jobs that fail or stop running
(deploy/prometheus/alerts.yml). The file is replaced atomically after every run,
failed runs included. Labels avoid the names alerts and scrapes set themselves (``job``,
``severity``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile


def job_metrics(summary: Mapping[str, Any]) -> CollectorRegistry:
    """The gauges of one job's ``summary.json``."""
    registry = CollectorRegistry()
    job = str(summary["job"])
    finished_ms, started_ms = summary["finished_ms"], summary["started_ms"]
    for name, doc, value in (
        ("llog_job_last_run_timestamp_seconds", "When the job's last run finished (Unix time)",
         finished_ms / 1000),
        ("llog_job_exit_code", "Exit code of the job's last run: 0 ok, 1 findings or failed "
                               "items, 2 could not run or complete, 3 unreadable metadata",
         summary["exit_code"]),
        ("llog_job_duration_seconds", "How long the job's last run took",
         (finished_ms - started_ms) / 1000),
    ):
        # Not "job": Prometheus gives that label the scrape job's name.
        Gauge(name, doc, ["job_name"], registry=registry).labels(job).set(value)
    by_severity = summary.get("findings_by_severity")
    if isinstance(by_severity, Mapping):
        findings = Gauge("llog_audit_findings",
                         "Findings of the last audit by severity (corruption, warning, info, "
                         "error)", ["finding_severity"], registry=registry)
        for severity, count in by_severity.items():
            findings.labels(severity).set(count)
    orphans = summary.get("orphans")
    if isinstance(orphans, Mapping) and "count" in orphans:
        Gauge("llog_audit_orphans", "Unreferenced objects the last audit listed",
              registry=registry).set(orphans["count"])
    return registry


def write_job_metrics(path: Path, summary: Mapping[str, Any]) -> None:
    write_to_textfile(str(path), job_metrics(summary))
