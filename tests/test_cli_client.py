"""``llog produce|consume|tail|topics`` as a person runs them: subprocesses against a
real broker; and the parts a subprocess cannot show (a terminal's progress line)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.localstack.stack import LocalStack
from llog_client._cli import Progress, read_lines
from tests.helpers.stack import Broker, BrokerFactory

ROOT = Path(__file__).resolve().parents[1]
LLOG = [sys.executable, "-m", "app.cli"]


@pytest.fixture(scope="module")
def default_broker(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Broker]:
    """A broker with the default limits, which the CLI's requests are cut to fit. Its
    topic cache lives half a second, so a delete settles in 1.5 s, not 6."""
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("cli-broker"))
    yield factory.start(topic_cache_ttl_s="0.5")
    factory.stop_all()


def llog(broker: Broker | None, *args: str, stdin: bytes = b"", timeout: float = 60
         ) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "LLOG_BROKER_URL": broker.url if broker else "http://127.0.0.1:9"}
    return subprocess.run([*LLOG, *args], input=stdin, capture_output=True, timeout=timeout,
                          cwd=ROOT, env=env, check=False)


def ok(result: subprocess.CompletedProcess[bytes]) -> bytes:
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""  # quiet when stderr is not a terminal
    return result.stdout


def test_produce_lines_from_stdin_and_consume_them_back(default_broker: Broker,
                                                        topic: str) -> None:
    lines = [f"line {i}" for i in range(20_000)]
    stdin = ("\n".join(lines) + "\n").encode()
    printed = ok(llog(default_broker, "produce", topic, "--print-offsets", stdin=stdin))
    batches = [json.loads(line) for line in printed.splitlines()]
    assert sum(b["count"] for b in batches) == 20_000
    assert batches[0]["start_offset"] == 1 and batches[-1]["end_offset"] == 20_000
    assert not any(b["duplicate"] for b in batches)
    out = ok(llog(default_broker, "consume", topic))
    assert out.decode().splitlines() == lines
    some = ok(llog(default_broker, "consume", topic, "--from", "19999", "--count", "5"))
    assert some == b"line 19998\nline 19999\n"
    # A reader that leaves early (| head) ends the consumer quietly.
    env = {**os.environ, "LLOG_BROKER_URL": default_broker.url}
    with subprocess.Popen([*LLOG, "consume", topic], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as head:
        assert head.stdout is not None and head.stderr is not None
        assert head.stdout.readline() == b"line 0\n"
        head.stdout.close()
        assert head.wait(timeout=60) == 0
        assert head.stderr.read() == b""


def test_keys_headers_and_json_lines(default_broker: Broker, topic: str, tmp_path: Path
                                     ) -> None:
    ok(llog(default_broker, "produce", topic, "--partition", "1", "--key", "k-1",
            "--header", "trace=abc", "--header", "trace=def", "--timestamp-ms", "1700000000000",
            "first", "second"))
    source = tmp_path / "values.txt"
    source.write_bytes(b"from a file\n\xff\xfe\n")
    ok(llog(default_broker, "produce", topic, "--partition", "1", "--file", str(source)))
    out = ok(llog(default_broker, "consume", topic, "--partition", "1", "--format", "json"))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["value"] == "first" and rows[0]["key"] == "k-1"
    assert rows[0]["headers"] == [{"name": "trace", "value": "abc"},
                                  {"name": "trace", "value": "def"}]
    assert rows[0]["timestamp_ms"] == 1_700_000_000_000 and rows[0]["append_time_ms"] > 0
    assert rows[2] == {**rows[2], "value": "from a file", "key": None, "headers": [],
                       "timestamp_ms": None}
    assert rows[3]["base64"] == "//4=" and "value" not in rows[3]


def test_tail_follows_until_count(default_broker: Broker, topic: str) -> None:
    ok(llog(default_broker, "produce", topic, *[f"old-{i}" for i in range(15)]))
    last = ok(llog(default_broker, "tail", "-n", "3", topic))
    assert last == b"old-12\nold-13\nold-14\n"
    env = {**os.environ, "LLOG_BROKER_URL": default_broker.url}
    with subprocess.Popen([*LLOG, "tail", "-f", "-n", "1", "--count", "3", topic], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tail:
        assert tail.stdout is not None
        # The first line proves the tail is running (and positioned) before new records.
        assert tail.stdout.readline() == b"old-14\n"
        ok(llog(default_broker, "produce", topic, "new-1", "new-2"))
        out, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err.decode()
    assert out == b"new-1\nnew-2\n" and err == b""


def test_topics_commands(default_broker: Broker, topic: str) -> None:
    created = json.loads(ok(llog(default_broker, "topics", "create", topic, "--partitions", "3",
                                 "--retention-ms", "60000", "--format", "json")))
    assert (created["partitions"], created["retention_ms"]) == (3, 60000)
    listed = ok(llog(default_broker, "topics", "list")).decode()
    assert listed.splitlines()[0].split()[:2] == ["TOPIC", "PARTITIONS"]
    assert any(line.split()[:2] == [topic, "3"] for line in listed.splitlines())
    updated = json.loads(ok(llog(default_broker, "topics", "update", topic, "--partitions", "4",
                                 "--retention-ms", "none", "--format", "json")))
    assert (updated["partitions"], updated["retention_ms"]) == (4, None)
    described = json.loads(ok(llog(default_broker, "topics", "describe", topic,
                                   "--format", "json")))
    assert [p["partition"] for p in described["partition_states"]] == [0, 1, 2, 3]
    ok(llog(default_broker, "topics", "delete", topic))
    missing = llog(default_broker, "topics", "describe", topic)
    assert missing.returncode == 1 and b"UnknownTopic" in missing.stderr


def test_topics_compression_option(default_broker: Broker, topic: str) -> None:
    created = json.loads(ok(llog(default_broker, "topics", "create", topic, "--compression",
                                 "zstd:5", "--format", "json")))
    assert (created["compression"], created["compression_level"]) == ("zstd", 5)
    listed = ok(llog(default_broker, "topics", "list")).decode().splitlines()
    assert "COMPRESSION" in listed[0].split()
    updated = json.loads(ok(llog(default_broker, "topics", "update", topic, "--compression",
                                 "none", "--format", "json")))
    assert (updated["compression"], updated["compression_level"]) == ("none", None)
    bad = llog(default_broker, "topics", "update", topic, "--compression", "lz4")
    assert bad.returncode == 1 and b"InvalidRequest" in bad.stderr
    assert llog(default_broker, "topics", "create", topic, "--compression", "zstd:x"
                ).returncode == 2


def test_failures_say_what_failed(default_broker: Broker, topic: str) -> None:
    bad = llog(default_broker, "produce", "not a topic", "x")
    assert bad.returncode == 1 and bad.stderr.startswith(b"llog produce: InvalidRequest")
    beyond = llog(default_broker, "consume", topic, "--partition", "0", "--from", "9")
    assert beyond.returncode == 1 and b"OffsetOutOfRange" in beyond.stderr
    unknown = llog(default_broker, "consume", topic)  # every partition: of no topic
    assert unknown.returncode == 1 and b"UnknownTopic" in unknown.stderr
    nobody = llog(None, "topics", "list", "--timeout", "2", "--retries", "0")
    assert nobody.returncode == 1 and b"TransportError" in nobody.stderr
    nobody = llog(None, "produce", "t", "v", "--timeout", "2", "--retries", "0")
    assert nobody.returncode == 1 and b"TransportError" in nobody.stderr
    assert b"0 records were acknowledged" in nobody.stderr


def test_help_shows_real_names_and_defaults() -> None:
    for command, expected in ((["consume"], b"(default: earliest)"),
                              (["tail"], b"(default: 10)"),
                              (["produce"], b"(default: 30.0)"),
                              (["topics", "create"], b"(default: 1)"),
                              (["serve"], b"(default: 1)")):
        shown = ok(llog(None, *command, "--help"))
        assert shown.startswith(b"usage: llog " + " ".join(command).encode()), shown
        assert expected in b" ".join(shown.split()), shown
    assert ok(llog(None, "--version")).startswith(b"llog ")


@pytest.mark.slow  # starts a JVM
def test_spark_help_names_llog() -> None:
    shown = ok(llog(None, "spark", "audit", "--help"))
    assert shown.startswith(b"usage: llog spark audit")


def test_usage_errors_exit_2() -> None:
    assert llog(None, "consume", "t", "--from", "soon").returncode == 2
    assert llog(None, "produce", "t", "--header", "novalue").returncode == 2


def test_progress_is_drawn_on_a_terminal_only_for_long_transfers() -> None:
    now = [0.0]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = Progress(screen, "llog consume", clock=lambda: now[0], interval_s=0.5)
    progress.add(100, 1024 * 1024)
    assert screen.getvalue() == ""  # too soon
    now[0] = 2.0
    progress.add(100, 1024 * 1024)
    progress.finish()
    drawn = screen.getvalue()
    assert "200 records, 2.0 MiB, 100 records/s, 1.00 MiB/s" in drawn and drawn.endswith("\n")

    piped = io.StringIO()  # not a terminal
    quiet = Progress(piped, "llog consume", clock=lambda: now[0])
    now[0] = 10.0
    quiet.add(5, 5)
    quiet.finish()
    assert piped.getvalue() == ""


def test_lines_are_read_in_batches_with_a_last_line_without_newline() -> None:
    read, write = os.pipe()
    os.write(write, b"a\nb\n\nlast")
    os.close(write)
    with os.fdopen(read, "rb") as source:
        batches = list(read_lines(source.fileno(), limit=3))
    assert [line for batch in batches for line in batch] == [b"a", b"b", b"", b"last"]


# -- every partition, templates and groups (kcat's manner) ------------------------------


def _keyed_topic(broker: Broker, topic: str) -> list[tuple[int, int, str]]:
    """A topic of 3 partitions with keyed records on each, appended one request at a
    time: the (partition, offset, value) of each, in the order produced."""
    from llog_client import LlogClient, Record

    produced: list[tuple[int, int, str]] = []
    with LlogClient(broker.url) as client:
        client.create_topic(topic, 3)
        for i in range(12):
            value = f"v{i}"
            result = client.produce(topic, Record(value, key=f"customer-{i}"))
            (partition, offset), = result.offsets()
            produced.append((partition, offset, value))
    assert {p for p, _, _ in produced} == {0, 1, 2}  # the keys spread over every partition
    return produced


def _json_rows(out: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def _in_time_order(rows: list[dict[str, object]]) -> bool:
    keys = [(r["append_time_ms"], r["partition"], r["offset"]) for r in rows]
    return keys == sorted(keys)


def test_consume_and_tail_read_every_partition_by_append_time(default_broker: Broker,
                                                               topic: str) -> None:
    produced = _keyed_topic(default_broker, topic)
    rows = _json_rows(ok(llog(default_broker, "consume", topic, "--format", "json")))
    assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == sorted(produced)
    assert _in_time_order(rows)
    values = ok(llog(default_broker, "consume", topic)).decode().splitlines()
    assert values == [r["value"] for r in rows]
    # tail, which printed nothing on a keyed topic: the last records of all partitions.
    assert ok(llog(default_broker, "tail", "-n", "4", topic)).decode().splitlines() == \
        values[-4:]
    # --count is the total; --from an offset applies to each partition.
    assert ok(llog(default_broker, "consume", topic, "--count", "5")).decode().splitlines() \
        == values[:5]
    later = _json_rows(ok(llog(default_broker, "consume", topic, "--from", "3",
                               "--format", "json")))
    assert sorted((r["partition"], r["offset"]) for r in later) == sorted(
        (p, o) for p, o, _ in produced if o >= 3)


def test_partition_filter(default_broker: Broker, topic: str) -> None:
    produced = _keyed_topic(default_broker, topic)
    for args in (["--partition", "1,2"], ["--partition", "2", "--partition", "1"]):
        rows = _json_rows(ok(llog(default_broker, "consume", topic, *args, "--format", "json")))
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
            (p, o) for p, o, _ in produced if p in (1, 2))
        assert _in_time_order(rows)
    last = _json_rows(ok(llog(default_broker, "tail", topic, "--partition", "2", "-n", "1",
                              "--format", "json")))
    assert [(r["partition"], r["offset"]) for r in last] == [
        max((p, o) for p, o, _ in produced if p == 2)]
    assert llog(default_broker, "consume", topic, "--partition", "one").returncode == 2


def test_follow_sees_new_records_on_any_partition(default_broker: Broker, topic: str
                                                  ) -> None:
    produced = _keyed_topic(default_broker, topic)
    env = {**os.environ, "LLOG_BROKER_URL": default_broker.url}
    command = [*LLOG, "tail", "-f", "-n", "1", "--count", "3", "--format", "%p %s\\n", topic]
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as tail:
        assert tail.stdout is not None
        # The last record printed first proves the tail is positioned on every partition.
        newest = tail.stdout.readline()
        assert newest.split()[1] in {v.encode() for _, _, v in produced}
        ok(llog(default_broker, "produce", topic, "--partition", "2", "new-on-2"))
        assert tail.stdout.readline() == b"2 new-on-2\n"
        ok(llog(default_broker, "produce", topic, "--partition", "1", "new-on-1"))
        out, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err.decode()
    assert out == b"1 new-on-1\n" and err == b""


def test_template_format(default_broker: Broker, topic: str, tmp_path: Path) -> None:
    ok(llog(default_broker, "produce", topic, "--partition", "0", "--key", "k-1",
            "--header", "trace=abc", "--header", "span=7", "--timestamp-ms", "1700000000000",
            "first"))
    source = tmp_path / "raw.bin"
    source.write_bytes(b"\xff\xfe\n")
    ok(llog(default_broker, "produce", topic, "--partition", "0", "--file", str(source)))
    out = ok(llog(default_broker, "consume", topic, "--format",
                  "%t|%p|%o|%k|%K|%s|%S|%T|%h|100%%\\t.\\n"))
    first, raw = out.split(b"\n")[:2]
    assert first == (f"{topic}|0|1|k-1|3|first|5|1700000000000|trace=abc,span=7|100%\t."
                     ).encode()
    fields = raw.split(b"|")
    assert fields[3:7] == [b"", b"-1", b"\xff\xfe", b"2"]  # no key; the value's raw bytes
    assert int(fields[7]) > 1_700_000_000_000  # no producer time: the append time
    for bad in ("%x", "jsn"):
        refused = llog(default_broker, "consume", topic, "--format", bad)
        assert refused.returncode == 2 and b"--format" in refused.stderr


def test_groups_list_describe_and_reset(default_broker: Broker, topic: str) -> None:
    from llog_client import LlogClient

    group = f"g-{topic}"
    with LlogClient(default_broker.url) as client:
        client.create_topic(topic, 2)
        client.produce(topic, ["a", "b", "c"], partition=0)
        client.produce(topic, ["x"], partition=1)
        client.commit_offsets(group, {(topic, 0): 1})
        listed = json.loads(ok(llog(default_broker, "groups", "list", "--format", "json")))
        assert group in {g["group"] for g in listed}
        table = ok(llog(default_broker, "groups", "list")).decode().splitlines()
        assert table[0].split()[:3] == ["GROUP", "GENERATION", "MEMBERS"]
        assert any(line.split()[0] == group for line in table[1:])
        described = json.loads(ok(llog(default_broker, "groups", "describe", group,
                                       "--format", "json")))
        lag = {p["partition"]: (p["committed_offset"], p["lag"])
               for p in described["partitions"]}
        assert lag[0] == (1, 2)
        text = ok(llog(default_broker, "groups", "describe", group)).decode()
        assert "LAG" in text and "HIGH_WATERMARK" in text
        reset = json.loads(ok(llog(default_broker, "groups", "reset", group, "--topic", topic,
                                   "--to", "latest", "--format", "json")))
        assert reset == [{"topic": topic, "partition": 0, "offset": 3},
                         {"topic": topic, "partition": 1, "offset": 1}]
        member = client.join_group(group, topic)
        try:
            busy = llog(default_broker, "groups", "reset", group, "--topic", topic,
                        "--to", "earliest")
            assert busy.returncode == 1
            assert busy.stderr.startswith(b"llog groups: GroupNotEmpty: ")
            assert b"stop its consumers" in busy.stderr
        finally:
            client.leave_group(group, member.member_id)
        one = ok(llog(default_broker, "groups", "reset", group, "--topic", topic,
                      "--partition", "0", "--to", "2")).decode().splitlines()
        assert one[1].split() == [topic, "0", "2"]
        assert client.describe_group(group).partitions[0].committed_offset == 2
    assert llog(default_broker, "groups", "reset", group, "--topic", topic).returncode == 2
    missing = llog(default_broker, "groups", "describe", f"no-{group}")
    assert missing.returncode == 1 and b"UnknownGroup" in missing.stderr
