"""The Kubernetes deployment (deploy/k8s/) and the compose file, checked without a cluster.

Both renders (the base and the example overlay) are built with kustomize (pinned in
deploy/tools/kustomize/, built through the Go module proxy) and every object is validated
strictly (unknown fields rejected) against the Kubernetes API schemas that the PyPI
package kubernetes-validate ships, for the oldest and the newest Kubernetes versions the
manifests support. Then what the broker needs: probes on its real health routes, a grace
period that outlasts the drain, ingress limits that match the reference nginx
configuration and the settings, credentials only from the Secret, only real LLOG_*
settings, and an audit CronJob whose exit codes mean what the Spark jobs say.
deploy/docker-compose.yml is validated against the compose specification's schema
(vendored by the PyPI package check-jsonschema).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.auth import authfile
from app.auth.exposure import insecure_listener
from app.cli import build_parser, cmd_compactor, cmd_serve
from app.localstack.binaries import BuildError
from app.routes import health, metrics
from app.settings import Settings
from jobs.spark.report import EXIT_FAILED, EXIT_FINDINGS
from tests.helpers.kustomize import ensure_kustomize, render
from tests.helpers.selection import slow_fixture
from tests.test_client_deploy import dockerfile_stages, effective

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
RENDERS = {"base": K8S / "base", "example": K8S / "overlays" / "example"}
# 1.31: podFailurePolicy and unhealthyPodEvictionPolicy are GA; 1.37: the newest schemas
# kubernetes-validate ships. Both must accept every object.
KUBERNETES_VERSIONS = ("1.31", "1.37")
SECRET_KEYS = ("LLOG_S3_ACCESS_KEY", "LLOG_S3_SECRET_KEY")
# Operator inputs: set by the overlay, never by the base.
ENDPOINT_KEYS = ("LLOG_OXIA_ADDRESS", "LLOG_S3_ENDPOINT", "LLOG_S3_BUCKET")
JOBS_IMAGE = "leaderless-log-jobs"
UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3,
         "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}

Obj = dict[str, Any]


# -- rendering ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
@slow_fixture
def kustomize() -> Path:
    if shutil.which("go") is None:
        pytest.skip("kustomize is built from deploy/tools/kustomize with Go: no `go` on PATH")
    try:
        return ensure_kustomize()
    except BuildError as exc:
        pytest.fail(f"could not build kustomize from deploy/tools/kustomize: {exc}")


@pytest.fixture(scope="session")
def renders(kustomize: Path) -> dict[str, list[Obj]]:
    return {name: render(kustomize, path) for name, path in RENDERS.items()}


@pytest.fixture(scope="session")
def example(renders: dict[str, list[Obj]]) -> list[Obj]:
    return renders["example"]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    """One object by kind and name; generated names (name-<hash>) count as the name."""
    found = [o for o in objs if o["kind"] == kind
             and re.fullmatch(rf"{re.escape(name)}(-[a-z0-9]{{10}})?", o["metadata"]["name"])]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_templates(objs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    """(workload name, pod template) of every Deployment and CronJob."""
    for obj in objs:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["name"], obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            yield obj["metadata"]["name"], obj["spec"]["jobTemplate"]["spec"]["template"]


def containers(objs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for name, template in pod_templates(objs):
        for container in template["spec"]["containers"]:
            yield name, container


def container_of(objs: list[Obj], kind: str, name: str) -> Obj:
    (container,) = dict(pod_templates([find(objs, kind, name)]))[name]["spec"]["containers"]
    result: Obj = container
    return result


def settings_of(objs: list[Obj]) -> Settings:
    """The settings the ConfigMap gives (invalid values fail here)."""
    data = find(objs, "ConfigMap", "llog-config")["data"]
    return Settings(**{key.removeprefix("LLOG_").lower(): value for key, value in data.items()})


def quantity(text: str | int) -> float:
    """A Kubernetes quantity: 500m, 2, 1536Mi, 4Gi."""
    match = re.fullmatch(r"([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?", str(text))
    assert match is not None, text
    number, unit = float(match.group(1)), match.group(2) or ""
    return number / 1000 if unit == "m" else number * UNITS[unit]


# -- schemas ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def k8s_schemas() -> Any:
    return pytest.importorskip(
        "kubernetes_validate.utils",
        reason="kubernetes-validate ships the Kubernetes schemas: pip install -e '.[dev]'")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("render_name", sorted(RENDERS))
def test_every_object_is_valid_kubernetes(renders: dict[str, list[Obj]], k8s_schemas: Any,
                                          render_name: str, version: str) -> None:
    objs = renders[render_name]
    assert len(objs) >= 10
    problems: list[str] = []
    for obj in objs:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            k8s_schemas.validate(obj, version, strict=True)
        except k8s_schemas.SchemaNotFoundError as exc:
            problems.append(f"{what}: no schema, so nothing checked: {exc.message}")
        except k8s_schemas.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{what}: {where}: {exc.message}")
    assert problems == [], f"{render_name} is not valid Kubernetes {version}"


def test_the_validation_is_strict(example: list[Obj], k8s_schemas: Any) -> None:
    deployment = find(example, "Deployment", "llog-broker")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    mistyped = copy.deepcopy(deployment)
    mistyped["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "60"
    for wrong in (misspelt, mistyped):
        with pytest.raises(k8s_schemas.ValidationError):
            k8s_schemas.validate(wrong, KUBERNETES_VERSIONS[0], strict=True)


# -- settings and credentials -------------------------------------------------------------

def test_every_llog_variable_is_a_real_setting(renders: dict[str, list[Obj]]) -> None:
    known = {f"LLOG_{name.upper()}" for name in Settings.model_fields}
    for render_name, objs in renders.items():
        keys = set(find(objs, "ConfigMap", "llog-config")["data"])
        for _, container in containers(objs):
            keys |= {e["name"] for e in container.get("env", [])
                     if e["name"].startswith("LLOG_")}
        assert keys - known == set(), f"{render_name}: not settings: {sorted(keys - known)}"
        settings_of(objs)  # and every value in the ConfigMap is valid


def test_the_operator_sets_the_endpoints_in_the_overlay(renders: dict[str, list[Obj]]) -> None:
    base = find(renders["base"], "ConfigMap", "llog-config")["data"]
    example = find(renders["example"], "ConfigMap", "llog-config")["data"]
    for key in ENDPOINT_KEYS:
        assert key not in base, f"{key} is an operator input: set it in the overlay"
        assert example.get(key), f"the example overlay does not show {key}"


def test_credentials_come_from_the_secret_only(example: list[Obj]) -> None:
    config = find(example, "ConfigMap", "llog-config")
    secret = find(example, "Secret", "llog-s3-credentials")
    assert set(secret["data"]) == set(SECRET_KEYS)
    assert not set(config["data"]) & set(SECRET_KEYS), "credentials inlined in the ConfigMap"
    for name, container in containers(example):
        env = {e["name"]: e for e in container.get("env", [])}
        for key in SECRET_KEYS:
            ref = env[key].get("valueFrom", {}).get("secretKeyRef")
            assert ref and "value" not in env[key], f"{name}: {key} is not from the Secret"
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] == key, name
        sources = [s["configMapRef"]["name"] for s in container["envFrom"]]
        assert sources == [config["metadata"]["name"]], name


# -- probes, drain, roles -----------------------------------------------------------------

def _probe_target(container: Obj, probe: str) -> tuple[str, int]:
    get = container[probe]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    return get["path"], ports.get(get["port"], get["port"])


@pytest.mark.parametrize("workload, command", [("llog-broker", cmd_serve),
                                               ("llog-compactor", cmd_compactor)])
def test_services_run_the_real_command_and_probe_its_health_routes(
        example: list[Obj], workload: str, command: Any) -> None:
    container = container_of(example, "Deployment", workload)
    assert container["command"] == ["llog"]
    args = build_parser().parse_args(container["args"])
    assert args.func is command and args.host == "0.0.0.0"
    routes = {route.path for route in health.router.routes}
    expected = {"readinessProbe": "/health/ready", "livenessProbe": "/health/live",
                "startupProbe": "/health/live"}
    for probe, path in expected.items():
        assert _probe_target(container, probe) == (path, args.port), (workload, probe)
        assert path in routes
    assert "lifecycle" not in container, "the process drains on SIGTERM by itself"


def _graceful_shutdown_s(source: Path) -> int:
    """uvicorn's graceful shutdown as the module sets it: in the call, or as the
    constant the call names."""
    (value,) = re.findall(r"timeout_graceful_shutdown=(\d+)|^GRACEFUL_SHUTDOWN_S = (\d+)",
                          source.read_text(), flags=re.MULTILINE)
    return int(value[0] or value[1])


def test_the_grace_period_outlasts_the_drain(example: list[Obj]) -> None:
    settings = settings_of(example)
    for workload, source in (("llog-broker", ROOT / "app/cli.py"),
                             ("llog-compactor", ROOT / "app/compaction/commands.py")):
        pod = find(example, "Deployment", workload)["spec"]["template"]["spec"]
        in_flight_s = _graceful_shutdown_s(source)
        assert pod["terminationGracePeriodSeconds"] >= settings.drain_s + in_flight_s, workload
        # docs/operations.md: the drain outlasts the time a probe needs to take a pod out.
        ready = pod["containers"][0]["readinessProbe"]
        noticed_s = ready["periodSeconds"] * ready["failureThreshold"] + ready["periodSeconds"]
        assert settings.drain_s >= noticed_s, workload


def test_brokers_leave_compaction_to_the_compactor(example: list[Obj]) -> None:
    env = {e["name"]: e.get("value") for e in container_of(
        example, "Deployment", "llog-broker")["env"]}
    roles = Settings(roles=env["LLOG_ROLES"]).roles
    assert set(roles) == {"write", "read"}
    assert find(example, "Deployment", "llog-compactor")["spec"]["replicas"] >= 1


# -- the edge -----------------------------------------------------------------------------

def _nginx_directives() -> dict[str, str]:
    text = (ROOT / "deploy/proxy/nginx.conf.tmpl").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s*(proxy_\w+)\s+([^;]+);", text,
                                                        re.MULTILINE)}


def _nginx_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([kmg]?)", text.lower())
    assert match is not None, text
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2) or " ")


def test_the_ingress_matches_the_reference_nginx_and_the_settings(example: list[Obj]) -> None:
    settings = settings_of(example)
    ingress = find(example, "Ingress", "llog-broker")
    notes = {k.removeprefix("nginx.ingress.kubernetes.io/"): v
             for k, v in ingress["metadata"]["annotations"].items()}
    nginx = _nginx_directives()
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(notes[timeout]) * 1000 > settings.max_wait_ms_ceiling, timeout
    assert f"{notes['proxy-read-timeout']}s" == nginx["proxy_read_timeout"]
    assert f"{notes['proxy-connect-timeout']}s" == nginx["proxy_connect_timeout"]
    assert _nginx_size(notes["proxy-body-size"]) == settings.max_request_bytes
    assert notes["proxy-buffering"] == nginx["proxy_buffering"] == "off"
    assert notes["proxy-request-buffering"] == nginx["proxy_request_buffering"] == "off"
    retry_on = notes["proxy-next-upstream"].split()
    assert retry_on == nginx["proxy_next_upstream"].split()
    assert "non_idempotent" not in retry_on and not any(r.startswith("http_") for r in retry_on)
    assert notes["proxy-next-upstream-tries"] == nginx["proxy_next_upstream_tries"]
    # The ingress reaches the broker Service's named port, and it the brokers only.
    service = find(example, "Service", "llog-broker")
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    broker_labels = find(example, "Deployment", "llog-broker")["spec"]["template"]["metadata"]
    assert service["spec"]["selector"].items() <= broker_labels["labels"].items()
    compactor = find(example, "Deployment", "llog-compactor")["spec"]["template"]["metadata"]
    assert not service["spec"]["selector"].items() <= compactor["labels"].items()


def test_metrics_are_scraped_from_every_pod_never_through_the_service(
        example: list[Obj]) -> None:
    routes = {route.path for route in metrics.router.routes}
    for workload in ("llog-broker", "llog-compactor"):
        template = find(example, "Deployment", workload)["spec"]["template"]
        notes = template["metadata"]["annotations"]
        (container,) = template["spec"]["containers"]
        assert notes["prometheus.io/scrape"] == "true", workload
        assert notes["prometheus.io/path"] in routes, workload
        ports = [p["containerPort"] for p in container["ports"]]
        assert int(notes["prometheus.io/port"]) in ports, workload
    for service in (o for o in example if o["kind"] == "Service"):
        assert not any(k.startswith("prometheus.io/")
                       for k in service["metadata"].get("annotations", {}))
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/kubernetes-pods.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert [sd["role"] for sd in job["kubernetes_sd_configs"]] == ["pod"]
    sources = {tuple(r["source_labels"]) for r in job["relabel_configs"]}
    assert ("__meta_kubernetes_pod_annotation_prometheus_io_scrape",) in sources


# -- access control and metrics -----------------------------------------------------------

def _secret_data(objs: list[Obj], name: str) -> dict[str, str]:
    """A Secret's values, decoded."""
    data = find(objs, "Secret", name).get("data", {})
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def _served_settings(objs: list[Obj], workload: str) -> Settings:
    """What the workload's process reads: the ConfigMap, its literal env and the
    listen address of its command (values from Secrets left out, but for a stand-in
    cluster secret where the container reads one: forwarding refuses to run without)."""
    container = container_of(objs, "Deployment", workload)
    env = container.get("env", [])
    values = {**find(objs, "ConfigMap", "llog-config")["data"],
              **{e["name"]: e["value"] for e in env if "value" in e}}
    if any(e["name"] == "LLOG_CLUSTER_SECRET" for e in env):
        values["LLOG_CLUSTER_SECRET"] = "a-stand-in-for-the-secret"
    args = build_parser().parse_args(container["args"])
    return Settings(**{k.removeprefix("LLOG_").lower(): v for k, v in values.items()},
                    host=args.host, port=args.port)


def test_brokers_serve_with_access_control_on_from_a_secret(example: list[Obj]) -> None:
    settings = _served_settings(example, "llog-broker")
    assert settings.auth_enabled and settings.auth_file is not None
    assert not insecure_listener(settings)
    template = find(example, "Deployment", "llog-broker")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"]
                if m["mountPath"] == str(settings.auth_file.parent)]
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees the Secret's updates"
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    (item,) = [i for i in secret["items"] if i["path"] == settings.auth_file.name]
    text = _secret_data(example, secret["secretName"])[item["key"]]
    authfile.parse(text)  # the shipped file is a valid auth file
    # Its name stays the same when the file changes, so brokers reload it in place.
    assert find(example, "Secret", "llog-auth")["metadata"]["name"] == "llog-auth"
    assert settings.produce_locations == "admin"


def test_metrics_answer_only_the_scrapers_token(example: list[Obj]) -> None:
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/kubernetes-pods.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["authorization"]["type"] == "Bearer"
    sent_file = Path(job["authorization"]["credentials_file"])
    for workload in ("llog-broker", "llog-compactor"):
        assert _served_settings(example, workload).auth_metrics == "open", workload
        env = {e["name"]: e for e in container_of(example, "Deployment", workload)["env"]}
        ref = env["LLOG_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
        secret = find(example, "Secret", "llog-metrics-token")
        assert ref["name"] == secret["metadata"]["name"], workload
        # Prometheus mounts the same Secret: the file it sends is the key the pods read.
        assert sent_file.name == ref["key"] and sent_file.parent.name == "llog-metrics-token"
        placeholder = _secret_data(example, "llog-metrics-token")[ref["key"]]
        with pytest.raises(ValidationError, match="LLOG_METRICS_TOKEN"):
            Settings(metrics_token=placeholder)  # never deployed as it is


def test_brokers_share_one_stream_ticket_secret(example: list[Obj]) -> None:
    """Behind the Service a ticket minted by one broker is redeemed by another: every
    broker reads the same key from one Secret, whose placeholder is never deployed."""
    env = {e["name"]: e for e in container_of(example, "Deployment", "llog-broker")["env"]}
    ref = env["LLOG_STREAM_TICKET_SECRET"]["valueFrom"]["secretKeyRef"]
    secret = find(example, "Secret", "llog-stream-ticket-secret")
    assert ref["name"] == secret["metadata"]["name"]
    placeholder = _secret_data(example, "llog-stream-ticket-secret")[ref["key"]]
    with pytest.raises(ValidationError, match="stream_ticket_secret"):
        Settings(stream_ticket_secret=placeholder)


def test_brokers_forward_to_each_other_pod_to_pod_with_one_cluster_secret(
        example: list[Obj]) -> None:
    """Affinity: each broker listens for forwarded appends on its pod's address, on the
    port the container declares, and proves the one cluster secret, whose placeholder
    is never deployed; without the secret a broker with access control refuses to run."""
    container = container_of(example, "Deployment", "llog-broker")
    env = {e["name"]: e for e in container["env"]}
    settings = _served_settings(example, "llog-broker")
    assert settings.affinity == "forward"
    assert settings.topic_default_compression == "zstd:1"  # new topics compressed
    assert env["LLOG_FORWARD_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    (port,) = [p for p in container["ports"] if p["name"] == "forward"]
    assert port["containerPort"] == settings.forward_port
    ref = env["LLOG_CLUSTER_SECRET"]["valueFrom"]["secretKeyRef"]
    secret = find(example, "Secret", "llog-cluster-secret")
    assert ref["name"] == secret["metadata"]["name"]
    placeholder = _secret_data(example, "llog-cluster-secret")[ref["key"]]
    with pytest.raises(ValidationError, match="cluster_secret"):
        Settings(cluster_secret=placeholder)
    with pytest.raises(ValidationError, match="LLOG_CLUSTER_SECRET"):
        Settings(affinity="forward", auth="on", auth_file=settings.auth_file)


def test_the_broker_image_turns_access_control_on(example: list[Obj]) -> None:
    stages = dockerfile_stages(ROOT / "Dockerfile")
    env = dict(shlex.split(word)[0].split("=", 1)
               for rest in effective(stages, list(stages)[-1], "ENV") for word in rest.split())
    assert env["LLOG_AUTH"] == "on"
    assert env["LLOG_AUTH_FILE"] == str(_served_settings(example, "llog-broker").auth_file)
    # The compose stack is a development one: open on purpose, on loopback only.
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if name.startswith("broker"):
            assert service["environment"]["LLOG_AUTH"] == "off", name
            assert all(str(p).startswith("127.0.0.1:") for p in service["ports"]), name


# -- pods ---------------------------------------------------------------------------------

def test_pods_run_non_root_on_a_read_only_root(example: list[Obj]) -> None:
    namespace = find(example, "Namespace", "llog")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, template in pod_templates(example):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["enableServiceLinks"] is False, f"{name}: Service variables reach LLOG_*"
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts, f"{name}: nowhere to write temporary files"


def test_every_container_has_requests_and_limits(example: list[Obj]) -> None:
    for name, container in containers(example):
        resources_ = container["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources_["requests"][resource])
            assert 0 < request <= quantity(resources_["limits"][resource]), (name, resource)


def test_a_one_worker_broker_keeps_its_tail_cache_in_memory(example: list[Obj]) -> None:
    """One uvicorn worker per pod: no other worker would read a shared directory, and
    writing one costs produce throughput (docs/performance.md), so none is set."""
    settings = settings_of(example)
    template = find(example, "Deployment", "llog-broker")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert "--workers" not in container.get("args", [])
    assert all(e["name"] != "LLOG_TAIL_CACHE_DIR" for e in container["env"])
    memory = quantity(container["resources"]["limits"]["memory"])
    budget = (settings.batch_buffer_max_bytes + settings.read_object_cache_bytes
              + settings.tail_cache_max_bytes)
    assert budget < memory / 2, "buffers and caches leave too little of the memory limit"


def test_brokers_scale_on_cpu_spread_out_and_leave_one_at_a_time(example: list[Obj]) -> None:
    deployment = find(example, "Deployment", "llog-broker")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert "replicas" not in deployment["spec"], "the HorizontalPodAutoscaler owns it"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hpa = find(example, "HorizontalPodAutoscaler", "llog-broker")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone",
                                                   "kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    for workload in ("llog-broker", "llog-compactor"):
        pdb = find(example, "PodDisruptionBudget", workload)
        pod_labels = find(example, "Deployment", workload)["spec"]["template"]["metadata"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels["labels"].items()
        assert pdb["spec"]["maxUnavailable"] == 1


def test_images_are_pinned_to_the_project_version(renders: dict[str, list[Obj]]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for render_name, objs in renders.items():
        for name, container in containers(objs):
            image, _, tag = container["image"].rpartition(":")
            assert tag == version, f"{render_name}/{name}: {container['image']}"
            assert image.rsplit("/", 1)[-1] in ("leaderless-log", JOBS_IMAGE)


# -- the audit CronJob --------------------------------------------------------------------

def _audit_command(container: Obj) -> list[str]:
    """The ``llog spark audit`` arguments of the job's shell script."""
    script = container["args"][0]
    (line,) = [ln for ln in script.splitlines() if ln.strip().startswith("exec llog spark")]
    argv = shlex.split(line)
    assert argv[:4] == ["exec", "llog", "spark", "audit"], line
    return argv[4:]


def test_the_audit_cronjob_runs_the_audit_and_acts_on_its_exit_codes(
        example: list[Obj]) -> None:
    from jobs.spark.audit import build_parser as audit_parser

    cronjob = find(example, "CronJob", "llog-audit")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    job = cronjob["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["restartPolicy"] == "Never"
    assert container["image"].rpartition(":")[0].endswith(JOBS_IMAGE)
    # Exit 1 (findings) fails the Job at once; 2 (could not run) is retried.
    fail_now = [r["onExitCodes"] for r in job["podFailurePolicy"]["rules"]
                if r["action"] == "FailJob" and "onExitCodes" in r]
    assert fail_now == [{"containerName": container["name"], "operator": "In",
                         "values": [EXIT_FINDINGS]}]
    assert job["backoffLimit"] >= 1 and EXIT_FAILED != EXIT_FINDINGS
    argv = _audit_command(container)
    try:
        options = audit_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"llog spark audit refuses {argv}")
    assert str(options.report) == "$report"
    (report_line,) = [ln for ln in container["args"][0].splitlines() if ln.startswith("report=")]
    report_root = "/" + report_line.split('"')[1].strip("/").split("/")[0]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == report_root]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    find(example, "PersistentVolumeClaim", claim)


def test_the_jobs_image_has_spark_and_java_and_runs_as_non_root() -> None:
    stages = dockerfile_stages(ROOT / "deploy/images/jobs.Dockerfile")
    last = list(stages)[-1]
    assert stages[last].base == "python:3.11-slim-bookworm"
    runs = " ".join(effective(stages, last, "RUN"))
    # the broker with its spark extra, and llog-client (which it depends on) from the tree
    assert 'pip install ./clients/python ".[spark]"' in runs and "jre-headless" in runs
    users = effective(stages, last, "USER")
    assert users and users[-1] not in ("root", "0")


def test_a_spark_session_that_cannot_start_is_exit_2_not_findings(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    done = subprocess.run([sys.executable, "-m", "app.cli", "spark", "audit", "--report",
                           str(tmp_path / "report"), "--master", "local[1]"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_FAILED, done.stderr[-2000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == EXIT_FAILED


# -- docker compose -----------------------------------------------------------------------

def _compose_validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("check_jsonschema", reason="check-jsonschema vendors the compose "
                        "specification's schema: pip install -e '.[dev]'")
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def test_the_compose_file_meets_the_compose_specification() -> None:
    validator = _compose_validator()
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}"
              for e in validator.iter_errors(compose)]
    assert errors == []
    compose["services"]["oxia"]["helthcheck"] = compose["services"]["oxia"].pop("healthcheck")
    assert list(validator.iter_errors(compose)), "the schema does not reject unknown keys"
