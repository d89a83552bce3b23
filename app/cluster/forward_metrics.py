"""What forwarding between brokers did, as metrics (one instance per process, shared by
its forward clients and its forward server)."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

# How an APPEND frame this process sent ended.
FrameOutcome = Literal["results", "refused", "expired", "unreachable", "broken", "timeout",
                       "closed", "late"]
# What became of the groups a peer forwarded here.
ReceivedOutcome = Literal["appended", "expired", "refused"]

_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ForwardMetrics:
    """``member`` labels every series, so the workers of one server (which share a
    metrics directory) stay apart."""

    def __init__(self, registry: CollectorRegistry, member: str = "") -> None:
        self._member = member
        self._frames = Counter(
            "llog_forward_frames", "APPEND frames sent to other brokers, by how they ended "
            "(results, refused, expired: answered; unreachable: not sent; broken, timeout, "
            "closed: sent, outcome unknown; late: results that came after a timeout, "
            "counted again)", ["member", "outcome"], registry=registry)
        self._seconds = Histogram(
            "llog_forward_seconds", "APPEND frames answered by other brokers, from sending "
            "to the answer", ["member"], buckets=_TIME_BUCKETS, registry=registry)
        self._received = Counter(
            "llog_forward_received_groups", "Append groups other brokers forwarded here, "
            "by what became of them (appended: answered by the log, committed or not; "
            "expired: not taken in time, their fence lost, or their commit window over "
            "before a commit was sent: never written; refused)",
            ["member", "outcome"], registry=registry)

    def frame(self, outcome: FrameOutcome) -> None:
        self._frames.labels(self._member, outcome).inc()

    def answered(self, seconds: float) -> None:
        self._seconds.labels(self._member).observe(seconds)

    def received(self, outcome: ReceivedOutcome, groups: int) -> None:
        self._received.labels(self._member, outcome).inc(groups)
