"""Per-principal Prometheus metrics, with a bounded set of label values.

Principals named in the auth file get their own label. Others (JWT subjects the file
does not name) get one while fewer than ``LLOG_AUTH_METRICS_MAX_PRINCIPALS`` of them have
been seen by this process; later ones share ``other``. A label never goes back, so a
principal's series stays one series for the life of the process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

OTHER = "other"
ANONYMOUS = "anonymous"


class PrincipalLabels:
    def __init__(self, max_unlisted: int) -> None:
        self._max = max_unlisted
        self._unlisted: set[str] = set()

    def label(self, principal: str, *, listed: bool) -> str:
        if listed or principal in self._unlisted:
            return principal
        if len(self._unlisted) < self._max and principal not in (OTHER, ANONYMOUS):
            self._unlisted.add(principal)
            return principal
        return OTHER


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llog_principal_requests", "Requests of protected endpoints by principal and "
            "HTTP status (anonymous: refused before a principal was known)",
            ["principal", "status"], registry=registry)
        self.produced_bytes = Counter(
            "llog_principal_produced_bytes", "Record bytes acknowledged by produce, by "
            "principal", ["principal"], registry=registry)
        self.consumed_bytes = Counter(
            "llog_principal_consumed_bytes", "Record bytes returned by consume, by principal",
            ["principal"], registry=registry)
        self.refusals = Counter(
            "llog_auth_refusals", "Requests refused by access control, by reason",
            ["reason"], registry=registry)
        self.reloads = Counter(
            "llog_auth_file_reloads", "Auth file loads: ok, or failed (previous kept)",
            ["outcome"], registry=registry)
