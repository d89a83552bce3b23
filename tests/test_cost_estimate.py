"""The broker's running S3 cost estimate (app/observability.py): what compression saves
shows as the bucket's raw-equivalent size and the monthly storage cost it avoids."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from app.observability import (
    PRICE_PER_GB_MONTH_USD,
    S3Usage,
    s3_cost_estimate,
    stored_totals,
)
from app.stores.metrics import StoreMetrics


def test_compression_savings_are_priced_from_what_was_stored() -> None:
    # 6 GB of records stored as 1 GB; the bucket holds 2 GB.
    got = s3_cost_estimate({"put": 1000, "get": 1000}, S3Usage(stored_bytes=2 * 10**9),
                           written=(6e9, 1e9))
    assert got["estimated_raw_bytes"] == pytest.approx(12e9)
    assert got["estimated_storage_saved_usd_per_month"] == pytest.approx(
        10 * PRICE_PER_GB_MONTH_USD)
    assert got["estimated_storage_cost_usd_per_month"] == pytest.approx(
        2 * PRICE_PER_GB_MONTH_USD)
    assert got["estimated_request_cost_usd"] == pytest.approx(0.005 + 0.0004)


@pytest.mark.parametrize("written", [(0.0, 0.0), (5e6, 5e6)])
def test_nothing_compressed_saves_nothing(written: tuple[float, float]) -> None:
    got = s3_cost_estimate({}, S3Usage(stored_bytes=10**9), written=written)
    assert got["estimated_raw_bytes"] == 10**9
    assert got["estimated_storage_saved_usd_per_month"] == 0


def test_store_metrics_count_stored_bytes_of_every_kind() -> None:
    metrics = StoreMetrics(CollectorRegistry())
    assert stored_totals(metrics.stored_raw_bytes, metrics.stored_bytes) == (0.0, 0.0)
    metrics.count_stored("wal", 1000, 200)
    metrics.count_stored("chunk", 3000, 400)
    metrics.count_stored("wal", 50, 50)  # stored raw
    assert stored_totals(metrics.stored_raw_bytes, metrics.stored_bytes) == (4050.0, 650.0)
    sample = metrics.registry.get_sample_value
    assert sample("llog_stored_raw_bytes_total", {"kind": "wal"}) == 1050
    assert sample("llog_stored_bytes_total", {"kind": "chunk"}) == 400
