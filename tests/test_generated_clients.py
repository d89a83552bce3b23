"""Clients generated from the broker's own ``/openapi.json`` with each generator's
default options work against a real broker with access control on: openapi-generator's
``python`` and ``typescript-fetch`` (compiled with tsc, run on Node), and oapi-codegen
(Go). (openapi-python-client: tests/test_openapi_client.py.)

Each produces JSON (a plain string, base64 bytes and a record object with a key,
headers and a timestamp), consumes it back, reads a failed entry as its failure type
with its error type, reads a refused request (unknown topic; no token) as the typed
error body, and sends its bearer token. Each then uses a consumer group: joins it,
commits an offset, is refused a reset while its member is live, leaves, resets the
group's offsets to the earliest and to an offset, and describes it. Each client is
generated once per module; the
generators, pinned, are fetched on first use (tests/helpers/generators.py), and a
missing one fails the test.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from app.localstack.stack import LocalStack
from tests.helpers import generators
from tests.helpers.auth import Keys
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN_TIMEOUT_S = 300
TOPIC_PREFIX = "gen-"


@pytest.fixture(scope="module")
def secured(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Broker, str]]:
    """A broker with access control on, and a token that may produce to, consume from
    and describe the ``gen-*`` topics and use the ``gen-*`` groups."""
    keys = Keys()
    token = keys.new("app")
    where = tmp_path_factory.mktemp("secured")
    auth_file = where / "auth.toml"
    rights = f'["{TOPIC_PREFIX}*"]'
    auth_file.write_text(f'[principals.app]\nkeys = ["{keys.entries["app"]}"]\n'
                         f"produce = {rights}\nconsume = {rights}\nadmin = {rights}\n"
                         f"group = {rights}\n")
    factory = BrokerFactory(stack, where)
    yield factory.start(auth="on", auth_file=str(auth_file)), token
    factory.stop_all()


@pytest.fixture(scope="module")
def document(secured: tuple[Broker, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broker's own document, as it serves it."""
    text = httpx.get(f"{secured[0].url}/openapi.json", timeout=30).text
    validate(json.loads(text))
    path = tmp_path_factory.mktemp("document") / "openapi.json"
    path.write_text(text)
    return path


@pytest.fixture
def gen_topic(topic: str) -> str:
    return TOPIC_PREFIX + topic


def _present(value: Any) -> Any:
    """``value`` without its null or absent members (languages print absence alike)."""
    if isinstance(value, dict):
        return {k: _present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_present(v) for v in value]
    return value


def _check(seen: dict[str, Any], topic: str) -> None:
    """What every generated client must have seen (the programs print these fields)."""
    seen = _present(seen)
    assert seen["produced"] == [{"outcome": "success", "ok": True, "start": 1, "end": 3}]
    ((read,),) = [seen["consumed"]]
    assert read["outcome"] == "success"
    assert read["records"] == [
        {"offset": 1, "value": "alpha"},
        {"offset": 2, "base64": "AAE="},
        {"offset": 3, "value": "order created", "key": "customer-17",
         "headers": [["trace-id", "4bf92f35"]], "timestamp_ms": 1_700_000_000_000}]
    assert seen["out_of_range"] == [{"outcome": "failure", "ok": False,
                                     "error_type": "OffsetOutOfRange", "high_watermark": 3}]
    assert seen["unknown_topic"] == [404, "UnknownTopic"]
    assert seen["anonymous"] == [401, "Unauthenticated"]
    # The group (named as the topic) and its partition 0, which holds offsets 1..3.
    assert seen["group"] == {
        "joined": [[topic, [0]]],
        "committed": [["success", 2]],
        "reset_while_live": [409, "GroupNotEmpty"],
        "left": True,
        # earliest: the log starts at 1, so the group has processed nothing (0).
        "reset_earliest": [["success", 0, 0]],
        "reset_offset": [["success", 0, 2]],
        "described": {"members": 0, "partitions": [[topic, 0, 2, 3, 1]]}}


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, (
        f"`{' '.join(argv)}` exited with {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done.stdout


def _program_env(broker: Broker, token: str, topic: str) -> dict[str, str]:
    return {**os.environ, "LLOG_URL": broker.url, "LLOG_TOKEN": token, "LLOG_TOPIC": topic}


# -- openapi-generator: python ----------------------------------------------------------

@contextlib.contextmanager
def _imported(where: Path, package: str) -> Iterator[Any]:
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(package)
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def python_client(document: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    where = tmp_path_factory.mktemp("openapi-generator-python")
    generators.openapi_generator("python", document, where)
    with _imported(where, "openapi_client") as package:
        yield package


def _python_program(c: Any, url: str, token: str, topic: str) -> dict[str, Any]:
    """What main.ts and main.go do, through openapi-generator's Python client."""
    out: dict[str, Any] = {}
    with c.ApiClient(c.Configuration(host=url, access_token=token)) as api:
        record = c.RecordObject(
            value=c.RecordBytes("order created"), key=c.RecordBytes("customer-17"),
            headers=[c.Header(c.TextHeader(name="trace-id", value="4bf92f35"))],
            timestamp_ms=1_700_000_000_000)
        written = c.ProduceApi(api).produce(c.ProduceRequest(topic_partitions=[
            c.ProduceTopicPartition(topic=topic, partition=0, records=[
                c.ProduceRecord("alpha"), c.ProduceRecord(c.Base64Record(base64="AAE=")),
                c.ProduceRecord(record)])]))
        out["produced"] = []
        for result in written.results:
            r = result.actual_instance
            assert isinstance(r, c.ProduceSuccess), r
            out["produced"].append({"outcome": r.outcome, "ok": r.ok,
                                    "start": r.start_offset, "end": r.end_offset})

        def read(offset: int) -> list[dict[str, Any]]:
            answer = c.ConsumeApi(api).consume(c.ConsumeRequest(
                topic_partitions=[c.ConsumeTopicPartition(
                    topic=topic, partition=0, fetch_offset=c.FetchOffset(offset))],
                max_wait_ms=0))
            seen: list[dict[str, Any]] = []
            for result in answer.results:
                r = result.actual_instance
                if isinstance(r, c.ConsumeSuccess):
                    seen.append({"outcome": r.outcome, "records": [
                        # var_base64: the generator renames a field named like a module.
                        {"offset": x.offset, "value": x.value, "base64": x.var_base64,
                         "key": x.key, "timestamp_ms": x.timestamp_ms,
                         "headers": x.headers and [[h.name, h.value] for h in x.headers]}
                        for x in r.records]})
                else:
                    assert isinstance(r, c.ConsumeFailure), r
                    assert isinstance(r.error_type, c.ErrorType)
                    seen.append({"outcome": r.outcome, "ok": r.ok,
                                 "error_type": r.error_type.value,
                                 "high_watermark": r.high_watermark})
            return seen

        out["consumed"], out["out_of_range"] = read(1), read(99)
        with pytest.raises(c.exceptions.NotFoundException) as missing:
            c.TopicsApi(api).describe_topic(f"{topic}-absent")
        assert isinstance(missing.value.data, c.ErrorResponse)
        out["unknown_topic"] = [missing.value.status, missing.value.data.error_type.value]
        out["group"] = _python_group(c, api, topic)
    with c.ApiClient(c.Configuration(host=url)) as api:
        with pytest.raises(c.exceptions.UnauthorizedException) as refused:
            c.ProduceApi(api).produce(c.ProduceRequest(topic_partitions=[
                c.ProduceTopicPartition(topic=topic, partition=0,
                                        records=[c.ProduceRecord("x")])]))
        out["anonymous"] = [refused.value.status, refused.value.data.error_type.value]
    return out


def _python_group(c: Any, api: Any, topic: str) -> dict[str, Any]:
    """Join, commit, a refused reset, leave, two resets and a describe of the group
    named as the topic."""
    groups, out = c.GroupsApi(api), {}
    member = groups.join_group(topic, c.JoinRequest(topics=[topic], client_id="generated"))
    out["joined"] = [[a.topic, a.partitions] for a in member.assignment]
    committed = groups.commit_offsets(topic, c.CommitRequest(
        member_id=member.member_id, generation=member.generation,
        offsets=[c.CommitOffset(topic=topic, partition=0, offset=2)]))
    out["committed"] = [[r.actual_instance.outcome, r.actual_instance.offset]
                        for r in committed.results]

    def reset(*entries: Any) -> list[list[Any]]:
        answer = groups.reset_offsets(topic, c.ResetRequest(
            topic_partitions=[c.ResetEntry(e) for e in entries]))
        return [[r.actual_instance.outcome, r.actual_instance.partition,
                 r.actual_instance.offset] for r in answer.results]

    earliest = c.ResetToPosition(topic=topic, to="earliest")
    with pytest.raises(c.exceptions.ConflictException) as live:
        reset(earliest)
    error = live.value.data.actual_instance
    assert isinstance(error, c.ErrorResponse), error
    out["reset_while_live"] = [live.value.status, error.error_type.value]
    out["left"] = groups.leave_group(topic, c.MemberRequest(member_id=member.member_id)).left
    out["reset_earliest"] = reset(earliest)
    out["reset_offset"] = reset(c.ResetToOffset(topic=topic, partition=0, offset=2))
    described = groups.describe_group(topic)
    out["described"] = {"members": len(described.members), "partitions": [
        [p.topic, p.partition, p.committed_offset, p.high_watermark, p.lag]
        for p in described.partitions]}
    return out


def test_openapi_generator_python_client(
    secured: tuple[Broker, str], python_client: Any, gen_topic: str
) -> None:
    broker, token = secured
    _check(_python_program(python_client, broker.url, token, gen_topic), gen_topic)


# -- openapi-generator: typescript-fetch ------------------------------------------------

@pytest.fixture(scope="module")
def typescript_program(document: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """main.ts and the generated client, compiled: the JavaScript to run."""
    where = tmp_path_factory.mktemp("openapi-generator-typescript")
    for name in ("main.ts", "tsconfig.json"):
        shutil.copyfile(generators.TYPESCRIPT / name, where / name)
    generators.openapi_generator("typescript-fetch", document, where / "generated")
    node = generators.need("node", "the generated TypeScript client runs on Node.js 18+")
    _run([node, str(generators.typescript_compiler()), "-p", str(where)], where)
    return where / "dist" / "main.js"


def test_openapi_generator_typescript_client(
    secured: tuple[Broker, str], typescript_program: Path, gen_topic: str
) -> None:
    broker, token = secured
    node = generators.need("node", "the generated TypeScript client runs on Node.js 18+")
    out = _run([node, str(typescript_program)], typescript_program.parent,
               _program_env(broker, token, gen_topic))
    _check(json.loads(out), gen_topic)


# -- oapi-codegen (Go) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def go_program(document: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """main.go and the generated client in a module of their own (its go.mod pins the
    generated code's dependencies), built."""
    where = tmp_path_factory.mktemp("oapi-codegen")
    for name in ("main.go", "go.mod", "go.sum"):
        shutil.copyfile(generators.GO / name, where / name)
    _run([str(generators.oapi_codegen()), "-package", "main", "-o",
          str(where / "llog.gen.go"), str(document)], where)
    go = generators.need("go", "the generated Go client is built with Go 1.26+")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    _run([go, "build", "-o", str(where / "check"), "."], where, env)
    return where / "check"


def test_oapi_codegen_go_client(
    secured: tuple[Broker, str], go_program: Path, gen_topic: str
) -> None:
    broker, token = secured
    out = _run([str(go_program)], go_program.parent, _program_env(broker, token, gen_topic))
    _check(json.loads(out), gen_topic)
