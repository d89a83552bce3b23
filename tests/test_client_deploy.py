"""The deployment files, checked without a Docker engine: the compose stack builds what
is not an allow-listed published image, never runs the published Oxia (whose 0.14.0
release wedges shards), checks every long-running service's health, and the images run
as non-root users."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
# Published images the stack may pull: pinned versions of projects that still publish.
ALLOWED_IMAGES = {"prom/prometheus", "grafana/grafana"}
ALLOWED_BASES = {"python:3.11-slim-bookworm", "golang:1.26-bookworm"}


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(path: Path) -> dict[str, Stage]:
    """The stages of a Dockerfile by name (unnamed ones by index), ARG defaults of the
    global scope substituted into FROM lines."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and current is None and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
        elif keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name, words[0])
        elif current is not None:
            current.instructions.append((keyword, rest.strip()))
    return stages


def effective(stages: dict[str, Stage], name: str, keyword: str) -> list[str]:
    """A stage's instructions of one kind, its parent stages' first."""
    stage = stages[name]
    inherited = effective(stages, stage.base, keyword) if stage.base in stages else []
    return inherited + [rest for k, rest in stage.instructions if k == keyword]


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _build_stage(service: dict[str, Any]) -> tuple[dict[str, Stage], str]:
    build = service["build"]
    dockerfile = (COMPOSE.parent / build["context"] / build.get("dockerfile", "Dockerfile"))
    stages = dockerfile_stages(dockerfile.resolve())
    return stages, build.get("target") or list(stages)[-1]


def test_every_image_is_built_here_or_allow_listed() -> None:
    for name, service in _compose()["services"].items():
        image = service.get("image", "")
        assert not image.startswith(("oxia/", "minio/")), f"{name} runs {image}"
        if "build" in service:
            stages, target = _build_stage(service)
            assert target in stages, f"{name}: no stage {target}"
            continue
        repository, _, tag = image.partition(":")
        assert repository in ALLOWED_IMAGES, f"{name}: {image} is not allow-listed"
        assert tag and tag != "latest", f"{name}: {image} is not pinned"


def test_every_long_running_service_checks_its_health() -> None:
    for name, service in _compose()["services"].items():
        if service.get("restart") == "no":
            continue  # one-shot jobs finish instead
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
        if "build" in service:
            stages, target = _build_stage(service)
            assert effective(stages, target, "HEALTHCHECK"), f"{name}'s image has none"


def test_images_run_as_non_root_users() -> None:
    for path, targets in ((ROOT / "Dockerfile", None),
                          (ROOT / "deploy/images/servers.Dockerfile", ["oxia", "minio"])):
        stages = dockerfile_stages(path)
        for target in targets or [list(stages)[-1]]:
            users = effective(stages, target, "USER")
            assert users and users[-1].split(":")[0] not in ("root", "0"), (path, target)


def test_the_broker_image_is_healthy_only_when_ready() -> None:
    stages = dockerfile_stages(ROOT / "Dockerfile")
    (check,) = effective(stages, list(stages)[-1], "HEALTHCHECK")
    assert "/health/ready" in check


def test_servers_are_built_by_llog_from_the_pinned_modules() -> None:
    stages = dockerfile_stages(ROOT / "deploy/images/servers.Dockerfile")
    for stage in stages.values():
        assert stage.base in stages or stage.base in ALLOWED_BASES, stage.base
    runs = " ".join(effective(stages, "build", "RUN"))
    assert "llog servers build" in runs
    assert "deploy/servers/" in " ".join(effective(stages, "build", "COPY"))
    go_image = next(s.base for s in stages.values() if s.base.startswith("golang:"))
    image_go = tuple(int(p) for p in re.findall(r"\d+", go_image.split(":")[1])[:2])
    for go_mod in (ROOT / "deploy/servers").glob("*/go.mod"):
        match = re.search(r"^go (\d+)\.(\d+)", go_mod.read_text(), re.MULTILINE)
        assert match is not None
        assert image_go >= (int(match.group(1)), int(match.group(2))), go_mod


def test_the_create_bucket_job_creates_once_and_accepts_an_existing_bucket(
    stack: Any, s3_client: Any
) -> None:
    bucket = f"compose-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, **stack.settings_env(), "LLOG_S3_BUCKET": bucket}
    for expected in (b"created bucket", b"exists"):
        done = subprocess.run([sys.executable, str(ROOT / "deploy/images/create_bucket.py")],
                              env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0 and expected in done.stdout, done.stderr
    assert bucket in [b["Name"] for b in s3_client.list_buckets()["Buckets"]]
    s3_client.delete_bucket(Bucket=bucket)
