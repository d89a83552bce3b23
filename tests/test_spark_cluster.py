"""The Spark jobs on a Spark standalone cluster (a master and two workers started from
pyspark's own ``spark-class``) through ``spark-submit``, the project's code shipped to
the executors on ``--py-files``, against the real Oxia and MinIO: a backfill writes
every record once, and an audit of the result finds it clean."""

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
from tests.helpers.spark_support import SPARK_TESTS, read_summary, run, stack_settings
from tests.helpers.stack import Engine

pytestmark = SPARK_TESTS
SUBMIT_TIMEOUT_S = 420.0


@pytest.fixture(scope="module")
@starts_servers(slow=True, group=SPARK_GROUP)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    # A generous outer bound: two JVM workers registering on a loaded two-core machine
    # once took longer than the 90 s default, which bounds nothing this test asserts.
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1,
                     memory="768m", startup_timeout_s=240.0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


# Two applications, each starting a driver and two executor JVMs and their Python
# workers: 1-2 minutes alone, and over 5 on a two-core machine running the rest of the
# suite beside it. Each submit has a bound of its own (reporting what the job printed).
@pytest.mark.timeout(2 * SUBMIT_TIMEOUT_S + 120)
def test_backfill_and_audit_run_on_a_standalone_cluster(
        stack: LocalStack, cluster: SparkCluster, topic: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    settings = stack_settings(stack)
    n = 600
    pq.write_table(pa.table({"topic": [topic] * n, "partition": [i % 3 for i in range(n)],
                             "value": [f"v{i}" for i in range(n)]}), tmp_path / "in.parquet")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LLOG_")},
           **stack.settings_env(), "LLOG_ROOT_PREFIX": settings.root_prefix}
    conf = {"spark.ui.enabled": "false", "spark.executor.memory": "512m",
            "spark.sql.shuffle.partitions": "4"}

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

    audit = cluster.submit(["audit", "--report", str(tmp_path / "audit"),
                            "--progress-interval", "0"], env=env, conf=conf,
                           timeout=SUBMIT_TIMEOUT_S)
    assert audit.returncode == 0, audit.stderr[-4000:]
    report: dict[str, Any] = read_summary(tmp_path / "audit")
    assert report["status"] == "ok" and report["partitions"] == 3
    assert "llog-audit" in cluster.completed_applications()
    assert cluster.alive_workers() == 2


def test_a_job_past_its_time_is_killed_and_reports_what_it_printed(tmp_path: Path) -> None:
    # No master listens on port 1: the driver would try to reach one for a minute.
    with pytest.raises(SparkJobTimeout, match=r"spark-submit audit did not finish in 3s"):
        submit("spark://127.0.0.1:1", ["audit", "--report", str(tmp_path / "audit")],
               tmp_path / "llog-code.zip", timeout=3)
