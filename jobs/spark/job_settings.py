"""Settings of a job, and how they travel to Spark's executors.

Each task rebuilds a :class:`Settings` from the plain ``LLOG_*`` dictionary of
:meth:`Settings.as_env` captured in its closure: strings rather than a pickled object,
so an executor with another Python build, or a job submitted from another host, gets
exactly what ``LLOG_*`` would give it.

Hence the functions of the jobs that make such a payload (for their tasks, or to open
the stores on the driver with :func:`jobs.spark.stores.open_stores`), and those that
hand the settings on to them, take the whole :class:`Settings`: every group goes to the
tasks. The others take the groups they read (``S3Settings``, ``StoreSettings``, ...),
two parameters when they read two; a ``Settings`` is an instance of every group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.settings import Settings

SettingsPayload = dict[str, str]


def settings_payload(settings: Settings) -> SettingsPayload:
    """The settings as plain ``LLOG_*`` strings: picklable and free of secrets' objects."""
    return settings.as_env()


def settings_from_payload(payload: Mapping[str, str], **overrides: object) -> Settings:
    values: dict[str, Any] = {
        key[len("LLOG_"):].lower(): value
        for key, value in payload.items() if key.startswith("LLOG_")
    }
    values.update(overrides)
    return Settings(**values)


_STACK_FIELDS = ("oxia_address", "oxia_namespace", "s3_endpoint", "s3_bucket", "s3_region",
                 "s3_access_key", "s3_secret_key", "root_prefix")


def load_settings(stack_json: Path | None = None, root_prefix: str | None = None) -> Settings:
    """``LLOG_*`` environment, optionally overridden by an ``llog dev`` stack.json."""
    overrides: dict[str, object] = {}
    if stack_json is not None:
        data = json.loads(stack_json.read_text())
        overrides.update({k: data[k] for k in _STACK_FIELDS if data.get(k) is not None})
    if root_prefix:
        overrides["root_prefix"] = root_prefix
    return Settings.from_env(**overrides)
