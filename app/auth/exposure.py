"""A broker reachable beyond this host with access control off, said out loud.

``LLOG_AUTH`` defaults to off so that a broker on loopback (development, tests) needs no
keys. Listening on any other address with it off lets anyone who reaches the port
produce, consume, delete topics and read the metrics; unless the operator chose that
(``LLOG_AUTH=off`` given explicitly), the broker logs a WARNING when it starts and
exports ``llog_insecure_listener 1`` for an alert to find.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.settings import Settings

log = logging.getLogger(__name__)

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (LLOG_HOST, ``llog serve --host``) binds loopback only; any
    other name or address (0.0.0.0, ::, a routable address or a host name) is not."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def insecure_listener(settings: Settings) -> bool:
    """Listening beyond loopback with auth off, and not by the operator's explicit choice."""
    return (not settings.auth_enabled and not settings.auth_off_on_purpose
            and not is_loopback(settings.host))


class ExposureCollector(Collector):
    """``llog_insecure_listener``: 1 while this broker is the kind :func:`insecure_listener`
    describes, else 0 (always exported, so an alert can tell "safe" from "not scraped")."""

    def __init__(self, insecure: bool) -> None:
        self._value = float(insecure)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "llog_insecure_listener",
            "1: listening beyond loopback with access control off (LLOG_AUTH unset); set "
            "LLOG_AUTH=on, or LLOG_AUTH=off to say it is on purpose", value=self._value)


def announce(settings: Settings) -> ExposureCollector:
    """Warn now if the broker is an insecure listener; its metric, to register."""
    insecure = insecure_listener(settings)
    if insecure:
        log.warning(
            "INSECURE: listening on %s:%d with access control off: anyone who reaches "
            "this port may produce, consume, change topics and read the metrics. Set "
            "LLOG_AUTH=on with LLOG_AUTH_FILE (docs/operations.md, Security), or "
            "LLOG_AUTH=off if this is on purpose", settings.host, settings.port)
    return ExposureCollector(insecure)
