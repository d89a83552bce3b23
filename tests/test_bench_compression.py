"""bench/perf.py's compression section: the topic setting it asks for, and a broker that
does not know the setting recognised from its answer (the row is then refused by name)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import http_bench as hb  # noqa: E402
import perf  # noqa: E402


def test_codecs_become_topic_fields() -> None:
    assert perf.topic_compression("none") == {"compression": "none"}
    assert perf.topic_compression("zstd") == {"compression": "zstd"}
    assert perf.topic_compression("zstd:9") == {"compression": "zstd", "compression_level": 9}


def test_a_refusal_naming_the_setting_is_told_apart() -> None:
    # What a broker without the setting answers (a 400 of its own validation; FastAPI's
    # would be a 422 of the same shape).
    unknown = json.dumps({"error_type": "InvalidRequest", "error": "invalid request body",
                          "details": [{"loc": "compression",
                                       "msg": "Extra inputs are not permitted"}]}).encode()
    assert hb._names_a_setting(unknown, {"compression": "zstd"})
    fastapi = json.dumps({"detail": "x", "details": [
        {"loc": ["body", "compression_level"], "msg": "too large"}]}).encode()
    assert hb._names_a_setting(fastapi, {"compression": "zstd", "compression_level": 99})
    other = json.dumps({"details": [{"loc": "partitions", "msg": "too many"}]}).encode()
    assert not hb._names_a_setting(other, {"compression": "zstd"})
    assert not hb._names_a_setting(b"not json", {"compression": "zstd"})
