"""Clients generated from /openapi.json work against a real broker: pydantic models
(datamodel-code-generator), and a client with a method per operation
(openapi-python-client)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
import zstandard
from openapi_spec_validator import validate

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from tests.helpers.auth import Keys
from tests.helpers.stack import Broker, BrokerFactory, make_settings, open_engine

ROOT = Path(__file__).resolve().parents[1]
GENERATED = "llog_api"


def _generate(spec: dict[str, object], tmp_path: Path) -> ModuleType:
    source = tmp_path / "openapi.json"
    source.write_text(json.dumps(spec))
    target = tmp_path / "llog_client_models.py"
    subprocess.run(
        [sys.executable, "-m", "datamodel_code_generator", "--input", str(source),
         "--input-file-type", "openapi", "--output", str(target),
         "--output-model-type", "pydantic_v2.BaseModel", "--formatters", "builtin",
         "--set-default-enum-member"],
        check=True, capture_output=True, text=True, timeout=120,
    )
    spec_obj = importlib.util.spec_from_file_location("llog_client_models", target)
    assert spec_obj is not None and spec_obj.loader is not None
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules["llog_client_models"] = module  # pydantic resolves annotations through it
    try:
        spec_obj.loader.exec_module(module)
    finally:
        del sys.modules["llog_client_models"]
    return module


def test_generated_models_round_trip_through_the_broker(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        request = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["alpha", m.Base64Record(base64="AAE=")])])
        r = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        produced = m.ProduceResults.model_validate(r.json())
        # Results are a union discriminated on ok: success and failure are two classes.
        (written,) = [result.root for result in produced.results]
        assert isinstance(written, m.ProduceSuccess) and written.end_offset == 2

        consume = m.ConsumeRequest(topic_partitions=[m.ConsumeTopicPartition(
            topic=topic, partition=0, fetch_offset=1)], max_wait_ms=0)
        r = http.post("/consume", content=consume.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        consumed = m.ConsumeResults.model_validate(r.json())
        records = consumed.results[0].root.records
        assert [(x.offset, x.value, x.base64) for x in records] == [
            (1, "alpha", None), (2, None, "AAE=")]

        r = http.post("/produce", json={"topic_partitions": []})
        error = m.ErrorResponse.model_validate(r.json())
        assert r.status_code == 400 and error.error_type.value == "InvalidRequest"


def test_generated_models_cover_records_topics_and_offsets(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        created = http.post("/topics", content=m.TopicCreateRequest(
            topic=topic, partitions=4, retention_ms=86_400_000).model_dump_json(
            exclude_none=True), headers={"content-type": "application/json"})
        assert created.status_code == 201, created.text
        assert m.TopicInfo.model_validate(created.json()).partitions == 4

        record = m.RecordObject(value="order created", key="customer-17",
                                headers=[m.TextHeader(name="trace", value="abc")],
                                timestamp_ms=1_700_000_000_000)
        request = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, records=[record], idempotency_key="order-1")])
        r = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        (result,) = [x.root for x in m.ProduceResults.model_validate(r.json()).results]
        again = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                          headers={"content-type": "application/json"})
        (retried,) = [x.root for x in m.ProduceResults.model_validate(again.json()).results]
        assert retried.duplicate and retried.start_offset == result.start_offset

        query = m.OffsetsRequest(topic_partitions=[m.OffsetsTopicPartition(
            topic=topic, partition=result.partition, timestamp_ms=0)])
        r = http.post("/offsets", content=query.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        (found,) = [x.root for x in m.OffsetsResponse.model_validate(r.json()).results]
        assert (found.log_start_offset, found.high_watermark, found.offset) == (1, 1, 1)

        consume = m.ConsumeRequest(topic_partitions=[m.ConsumeTopicPartition(
            topic=topic, partition=result.partition, fetch_offset="earliest")], max_wait_ms=0)
        r = http.post("/consume", content=consume.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        (got,) = m.ConsumeResults.model_validate(r.json()).results[0].root.records
        assert (got.value, got.key, got.timestamp_ms) == ("order created", "customer-17",
                                                          1_700_000_000_000)
        assert got.headers[0].name == "trace" and got.append_time_ms > 0


def test_generated_models_join_a_group_consume_committed_and_commit(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    headers = {"content-type": "application/json"}
    group = f"g-{topic}"
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        produce = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["a", "b", "c"])])
        assert http.post("/produce", content=produce.model_dump_json(exclude_none=True),
                         headers=headers).status_code == 200
        r = http.post(f"/groups/{group}/join", headers=headers, content=m.JoinRequest(
            topics=[topic], client_id="generated").model_dump_json(exclude_none=True))
        assert r.status_code == 200, r.text
        member = m.MemberAssignment.model_validate(r.json())
        assert [(a.topic, a.partitions) for a in member.assignment] == [(topic, [0])]

        def consume() -> list[int]:
            request = m.ConsumeRequest(
                topic_partitions=[m.ConsumeTopicPartition(
                    topic=topic, partition=0, fetch_offset="committed")],
                group=group, max_wait_ms=0)
            r = http.post("/consume", content=request.model_dump_json(exclude_none=True),
                          headers=headers)
            assert r.status_code == 200, r.text
            (result,) = m.ConsumeResults.model_validate(r.json()).results
            assert isinstance(result.root, m.ConsumeSuccess), result
            return [x.offset for x in result.root.records]

        assert consume() == [1, 2, 3]
        commit = m.CommitRequest(member_id=member.member_id, generation=member.generation,
                                 offsets=[m.CommitOffset(topic=topic, partition=0, offset=2)])
        r = http.post(f"/groups/{group}/commit", headers=headers,
                      content=commit.model_dump_json(exclude_none=True))
        assert r.status_code == 200, r.text
        (done,) = m.OffsetResults.model_validate(r.json()).results
        assert isinstance(done.root, m.OffsetSuccess) and done.root.offset == 2
        assert consume() == [3]

        described = m.GroupDescription.model_validate(http.get(f"/groups/{group}").json())
        (state,) = described.partitions
        assert (state.committed_offset, state.high_watermark, state.lag) == (2, 3, 1)
        assert described.members[0].client_id == "generated"
        r = http.post(f"/groups/{group}/heartbeat", headers=headers,
                      content=m.MemberRequest(member_id=member.member_id).model_dump_json())
        assert m.MemberAssignment.model_validate(r.json()).generation == member.generation
        r = http.post(f"/groups/{group}/leave", headers=headers,
                      content=m.MemberRequest(member_id=member.member_id).model_dump_json())
        assert m.LeaveResponse.model_validate(r.json()).left


def _credentials(spec: dict[str, Any], path: str, method: str, token: str) -> dict[str, str]:
    """What a generated client sends for an operation: for each HTTP bearer scheme the
    operation's security requirement names, ``Authorization: Bearer <token>``."""
    headers: dict[str, str] = {}
    schemes = spec.get("components", {}).get("securitySchemes", {})
    for requirement in spec["paths"][path][method].get("security", []):
        for name in requirement:
            if (schemes[name]["type"], schemes[name]["scheme"]) == ("http", "bearer"):
                headers["authorization"] = f"Bearer {token}"
    return headers


def test_a_generated_client_sends_its_token_to_a_broker_with_auth_on(
    brokers: BrokerFactory, tmp_path: Path, topic: str
) -> None:
    keys = Keys()
    token = keys.new("app")
    auth_file = tmp_path / "auth.toml"
    stored = keys.entries["app"]
    auth_file.write_text(f'[principals.app]\nkeys = ["{stored}"]\nproduce = ["{topic}"]\n')
    broker = brokers.start(auth="on", auth_file=str(auth_file))
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        spec = http.get("/openapi.json").json()
        m = _generate(spec, tmp_path)
        body = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["alpha"])]).model_dump_json(exclude_none=True)
        credentials = _credentials(spec, "/produce", "post", token)
        assert credentials, "the document declares no bearer scheme for /produce"
        r = http.post("/produce", content=body,
                      headers={"content-type": "application/json", **credentials})
        assert r.status_code == 200, r.text
        (written,) = m.ProduceResults.model_validate(r.json()).results
        assert isinstance(written.root, m.ProduceSuccess) and written.root.end_offset == 1

        r = http.post("/produce", content=body, headers={"content-type": "application/json"})
        error = m.ErrorResponse.model_validate(r.json())
        assert r.status_code == 401 and error.error_type.value == "Unauthenticated"
        assert r.headers["www-authenticate"] == 'Bearer realm="llog"'


# The one warning the document may give: produce's binary body, which the generator
# leaves out (mapped to application/octet-stream it writes a produce() that does not
# import, because of the two body types), so its produce() sends JSON.
SKIPPED_BINARY_BODY = "Unsupported content type application/vnd.llog.produce"
MODULES = ("client", "models", "types", "api.produce.produce", "api.consume.consume",
           "api.topics.describe_topic", "api.groups.join_group", "api.groups.commit_offsets",
           "api.groups.reset_offsets", "api.groups.leave_group", "api.groups.describe_group")


@contextlib.contextmanager
def generated_client(url: str, where: Path, package: str) -> Iterator[SimpleNamespace]:
    """The client openapi-python-client generates from the broker's /openapi.json (any
    warning but the binary body's fails), imported as ``package``; its modules are
    forgotten again afterwards. No formatting pass: nothing to run it with."""
    document = httpx.get(f"{url}/openapi.json", timeout=30).text
    validate(json.loads(document))  # the document as served is valid OpenAPI
    source = where / "openapi.json"
    source.write_text(document)
    config = where / "generator.yaml"
    config.write_text("post_hooks: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(source),
         "--meta", "none", "--output-path", str(where / package), "--config",
         str(config)], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert output.count("WARNING") == output.count(SKIPPED_BINARY_BODY) <= 1, output
    sys.path.insert(0, str(where))
    try:
        yield SimpleNamespace(**{name.rsplit(".", 1)[-1]: importlib.import_module(
            f"{package}.{name}") for name in MODULES})
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def generated(broker: Broker, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[SimpleNamespace]:
    with generated_client(broker.url, tmp_path_factory.mktemp("generated"),
                          GENERATED) as client:
        yield client


async def test_a_generated_client_produces_consumes_and_reads_typed_errors(
    stack: LocalStack, broker: Broker, generated: SimpleNamespace, topic: str
) -> None:
    g = generated
    async with open_engine(make_settings(stack)) as operator:
        await operator.writer.fence(TopicPartition(topic, 1))
    with anyio.fail_after(60):
        async with g.client.Client(base_url=broker.url, timeout=httpx.Timeout(30)) as client:
            await _produce_and_consume(g, client, topic)
            await _refusals(g, client, topic)


class _Compressing(httpx.AsyncHTTPTransport):
    """What a caller of the generated client adds to send compressed bodies (httpx
    compresses no request body): the operation's ``content_encoding`` parameter names
    the coding, this compresses the body to match. Notes each answer's coding."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("content-encoding") == "zstd":
            body = zstandard.ZstdCompressor().compress(await request.aread())
            request = httpx.Request(request.method, request.url, content=body, headers=[
                (k, v) for k, v in request.headers.raw if k.lower() != b"content-length"])
        response = await super().handle_async_request(request)
        self.answers.append(response.headers.get("content-encoding"))
        return response


async def test_a_generated_client_sends_a_compressed_body_and_reads_a_compressed_answer(
    broker: Broker, generated: SimpleNamespace, topic: str
) -> None:
    g, m = generated, generated.models
    values = [f'{{"event":"click","user":"u{i % 7}","page":"/items/{i}"}}' for i in range(200)]
    transport = _Compressing()
    with anyio.fail_after(60):
        async with g.client.Client(base_url=broker.url, timeout=httpx.Timeout(30),
                                   httpx_args={"transport": transport}) as client:
            answer = await g.produce.asyncio_detailed(
                client=client, content_encoding=m.ProduceContentEncoding.ZSTD,
                body=m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
                    topic=topic, partition=0, records=values)]))
            assert answer.status_code == 200, answer.content
            # httpx asks for compressed answers by default (gzip, deflate, zstd).
            read = await g.consume.asyncio_detailed(client=client, body=m.ConsumeRequest(
                topic_partitions=[m.ConsumeTopicPartition(topic=topic, partition=0,
                                                          fetch_offset=1)], max_wait_ms=0))
    assert read.headers["content-encoding"] == "zstd"
    assert transport.answers == [None, "zstd"]  # the produce answer is under 1 KiB
    (partition,) = read.parsed.results
    assert [r.value for r in partition.records] == values


async def _produce_and_consume(g: SimpleNamespace, client: Any, topic: str) -> None:
    m = g.models
    body = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
        topic=topic, partition=0, records=["alpha", m.Base64Record(base64="AAE=")])])
    answer = await g.produce.asyncio_detailed(client=client, body=body)
    assert answer.status_code == 200, answer.content
    (written,) = answer.parsed.results
    assert isinstance(written, m.ProduceSuccess)
    assert (written.start_offset, written.end_offset, written.duplicate) == (
        1, 2, g.types.UNSET)

    read = await g.consume.asyncio(client=client, body=m.ConsumeRequest(
        topic_partitions=[m.ConsumeTopicPartition(topic=topic, partition=0,
                                                  fetch_offset=1)], max_wait_ms=0))
    assert isinstance(read, m.ConsumeResults)
    (partition,) = read.results
    assert isinstance(partition, m.ConsumeSuccess) and partition.high_watermark == 2
    assert [(r.offset, r.value, r.base64) for r in partition.records] == [
        (1, "alpha", g.types.UNSET), (2, g.types.UNSET, "AAE=")]


async def _refusals(g: SimpleNamespace, client: Any, topic: str) -> None:
    """A failed entry beside a written one, a partition out of range, a refused request,
    an unknown topic: each as its own class, its error_type a member of the enum."""
    m = g.models
    partly = await g.produce.asyncio_detailed(client=client, body=m.ProduceRequest(
        topic_partitions=[m.ProduceTopicPartition(topic=topic, partition=p, records=["x"])
                          for p in (0, 1)]))
    assert partly.status_code == 409, partly.content
    written, fenced = partly.parsed.results
    assert isinstance(written, m.ProduceSuccess) and written.start_offset == 3
    assert isinstance(fenced, m.ProduceFailure)
    assert fenced.error_type is m.ErrorType.PARTITION_FENCED
    assert (fenced.retriable, fenced.maybe_written) == (False, False)

    beyond = await g.consume.asyncio(client=client, body=m.ConsumeRequest(
        topic_partitions=[m.ConsumeTopicPartition(topic=topic, partition=0,
                                                  fetch_offset=9)], max_wait_ms=0))
    (refused,) = beyond.results
    assert isinstance(refused, m.ConsumeFailure)
    assert refused.error_type is m.ErrorType.OFFSET_OUT_OF_RANGE
    assert (refused.retriable, refused.high_watermark) == (False, 3)

    invalid = await g.produce.asyncio_detailed(client=client, body=m.ProduceRequest(
        topic_partitions=[]))
    assert invalid.status_code == 400 and isinstance(invalid.parsed, m.ErrorResponse)
    assert invalid.parsed.error_type is m.ErrorType.INVALID_REQUEST
    assert invalid.parsed.details[0].loc == "topic_partitions"

    missing = await g.describe_topic.asyncio_detailed(f"{topic}-absent", client=client)
    assert missing.status_code == 404 and isinstance(missing.parsed, m.ErrorResponse)
    assert missing.parsed.error_type is m.ErrorType.UNKNOWN_TOPIC


async def test_a_generated_client_produces_record_objects(
    broker: Broker, generated: SimpleNamespace, topic: str
) -> None:
    """A record object with a key, a text and a base64 header and a timestamp, beside a
    plain string; results told apart by ``outcome`` (``ok`` beside it)."""
    g, m = generated, generated.models
    record = m.RecordObject(
        value="order created", key=m.Base64Record(base64="AAE="), timestamp_ms=1_700_000_000_000,
        headers=[m.TextHeader(name="trace-id", value="4bf92f35"),
                 m.Base64Header(name="bin", base64="AAI=")])
    with anyio.fail_after(60):
        async with g.client.Client(base_url=broker.url, timeout=httpx.Timeout(30)) as client:
            answer = await g.produce.asyncio_detailed(client=client, body=m.ProduceRequest(
                topic_partitions=[m.ProduceTopicPartition(topic=topic, partition=0,
                                                          records=["alpha", record])]))
            assert answer.status_code == 200, answer.content
            (written,) = answer.parsed.results
            assert isinstance(written, m.ProduceSuccess) and written.ok is True
            assert written.outcome == "success" and written.end_offset == 2
            read = await g.consume.asyncio(client=client, body=m.ConsumeRequest(
                topic_partitions=[m.ConsumeTopicPartition(topic=topic, partition=0,
                                                          fetch_offset=1)], max_wait_ms=0))
    (partition,) = read.results
    assert isinstance(partition, m.ConsumeSuccess) and partition.outcome == "success"
    plain, full = partition.records
    assert plain.value == "alpha"
    assert (full.value, full.key_base64, full.timestamp_ms) == (
        "order created", "AAE=", 1_700_000_000_000)
    assert [(h.name, h.value, h.base64) for h in full.headers] == [
        ("trace-id", "4bf92f35", g.types.UNSET), ("bin", g.types.UNSET, "AAI=")]


async def test_a_generated_client_uses_a_consumer_group(
    broker: Broker, generated: SimpleNamespace, topic: str
) -> None:
    """Join, commit, a reset refused while the member is live, leave, a reset of the
    whole topic to the earliest and of a partition to an offset, describe: each reset
    entry one of the typed shapes (``ResetToPosition``, ``ResetToOffset``), its topic
    sent with it."""
    g, m = generated, generated.models
    group = f"g-{topic}"
    with anyio.fail_after(60):
        async with g.client.Client(base_url=broker.url, timeout=httpx.Timeout(30)) as client:
            written = await g.produce.asyncio(client=client, body=m.ProduceRequest(
                topic_partitions=[m.ProduceTopicPartition(topic=topic, partition=0,
                                                          records=["a", "b", "c"])]))
            assert isinstance(written, m.ProduceResults), written
            member = await g.join_group.asyncio(group, client=client, body=m.JoinRequest(
                topics=[topic], client_id="generated"))
            assert isinstance(member, m.MemberAssignment), member
            assert [(a.topic, a.partitions) for a in member.assignment] == [(topic, [0])]
            committed = await g.commit_offsets.asyncio(group, client=client, body=m.CommitRequest(
                member_id=member.member_id, generation=member.generation,
                offsets=[m.CommitOffset(topic=topic, partition=0, offset=2)]))
            assert isinstance(committed, m.OffsetResults), committed
            assert [(r.outcome, r.offset) for r in committed.results] == [("success", 2)]

            async def reset(*entries: Any) -> Any:
                return await g.reset_offsets.asyncio_detailed(
                    group, client=client, body=m.ResetRequest(topic_partitions=list(entries)))

            earliest = m.ResetToPosition(topic=topic, to=m.ResetToPositionTo.EARLIEST)
            live = await reset(earliest)
            assert live.status_code == 409, live.content
            assert isinstance(live.parsed, m.ErrorResponse)
            assert live.parsed.error_type is m.ErrorType.GROUP_NOT_EMPTY
            left = await g.leave_group.asyncio(group, client=client, body=m.MemberRequest(
                member_id=member.member_id))
            assert isinstance(left, m.LeaveResponse) and left.left is True
            answers = [await reset(earliest),
                       await reset(m.ResetToOffset(topic=topic, partition=0, offset=2))]
            described = await g.describe_group.asyncio(group, client=client)
    seen = []
    for answer in answers:
        assert answer.status_code == 200, answer.content
        seen.append([(r.outcome, r.partition, r.offset) for r in answer.parsed.results])
    # earliest: the log starts at 1, so the group has processed nothing (offset 0).
    assert seen == [[("success", 0, 0)], [("success", 0, 2)]]
    assert isinstance(described, m.GroupDescription) and described.members == []
    assert [(p.topic, p.partition, p.committed_offset, p.high_watermark, p.lag)
            for p in described.partitions] == [(topic, 0, 2, 3, 1)]


def test_the_generated_client_snippet_in_the_docs_runs(
    broker: Broker, generated: SimpleNamespace, topic: str,
    capsys: pytest.CaptureFixture[str]
) -> None:
    docs = (ROOT / "docs" / "http-api.md").read_text().split("## Generated clients", 1)[1]
    snippet = docs.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("http://127.0.0.1:8080", broker.url).replace(
        '"orders"', repr(topic))
    exec(compile(snippet, "docs/http-api.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["written 1 2", "1 alpha", "2 AAE="]


def test_a_generated_client_sends_its_token_and_reads_the_refusals(
    brokers: BrokerFactory, tmp_path: Path, topic: str
) -> None:
    keys = Keys()
    writer, reader = keys.new("writer"), keys.new("reader")
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(
        f'[principals.writer]\nkeys = ["{keys.entries["writer"]}"]\n'
        f'produce = ["{topic}"]\nconsume = ["{topic}"]\n'
        f'[principals.reader]\nkeys = ["{keys.entries["reader"]}"]\nconsume = ["{topic}"]\n')
    broker = brokers.start(auth="on", auth_file=str(auth_file))
    with generated_client(broker.url, tmp_path, f"{GENERATED}_auth") as g:
        m = g.models
        body = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["alpha"])])
        timeout = httpx.Timeout(30)
        with g.client.AuthenticatedClient(base_url=broker.url, token=writer,
                                          timeout=timeout) as client:
            answer = g.produce.sync_detailed(client=client, body=body)
            assert answer.status_code == 200, answer.content
            assert [r.end_offset for r in answer.parsed.results] == [1]
        with g.client.AuthenticatedClient(base_url=broker.url, token=reader,
                                          timeout=timeout) as client:
            forbidden = g.produce.sync_detailed(client=client, body=body)
            assert forbidden.status_code == 403
            assert forbidden.parsed.error_type is m.ErrorType.FORBIDDEN
            assert "insufficient_scope" in forbidden.headers["www-authenticate"]
        with g.client.Client(base_url=broker.url, timeout=timeout) as client:
            anonymous = g.produce.sync_detailed(client=client, body=body)
            assert anonymous.status_code == 401
            assert anonymous.parsed.error_type is m.ErrorType.UNAUTHENTICATED
            assert anonymous.headers["www-authenticate"] == 'Bearer realm="llog"'
