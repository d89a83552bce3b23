"""The standalone compactor as the console's overview shows it.

A broker knows the compactor beside it only when told where it serves
(``LLOG_COMPACTOR_URL``; ``llog dev`` sets it): the compactor registers nowhere, and
brokers without the compact role never see its work. The console asks the compactor's
own ``/health`` and JSON ``/metrics`` from the broker's side (with the metrics token
when one is set, which so never reaches the browser), at most once per
:data:`FRESH_S` however many pages ask, each read bounded by :data:`TIMEOUT_S`.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
from pydantic import SecretStr

FRESH_S = 2.0
TIMEOUT_S = 1.0
# The figures of its /metrics the overview shows (summed over their labels).
FIGURES = {"lag_records": "llog_compaction_lag_records",
           "runs": "llog_compaction_runs_total",
           "records": "llog_compaction_records_total",
           "failures": "llog_compaction_failures_total"}


class CompactorProbe:
    """The last reading of the compactor at ``url``, refreshed when asked and stale."""

    def __init__(self, url: str, metrics_token: SecretStr | None) -> None:
        self.url = url.rstrip("/")
        self._headers = ({"authorization": f"Bearer {metrics_token.get_secret_value()}"}
                         if metrics_token is not None else {})
        self._client: httpx.AsyncClient | None = None
        self._lock = anyio.Lock()
        self._read_at = float("-inf")
        self._last: dict[str, Any] = {}

    async def __aenter__(self) -> CompactorProbe:
        self._client = httpx.AsyncClient(timeout=TIMEOUT_S, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def reading(self) -> dict[str, Any]:
        """``{"url", "reachable", "status", "compactor_id", "started_at_ms", the figures,
        "error"}``: what the compactor answered last (within FRESH_S)."""
        async with self._lock:  # one read at a time; the others take its answer
            if time.monotonic() - self._read_at >= FRESH_S:
                self._last = await self._read()
                self._read_at = time.monotonic()
            return self._last

    async def _read(self) -> dict[str, Any]:
        found: dict[str, Any] = {"url": self.url, "reachable": False, "error": None,
                                 **dict.fromkeys(("status", "compactor_id", "started_at_ms")),
                                 **dict.fromkeys(FIGURES)}
        if self._client is None:
            found["error"] = "the broker is not serving"
            return found
        try:
            health = await self._client.get(f"{self.url}/health")
            # 503 while it starts or drains still says which: read it as an answer.
            body = health.json()
            found.update(reachable=True, status=body.get("status"),
                         compactor_id=body.get("compactor_id"),
                         started_at_ms=body.get("started_at_ms"))
            metrics = await self._client.get(f"{self.url}/metrics")
            if metrics.status_code != 200:
                found["error"] = f"its /metrics answered {metrics.status_code}"
                return found
            samples = metrics.json().get("metrics", {})
            for field, name in FIGURES.items():
                values = samples.get(name)
                # A counter has no sample before its first count: none counted yet.
                found[field] = (sum(values.values()) if values
                                else 0.0 if name.endswith("_total") else None)
        except (httpx.HTTPError, ValueError) as exc:
            found["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return found
