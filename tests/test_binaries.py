"""What each command builds: the local stack only its two servers, `llog servers build`
what it is asked for."""

from __future__ import annotations

import pytest

from app.localstack import binaries


def test_the_local_stack_builds_only_oxia_and_minio() -> None:
    assert [m.name for m in binaries.STACK] == ["oxia", "minio"]


def test_servers_build_takes_names_or_builds_everything() -> None:
    assert [m.name for m in binaries.by_name(["minio", "caddy"])] == ["minio", "caddy"]
    assert [m.name for m in binaries.by_name([])] == [
        "oxia", "minio", "caddy", "promtool", "oapi-codegen"]
    with pytest.raises(binaries.BuildError, match="no such server or tool: kafka"):
        binaries.by_name(["kafka", "oxia"])
