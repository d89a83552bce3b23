"""llog-client is a distribution of its own (clients/python): released at the broker's
version, the ``llog`` command's home (other distributions add commands to it), working
without zstandard; and, built into a wheel and an sdist and installed alone in a fresh
venv (httpx from the package index, nothing of the broker), it produces, consumes, runs a
consumer group and the ``llog`` command against a real broker."""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

from llog_client import _cli
from llog_client._compiled import MODULES, stale
from tests.helpers.stack import Broker

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "python"
# Builds, venvs and installs by uv (the bootstrap's, beside this Python): what pip and
# `python -m build` do, in a fraction of their CPU (each set up an isolated build env).
UV = Path(sys.executable).with_name("uv")


def _project(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def test_the_producers_per_record_modules_run_compiled_unless_told_otherwise() -> None:
    """setup.py compiles them (the editable install here, the wheel below), and falls
    back to interpreted only without a C compiler or with LLOG_CLIENT_COMPILE=0."""
    import llog_client

    expected = os.environ.get("LLOG_CLIENT_COMPILE", "1") != "0"
    assert llog_client.compiled() is expected
    assert stale() == []  # conftest refuses to run otherwise


def test_the_same_modules_interpreted_produce_the_same(broker: Broker, tmp_path: Path
                                                      ) -> None:
    """What a machine without a C compiler installs: the source alone."""
    source = tmp_path / "src"
    shutil.copytree(CLIENT / "src", source, ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "*.pyd"))
    program = (
        "import sys\n"
        "import llog_client\n"
        "from llog_client import LlogClient, Producer\n"
        "assert not llog_client.compiled()\n"
        "url, topic = sys.argv[1:3]\n"
        "with Producer(url, compression='none') as producer:\n"
        "    futures = [producer.send(topic, b'v%d' % i, key=bytearray(b'k'), partition=i % 2,\n"
        "                             headers=[['h', b'x']]) for i in range(1000)]\n"
        "    producer.flush()\n"
        "placed = [f.result() for f in futures]\n"
        "print(sorted({(m.partition, m.offset) for m in placed}) == sorted(\n"
        "    (p, o) for p in (0, 1) for o in range(1, 501)))\n")
    topic = f"pure-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-c", program, broker.url, topic], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_setup_compiles_the_modules_the_package_names() -> None:
    tree = ast.parse((CLIENT / "setup.py").read_text())
    (listed,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["COMPILED"]]
    paths = ast.literal_eval(listed)
    assert sorted(p.removeprefix("src/").removesuffix(".py").replace("/", ".")
                  for p in paths) == sorted(MODULES)


def test_a_compiled_module_older_than_its_source_is_named(tmp_path: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for stem in ("_codec", "_accumulator"):
        (tmp_path / f"{stem}{suffix}").write_bytes(b"")
        (tmp_path / f"{stem}.py").write_text("")
    os.utime(tmp_path / f"_codec{suffix}", (1, 1))  # built before the edit
    assert stale(tmp_path) == ["llog_client._codec"]
    os.utime(tmp_path / "_codec.py", (0, 0))
    assert stale(tmp_path) == []


def test_the_client_is_its_own_distribution_at_the_brokers_version() -> None:
    broker, client = _project(ROOT / "pyproject.toml"), _project(CLIENT / "pyproject.toml")
    assert client["name"] == "llog-client"
    assert client["version"] == broker["version"]
    assert f"llog-client=={broker['version']}" in broker["dependencies"]
    # httpx and what it uses (anyio; sniffio, which httpcore imports on each request);
    # zstandard only through the extra
    assert {d.split(">")[0] for d in client["dependencies"]} == {"httpx", "anyio", "sniffio"}
    assert [d.split(">")[0] for d in client["optional-dependencies"]["zstd"]] == ["zstandard"]
    assert client["scripts"] == {"llog": "llog_client._cli:main"}
    assert "scripts" not in broker
    assert broker["entry-points"]["llog.commands"] == {
        "broker": "app.cli:add_broker_commands"}


def test_other_distributions_add_their_commands_to_llog(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    seen: list[Any] = []

    def register(sub: Any) -> None:
        hello = sub.add_parser("hello")
        hello.add_argument("--n", type=int, default=0)
        hello.set_defaults(func=lambda args: seen.append(args.n) or 0,
                           runner=lambda func, args: func(args) + 3)
        raw = sub.add_parser("raw", add_help=False)
        raw.add_argument("args", nargs=argparse.REMAINDER)
        raw.set_defaults(pass_through=lambda argv: seen.append(argv) or 5)

    assert _cli.main(["hello", "--n", "4"], [register]) == 3  # through its runner
    assert _cli.main(["raw", "--help", "-x"], [register]) == 5  # nothing parsed here
    assert seen == [4, ["--help", "-x"]]
    with pytest.raises(SystemExit):
        _cli.main(["hello"], [])  # only the client's commands
    assert "invalid choice: 'hello'" in capsys.readouterr().err


def test_an_entry_point_that_fails_to_load_leaves_only_its_commands_out(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    broken = _cli.metadata.EntryPoint("broken", "no_such_module_here:add", _cli.COMMANDS_GROUP)
    monkeypatch.setattr(_cli.metadata, "entry_points", lambda group: [broken])
    assert _cli.installed_commands() == []
    assert "no_such_module_here:add are left out: ModuleNotFoundError" in capsys.readouterr().err
    assert "produce" in _cli.build_parser().format_help()


def test_the_broker_registers_its_commands_and_keeps_its_own_errors(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import build_parser, main

    text = build_parser().format_help()
    for name in ("produce", "consume", "serve", "dev", "compactor", "compact-once", "spark",
                 "loadtest", "auth", "servers"):
        assert name in text
    monkeypatch.setenv("LLOG_PORT", "not-a-port")
    assert main(["compact-once", "--topic", "t", "--partition", "0"]) == 2
    assert "llog: invalid configuration" in capsys.readouterr().err


# Where the zstd extra is not installed: what the client sends instead.
WITHOUT_ZSTANDARD = """
import sys
sys.modules["zstandard"] = None  # an import of it fails, as where it is not installed
from llog_client import LlogClient, _compression, _config
from llog_client._cli import main

assert LlogClient("http://127.0.0.1:9").compression == "gzip"
assert _config.default_headers(None)["accept-encoding"] == "gzip"
assert _compression.encode_body(b"x" * 4096, "gzip")[1] == "gzip"
try:
    LlogClient("http://127.0.0.1:9", compression="zstd")
except ValueError as exc:
    assert "llog-client[zstd]" in str(exc), exc
else:
    raise AssertionError("zstd without zstandard")
sys.exit(main(["produce", "t", "v", "--compression", "zstd", "--broker", "http://127.0.0.1:9"]))
"""


def test_without_zstandard_the_client_sends_and_accepts_gzip() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_ZSTANDARD], capture_output=True,
                          text=True, timeout=60, check=False, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "llog produce: compression 'zstd' needs the zstandard package" in done.stderr


# -- the wheel, installed alone ---------------------------------------------------------

# Run by the fresh venv's Python: the calls of docs/client.md, and what went on the wire.
USER_PROGRAM = """
import sys

import httpx

import llog_client
from llog_client import LlogClient, Producer, Record

url, topic, group = sys.argv[1:4]
sent = []


class Recording(httpx.HTTPTransport):
    def handle_request(self, request):
        sent.append((request.url.path, request.headers.get("content-encoding"),
                     request.headers.get("accept-encoding")))
        return super().handle_request(request)


with LlogClient(url, transport=Recording()) as llog:
    assert llog.compression == "gzip", llog.compression  # no zstandard here
    llog.create_topic(topic, partitions=2)
    big = ["x" * 300 + str(i) for i in range(10)]  # over 1 KiB: a compressed body
    result = llog.produce(topic, ["alpha", Record("beta", key="k", headers=[("h", "v")]),
                                  *big], partition=0)
    assert result.offsets() == [(0, i) for i in range(1, 13)], result.offsets()
    assert ("/produce", "gzip", "gzip") in sent, sent
    assert {accept for _, _, accept in sent} == {"gzip"}, sent
    records = list(llog.iter_records(topic, 0, start="earliest", follow=False))
    assert [r.value for r in records] == [b"alpha", b"beta", *(b.encode() for b in big)]
    assert records[1].key == b"k" and records[1].headers == (("h", b"v"),), records[1]

    member = llog.join_group(group, [topic], session_timeout_ms=30000)
    assert sorted(member.assignment) == [(topic, 0), (topic, 1)], member
    batches = llog.fetch_group(group, {p: "committed" for p in member.assignment},
                               max_wait_ms=0)
    by_partition = {b.partition: b for b in batches}
    assert len(by_partition[0].records) == 12 and not by_partition[1].records, batches
    llog.commit_offsets(group, {(topic, 0): 5}, member=member)
    member = llog.heartbeat(group, member.member_id)
    (again,) = llog.fetch_group(group, {(topic, 0): "committed"}, max_wait_ms=0)
    assert again.records[0].offset == 6, again
    committed = {p.partition: p.committed_offset for p in llog.describe_group(group).partitions}
    assert committed[0] == 5, committed
    assert llog.leave_group(group, member.member_id)

    with llog.group_consumer(group, [topic], client_id="worker-1") as consumer:
        offsets = []
        for record in consumer:
            offsets.append(record.offset)
            if record.offset == 12:
                break
    assert offsets == list(range(6, 13)), offsets

# The producer, its per-record modules compiled (no mypy installed here).
assert llog_client.compiled()
with Producer(url, compression="none") as producer:
    futures = [producer.send(topic, b"p%d" % i, partition=1) for i in range(3)]
    producer.flush()
assert [f.result().offset for f in futures] == [1, 2, 3], futures
print("ok")
"""


def _run(*args: str | Path, cwd: Path, timeout: float = 300, stdin: str = ""
         ) -> subprocess.CompletedProcess[str]:
    """A command of the fresh venv: nothing of this tree on its path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, check=False)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def _build(out: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it (so the sdist is shown complete); from a
    copy, as setuptools leaves its egg-info beside the sources."""
    source = out / "source"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "build", "dist", "*.so", "*.pyd"))
    _run(UV, "build", "--quiet", "--out-dir", out, source, cwd=out)
    (sdist,), (wheel,) = out.glob("llog_client-*.tar.gz"), out.glob("llog_client-*.whl")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "src/llog_client/__init__.py",
            "src/llog_client/_cli.py", "src/llog_client/py.typed"} <= names, names
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [line for line in whl.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
        scripts = whl.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert {"llog_client/__init__.py", "llog_client/_cli.py", "llog_client/py.typed"} <= names
    assert not any(n.startswith(("app/", "jobs/", "tests/")) for n in names), names
    assert any("httpx" in r for r in requires) and not any("fastapi" in r for r in requires)
    assert "llog = llog_client._cli:main" in scripts
    # The producer's per-record modules compiled (setup.py), their source beside them.
    for name in MODULES:
        stem = name.replace(".", "/")
        assert f"{stem}.py" in names and any(
            n.startswith(f"{stem}.") and n.endswith(".so") for n in names), (stem, names)
    return sdist, wheel


@pytest.mark.slow
def test_the_wheel_alone_produces_consumes_and_runs_a_group_and_the_cli(
        broker: Broker, tmp_path: Path) -> None:
    _, wheel = _build(tmp_path)
    venv = tmp_path / "venv"
    _run(UV, "venv", "--quiet", "--python", sys.executable, venv, cwd=tmp_path)
    python, llog = venv / "bin" / "python", venv / "bin" / "llog"
    _run(UV, "pip", "install", "--quiet", "--python", python, wheel, cwd=tmp_path)
    for absent in ("fastapi", "app", "zstandard"):
        gone = subprocess.run([python, "-c", f"import {absent}"], capture_output=True,
                              cwd=tmp_path, timeout=60, check=False)
        assert gone.returncode == 1 and b"ModuleNotFoundError" in gone.stderr, absent

    topic, group = f"pkg-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    program = tmp_path / "program.py"
    program.write_text(USER_PROGRAM)
    assert _run(python, program, broker.url, topic, group, cwd=tmp_path).stdout == "ok\n"

    assert _run(llog, "--version", cwd=tmp_path).stdout.strip() == (
        f"llog {_project(CLIENT / 'pyproject.toml')['version']}")
    listed = _run(llog, "--help", cwd=tmp_path).stdout
    assert "produce" in listed and "serve" not in listed  # no broker installed here
    cli_topic = f"{topic}-cli"
    _run(llog, "topics", "create", cli_topic, "--broker", broker.url, cwd=tmp_path)
    _run(llog, "produce", cli_topic, "--broker", broker.url, cwd=tmp_path,
         stdin="".join(f"line {i} {'y' * 200}\n" for i in range(20)))
    out = _run(llog, "consume", cli_topic, "--count", "20", "--broker", broker.url,
               cwd=tmp_path).stdout
    assert out.splitlines() == [f"line {i} {'y' * 200}" for i in range(20)]

    # Another installed distribution adds its command, as the broker's does.
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "pyproject.toml").write_text(PLUGIN)
    (plugin / "llog_hello.py").write_text(
        "def add(sub):\n"
        "    hello = sub.add_parser('hello', help='greets')\n"
        "    hello.set_defaults(func=lambda args: print('hello from a plug-in') or 0)\n")
    _run(UV, "pip", "install", "--quiet", "--python", python, plugin, cwd=tmp_path)
    assert "greets" in _run(llog, "--help", cwd=tmp_path).stdout
    assert _run(llog, "hello", cwd=tmp_path).stdout == "hello from a plug-in\n"


PLUGIN = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "llog-hello"
version = "1"

[project.entry-points."llog.commands"]
hello = "llog_hello:add"

[tool.setuptools]
py-modules = ["llog_hello"]
"""
