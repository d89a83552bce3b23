"""Brokers on MinIO erasure coded over four drives (one node, parity 2) while a drive is
lost under load: nothing acknowledged is lost, offsets stay contiguous, and the brokers
keep serving without a restart."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from app.localstack.stack import LocalStack
from tests.helpers.failover import FailoverLoad
from tests.helpers.selection import starts_servers
from tests.helpers.stack import BrokerFactory, broker_factory, own_stack

pytestmark = pytest.mark.cluster

PARTITIONS = 8
# Compaction runs all the time, so compacted objects are written and read on the
# degraded drive set as well as WAL blobs.
BROKER = {"compaction_min_entry_age_ms": "500", "compaction_interval_s": "0.3",
          "compaction_discovery_interval_s": "1"}


@pytest.fixture(scope="module")
@starts_servers(slow=True)
def erasure_coded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with own_stack(tmp_path_factory.mktemp("minio-ec"), s3_drives=4) as running:
        yield running


@pytest.fixture
def ec_brokers(erasure_coded: LocalStack, tmp_path: Path) -> Iterator[BrokerFactory]:
    with broker_factory(erasure_coded, tmp_path / "logs") as factory:
        yield factory


def _lose(drive: Path) -> None:
    """At once (a rename), then for good: removing the tree file by file races MinIO's
    writes into it."""
    gone = drive.with_name(f"{drive.name}.lost")
    drive.rename(gone)
    shutil.rmtree(gone)


def test_the_stack_runs_minio_over_four_drives(erasure_coded: LocalStack) -> None:
    drives = erasure_coded.minio_drives()
    assert [d.name for d in drives] == ["drive1", "drive2", "drive3", "drive4"]
    client = erasure_coded.s3_client()
    try:
        client.put_object(Bucket=erasure_coded.config.bucket, Key="ec-probe", Body=b"x")
    finally:
        client.close()
    # Every drive holds a shard of the object: it is spread, not copied to one place.
    assert all(any(d.glob(f"{erasure_coded.config.bucket}/ec-probe*")) for d in drives)
    assert erasure_coded.describe()["s3_drives"] == [str(d) for d in drives]


@pytest.mark.timeout(600)
async def test_a_drive_lost_under_load_loses_nothing(
        erasure_coded: LocalStack, ec_brokers: BrokerFactory, topic: str) -> None:
    """The drive's directory is removed (as a failed disk takes its data with it):
    MinIO serves from the other three, reads reconstruct from parity."""
    b1, b2 = ec_brokers.start(**BROKER), ec_brokers.start(**BROKER)
    load = FailoverLoad([b1.url, b2.url], topic, PARTITIONS)
    lost = erasure_coded.minio_drives()[1]
    # An outer bound only: 550 acknowledgements take long on a loaded two-core machine.
    with anyio.fail_after(400):
        async with load.running(erasure_coded):
            await load.wait_acked(150)
            failed_at = time.monotonic()
            await anyio.to_thread.run_sync(_lose, lost)
            await load.wait_acked(load.acknowledged + 300)
            after = time.monotonic()
            await load.wait_acked(load.acknowledged + 100)
            await load.wait_all_served_since(after, within_s=60)
        marks = await load.verify(erasure_coded)
    figures = load.figures(failed_at, window_s=3.0).summary()
    print(json.dumps({"minio_drive_lost": figures, "records": sum(marks.values()),
                      "consume_errors": load.consume_errors}))
    await load.assert_all_served_since(after)
    assert b1.process.alive() and b2.process.alive()
    # How soon the first acknowledgement came after the loss is a figure (printed above);
    # that the 300 after it came while the drive stayed lost is the behaviour.
