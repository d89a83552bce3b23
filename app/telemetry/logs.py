"""How a service process logs: text (the default) or, with ``LLOG_LOG_FORMAT=json``, one
JSON object per line, uvicorn's access log included.

Every JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``;
lines logged while a request is served also have its ``request_id``, ``method`` and
``path`` (:mod:`app.telemetry.request_id` keeps them in a context variable), and access
lines have ``client``, ``method``, ``path``, ``http_version`` and ``status``. In both
formats, the S3 credentials are replaced by ``**********`` wherever they would appear.

:func:`log_config` is the ``logging.config.dictConfig`` document given to uvicorn, which
applies it in the supervisor and in every worker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter
from uvicorn.logging import AccessFormatter, DefaultFormatter

from app.settings import Settings

REDACTED = "**********"
# The request being served by this task (request_id, method, path), or None.
REQUEST_FIELDS: ContextVar[dict[str, str] | None] = ContextVar("llog_request", default=None)
_TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class RequestFields(logging.Filter):
    """Adds the fields of the request being served to the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (REQUEST_FIELDS.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class AccessFields(logging.Filter):
    """Fields of uvicorn's access line (its arguments) as attributes of their own."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            record.client, record.method, record.path, record.http_version, \
                record.status = args
        return True


class Redacting(logging.Formatter):
    """Another formatter's output, with every secret replaced."""

    def __init__(self, inner: logging.Formatter, secrets: Sequence[str]) -> None:
        super().__init__()
        self._inner = inner
        # As they are, and as they look inside a JSON string.
        self._secrets = sorted({form for s in secrets if s
                                for form in (s, json.dumps(s)[1:-1])}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = self._inner.format(record)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


def formatter(kind: str, secrets: Sequence[str] = ()) -> logging.Formatter:
    """``json``, or the text formatters: ``text`` (the service's own lines),
    ``uvicorn`` and ``access`` (uvicorn's usual ones)."""
    inner: logging.Formatter
    if kind == "json":
        inner = JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
                              rename_fields={"levelname": "level", "name": "logger"},
                              reserved_attrs=[*RESERVED_ATTRS, "color_message"])
    elif kind == "uvicorn":
        inner = DefaultFormatter("%(levelprefix)s %(message)s")
    elif kind == "access":
        inner = AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" '
                                "%(status_code)s")
    else:
        inner = logging.Formatter(_TEXT)
    return Redacting(inner, secrets)


def log_config(settings: Settings) -> dict[str, Any]:
    """The logging configuration of a broker or compactor process."""
    secrets = [s.get_secret_value() for s in (settings.s3_access_key, settings.s3_secret_key)
               if s is not None]
    json_lines = settings.log_format == "json"

    def fmt(kind: str) -> dict[str, Any]:
        return {"()": f"{__name__}.formatter", "kind": "json" if json_lines else kind,
                "secrets": secrets}

    def handler(formatter_name: str, stream: str, *filters: str) -> dict[str, Any]:
        return {"class": "logging.StreamHandler", "stream": f"ext://sys.{stream}",
                "formatter": formatter_name, "filters": ["request", *filters]}

    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request": {"()": f"{__name__}.RequestFields"},
                    "access": {"()": f"{__name__}.AccessFields"}},
        "formatters": {"text": fmt("text"), "uvicorn": fmt("uvicorn"), "access": fmt("access")},
        "handlers": {"root": handler("text", "stderr"),
                     "uvicorn": handler("uvicorn", "stderr"),
                     "access": handler("access", "stdout", "access")},
        "root": {"handlers": ["root"], "level": "INFO"},
        "loggers": {
            "uvicorn": {"handlers": ["uvicorn"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """Once per server, after its logging is set up: ``LLOG_*`` variables that name no
    setting (a misspelled setting would otherwise be ignored without a word)."""
    for warning in Settings.unknown_variables(environ):
        logging.getLogger("app.settings").warning("%s", warning)
