"""The Spark jobs on a Spark standalone cluster (a master and a worker of two cores
started from pyspark's own ``spark-class``) through ``spark-submit``, the project's code
shipped to the executors on ``--py-files``, against the real Oxia and MinIO: a backfill
writes every record once, and an audit of the result finds it clean. One application is
submitted (every job reaches the cluster by the same ``submit``); the audit runs in the
suite's own Spark session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.localstack.spark_cluster import SparkCluster, SparkJobTimeout, submit
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from tests.helpers.selection import SPARK_GROUP, starts_servers
from tests.helpers.spark_support import (
    SPARK_TESTS,
    TEST_JVM_OPTIONS,
    read_summary,
    run,
    stack_settings,
)
from tests.helpers.stack import Engine

pytestmark = SPARK_TESTS
SUBMIT_TIMEOUT_S = 420.0


@pytest.fixture(scope="module")
@starts_servers(slow=True, group=SPARK_GROUP)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    # A generous outer bound: JVM workers registering on a loaded two-core machine once
    # took longer than the 90 s default, which bounds nothing this test asserts. One
    # worker of two cores: its executor runs two tasks at once, as two workers' would.
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=1, cores=2,
                     memory="768m", startup_timeout_s=240.0,
                     daemon_java_options=TEST_JVM_OPTIONS)
    try:
        c.start()
        yield c
    finally:
        c.stop()


# An application starts a driver, an executor JVM and their Python workers: a minute
# alone, and several on a two-core machine running the rest of the suite beside it. The
# submit has a bound of its own (reporting what the job printed).
@pytest.mark.timeout(SUBMIT_TIMEOUT_S + 240)
def test_backfill_and_audit_run_on_a_standalone_cluster(
        stack: LocalStack, cluster: SparkCluster, spark: Any, topic: str,
        tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.spark.audit import AuditOptions, run_audit
    from jobs.spark.report import Report

    settings = stack_settings(stack)
    n = 600
    pq.write_table(pa.table({"topic": [topic] * n, "partition": [i % 3 for i in range(n)],
                             "value": [f"v{i}" for i in range(n)]}), tmp_path / "in.parquet")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LLOG_")},
           **stack.settings_env(), "LLOG_ROOT_PREFIX": settings.root_prefix}
    # The JVMs of the tests' own session: quicker to start, lighter to run.
    conf = {"spark.ui.enabled": "false", "spark.executor.memory": "512m",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
            "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS}

    backfill = cluster.submit(
        ["backfill", "--report", str(tmp_path / "backfill"), "--input",
         str(tmp_path / "in.parquet"), "--topic-column", "topic", "--partition-column",
         "partition", "--chunk-records", "50", "--progress-interval", "0"],
        env=env, conf=conf, timeout=SUBMIT_TIMEOUT_S)
    assert backfill.returncode == 0, backfill.stderr[-4000:]
    summary = read_summary(tmp_path / "backfill")
    assert summary["records_appended"] == n
    # The job ran as an application of the cluster (its executors on the workers).
    assert "llog-backfill" in cluster.completed_applications()

    async def counts(e: Engine) -> list[int]:
        return [await e.reader.high_watermark(TopicPartition(topic, p)) for p in range(3)]

    assert run(settings, counts) == [n // 3] * 3

    audit = run_audit(spark, settings, AuditOptions(), Report(tmp_path / "audit"))
    assert audit.exit_code == 0, audit.summary
    report: dict[str, Any] = read_summary(tmp_path / "audit")
    assert report["status"] == "ok" and report["partitions"] == 3
    assert cluster.alive_workers() == 1


def test_a_job_past_its_time_is_killed_and_reports_what_it_printed(tmp_path: Path) -> None:
    # No master listens on port 1: the driver would try to reach one for a minute.
    with pytest.raises(SparkJobTimeout, match=r"spark-submit audit did not finish in 3s"):
        submit("spark://127.0.0.1:1", ["audit", "--report", str(tmp_path / "audit")],
               tmp_path / "llog-code.zip", timeout=3)
