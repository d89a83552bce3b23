"""``llog produce``, ``llog consume``, ``llog tail`` and ``llog topics``: the broker's
client on the command line (in the manner of kcat), built on :mod:`llog_client`.

This is the ``llog`` command itself (:func:`main`): other installed distributions add
their commands through the entry-point group ``llog.commands`` (the broker adds serve,
dev, compactor, spark, loadtest, auth, ...: app/cli.py), so a machine with only
``llog-client`` has the client's commands and nothing that needs the broker.

Records go to stdout, one a line (``--format value``) or as JSON lines
(``--format json``); messages and progress go to stderr, progress only when stderr is
a terminal and the records are not being written to one.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import os
import select
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import IO, TYPE_CHECKING, Any, TextIO

from llog_client._cli_groups import reset_target, run_groups
from llog_client._cli_produced import ProducedChunks
from llog_client._cli_records import (
    FORMAT_HELP,
    OutputFormat,
    Template,
    batches,
    output_format,
    partition_list,
)
from llog_client._compression import COMPRESSIONS, DEFAULT_COMPRESSION
from llog_client._config import (
    BROKER_URL_ENV,
    DEFAULT_BROKER_URL,
    ROUTE_ENV,
    ROUTING_CHOICES,
    version,
)
from llog_client._retry import RetryPolicy

if TYPE_CHECKING:
    from llog_client import ConsumedRecord, LlogClient
    from llog_client._models import Start
    from llog_client._producer import Producer

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
READ_CHUNK_BYTES = 1024 * 1024


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default, unless its help already speaks of it."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _has_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text or "%(default)" in text or not _has_default(action):
            return action.help
        return f"{text} (default: %(default)s)"


def _has_default(action: argparse.Action) -> bool:
    default = action.default
    return (bool(action.option_strings) and default is not None and default is not False
            and default is not argparse.SUPPRESS and default != [])


class ArgumentParser(argparse.ArgumentParser):
    """The parser of every ``llog`` subcommand: its help shows the defaults.

    ``trailing_values``, when set, names a list that also takes the positional
    arguments given after options (``llog produce T --key k v1 v2``): argparse fills a
    ``*`` positional once, at its first chance, and would refuse ``v1 v2``. Values that
    start with ``-`` follow a ``--``."""

    trailing_values: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if self.trailing_values is None or not rest:
            return parsed, rest
        cut = rest.index("--") if "--" in rest else len(rest)
        values = [a for a in rest[:cut] if not a.startswith("-")] + rest[cut + 1:]
        getattr(parsed, self.trailing_values).extend(values)
        return parsed, [a for a in rest[:cut] if a.startswith("-")]


def version_text() -> str:
    return f"llog {version()}"


# -- progress ----------------------------------------------------------------------


class Progress:
    """Records/s and MiB/s on a terminal, redrawn in place at most every ``interval_s``;
    nothing at all anywhere else, and nothing for a transfer shorter than that."""

    def __init__(self, stream: TextIO, label: str, *, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = 0.5) -> None:
        self._stream = stream
        self._label = label
        self._enabled = stream.isatty() if enabled is None else enabled
        self._clock = clock
        self._interval_s = interval_s
        self._started = clock()
        self._drawn_at: float | None = None
        self.records = 0
        self.bytes = 0

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        if not self._enabled:
            return
        now = self._clock()
        if now - (self._drawn_at or self._started) >= self._interval_s:
            self._draw(now, end="")

    def finish(self) -> None:
        if self._enabled and self._drawn_at is not None:
            self._draw(self._clock(), end="\n")

    def _draw(self, now: float, end: str) -> None:
        elapsed = max(now - self._started, 1e-9)
        mib = self.bytes / (1024 * 1024)
        self._stream.write(f"\r{self._label}: {self.records} records, {mib:.1f} MiB, "
                           f"{self.records / elapsed:.0f} records/s, "
                           f"{mib / elapsed:.2f} MiB/s\x1b[K{end}")
        self._stream.flush()
        self._drawn_at = now


# -- reading values ------------------------------------------------------------------


def _ready(fd: int) -> bool:
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _read_available(fd: int, limit: int) -> bytes:
    """At least one byte (blocking for it), then whatever else is there at once, up to
    ``limit``: a pipe fed by a person is sent line by line, a file in large batches."""
    parts = [os.read(fd, limit)]
    size = len(parts[0])
    while parts[-1] and size < limit and _ready(fd):
        parts.append(os.read(fd, limit - size))
        size += len(parts[-1])
    return b"".join(parts)


def read_lines(fd: int, limit: int = READ_CHUNK_BYTES) -> Iterator[list[bytes]]:
    """The lines of ``fd`` (without their newline) in batches, as they become available."""
    tail = b""
    while block := _read_available(fd, limit):
        lines = (tail + block).split(b"\n")
        tail = lines.pop()
        if lines:
            yield lines
    if tail:
        yield [tail]


# -- produce -----------------------------------------------------------------------


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def _value_batches(args: argparse.Namespace) -> Iterator[list[bytes]]:
    if args.values:
        if args.file is not None:
            raise ValueError("give values as arguments or with --file, not both")
        yield [os.fsencode(v) for v in args.values]
        return
    if args.file is None or args.file == "-":
        yield from read_lines(sys.stdin.fileno())
        return
    with open(args.file, "rb") as source:
        yield from read_lines(source.fileno())


def cmd_produce(args: argparse.Namespace) -> int:
    """The values through a :class:`~llog_client.Producer`: read, sent and acknowledged
    at once (the next lines are read while earlier ones travel), in the order given."""
    from llog_client import LlogError

    # Offsets printed on the same terminal would be torn by the progress line.
    progress = Progress(sys.stderr, "llog produce", enabled=sys.stderr.isatty() and not (
        args.print_offsets and sys.stdout.isatty()))
    chunks = ProducedChunks(args.topic, printing=args.print_offsets, progress=progress)
    try:
        with _producer(args) as producer:
            send = functools.partial(producer.send, args.topic, partition=_partition(args),
                                     key=args.key, headers=args.header or None,
                                     timestamp_ms=args.timestamp_ms)
            for values in _value_batches(args):
                chunks.add([send(v) for v in values], sum(map(len, values)))
                chunks.settle(wait=False)
            producer.flush()
            chunks.settle(wait=True)
    except LlogError as exc:
        print(f"llog produce: {exc} ({progress.records} records were acknowledged before)",
              file=sys.stderr)
        return EXIT_FAILED
    finally:
        progress.finish()
    return 0


def _partition(args: argparse.Namespace) -> int | None:
    """The partition asked for; records without key or partition go to 0, as ever."""
    if args.partition is not None or args.key is not None:
        return None if args.partition is None else int(args.partition)
    return 0


def _producer(args: argparse.Namespace) -> Producer:
    from llog_client import Producer

    # The CLI's retry count bounds each batch's delivery, and how long the topic's first
    # lookup is retried: that many more timeouts.
    patience_ms = args.timeout * 1000 * (args.retries + 1)
    return Producer(args.broker, request_timeout_s=args.timeout,
                    delivery_timeout_ms=patience_ms, max_block_ms=patience_ms,
                    compression=None if args.compression == "auto" else args.compression,
                    route=args.route, batch_bytes=4 * 1024 * 1024,
                    max_request_bytes=4 * 1024 * 1024)


# -- consume and tail --------------------------------------------------------------


def _number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least "
                                         f"{least}")
    return value


def _start(text: str) -> Start:
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    return _number(text, 0)


def _text_or_base64(data: bytes, text: str, b64: str) -> dict[str, str]:
    import base64

    try:
        return {text: data.decode()}
    except UnicodeDecodeError:
        return {b64: base64.b64encode(data).decode()}


def record_json(record: ConsumedRecord) -> dict[str, Any]:
    """A record as one JSON object: the HTTP API's own shape, plus topic and partition;
    ``key`` (or ``key_base64``), ``headers`` and the times are always present."""
    out: dict[str, Any] = {"topic": record.topic, "partition": record.partition,
                           "offset": record.offset}
    out.update(_text_or_base64(record.value, "value", "base64"))
    out.update({"key": None} if record.key is None
               else _text_or_base64(record.key, "key", "key_base64"))
    out["headers"] = [{"name": n, **_text_or_base64(v, "value", "base64")}
                      for n, v in record.headers]
    out["timestamp_ms"] = record.timestamp_ms
    out["append_time_ms"] = record.append_time_ms
    return out


def _write_record(out: IO[bytes], record: ConsumedRecord, fmt: OutputFormat) -> None:
    if isinstance(fmt, Template):
        out.write(fmt.render(record))
    elif fmt == "json":
        out.write(json.dumps(record_json(record), ensure_ascii=False).encode() + b"\n")
    else:
        out.write(record.value + b"\n")


def _show(llog: LlogClient, args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    progress = Progress(sys.stderr, f"llog {args.command}",
                        enabled=sys.stderr.isatty() and not sys.stdout.isatty())
    left = args.count
    try:
        for run in batches(llog, args):
            records = run[:left] if left is not None else run
            for record in records:
                _write_record(out, record, args.format)
            out.flush()
            progress.add(len(records), sum(len(r.value) for r in records))
            if left is not None:
                left -= len(records)
                if left <= 0:
                    break
    finally:
        progress.finish()
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    with _client(args) as llog:
        return _show(llog, args)


def cmd_tail(args: argparse.Namespace) -> int:
    with _client(args) as llog:
        return _show(llog, args)


# -- topics ------------------------------------------------------------------------


def _limit(text: str) -> int | str:
    return text if text == "none" else _number(text, 1)


def _compression(text: str) -> tuple[str, int | None]:
    """``none``, ``zstd`` or ``zstd:LEVEL`` (the broker checks the codec and level)."""
    name, sep, level = text.partition(":")
    if not sep:
        return name, None
    try:
        return name, int(level)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the level after ':' must be an integer"
                                         ) from None


_TOPIC_COLUMNS = ("topic", "partitions", "retention_ms", "retention_bytes", "max_record_bytes",
                  "compression", "compression_level")
_PARTITION_COLUMNS = ("partition", "log_start_offset", "high_watermark", "retained_bytes",
                      "last_append_ms")


def _table(rows: Sequence[Any], columns: Sequence[str]) -> str:
    cells = [[c.upper() for c in columns]] + [
        ["-" if getattr(r, c) is None else str(getattr(r, c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _print_topics(args: argparse.Namespace, found: Any) -> None:
    if args.format == "json":
        data = ([dataclasses.asdict(t) for t in found] if isinstance(found, list)
                else dataclasses.asdict(found))
        print(json.dumps(data, indent=2))
        return
    rows = found if isinstance(found, list) else [found]
    print(_table(rows, _TOPIC_COLUMNS))
    if hasattr(found, "partition_states"):
        print()
        print(_table(found.partition_states, _PARTITION_COLUMNS))


def _topic_call(llog: LlogClient, args: argparse.Namespace) -> Any:
    from llog_client import UNSET

    action = args.action
    if action == "list":
        return llog.list_topics()
    compression: tuple[str, int | None] | None = getattr(args, "topic_compression", None)
    if action == "create":
        name, level = compression or (None, None)
        return llog.create_topic(args.name, args.partitions, retention_ms=args.retention_ms,
                                 retention_bytes=args.retention_bytes,
                                 max_record_bytes=args.max_record_bytes,
                                 compression=name, compression_level=level)
    if action == "describe":
        return llog.describe_topic(args.name)
    if action == "delete":
        return llog.delete_topic(args.name)
    limits: dict[str, Any] = {}
    for name in ("retention_ms", "retention_bytes", "max_record_bytes"):
        given = getattr(args, name)  # None: not given; "none": clear the limit
        limits[name] = UNSET if given is None else None if given == "none" else given
    if compression is not None:
        limits["compression"], limits["compression_level"] = compression
    return llog.update_topic(args.name, partitions=args.partitions, **limits)


def cmd_topics(args: argparse.Namespace) -> int:
    with _client(args) as llog:
        _print_topics(args, _topic_call(llog, args))
    return 0


# -- running -----------------------------------------------------------------------


def _client(args: argparse.Namespace) -> LlogClient:
    from llog_client import LlogClient

    return LlogClient(args.broker, timeout_s=args.timeout,
                      retry=RetryPolicy(max_attempts=args.retries + 1),
                      compression=getattr(args, "compression", DEFAULT_COMPRESSION),
                      route=getattr(args, "route", "any"))


def run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a client command: its errors become a message and an exit code."""
    from llog_client import LlogError

    name = f"llog {args.command}"
    try:
        return command(args)
    except LlogError as exc:
        written = sum(b.count for b in exc.produced)
        note = f" ({written} records were acknowledged before)" if written else ""
        print(f"{name}: {exc}{note}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _reader_left()
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _reader_left() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as cat does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError):
        os.dup2(devnull, sys.stdout.fileno())
    return 0


# -- the parsers ---------------------------------------------------------------------

def _connection() -> ArgumentParser:
    common = ArgumentParser(add_help=False)
    common.add_argument("--broker", metavar="URL",
                        default=os.environ.get(BROKER_URL_ENV) or DEFAULT_BROKER_URL,
                        help=f"broker URL, or several separated by commas; "
                             f"${BROKER_URL_ENV} sets the default")
    common.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="time limit of one request, beyond a long-poll's wait")
    common.add_argument("--retries", type=lambda text: _number(text, 0),
                        default=RetryPolicy().max_attempts - 1, metavar="N",
                        help="times a request that failed in a way worth retrying (no "
                             "connection, 503, a timeout) is sent again, with backoff; "
                             "0 fails at once")
    return common


def _command(sub: Any, name: str, command: Callable[[argparse.Namespace], int],
             **kwargs: Any) -> ArgumentParser:
    parser: ArgumentParser = sub.add_parser(name, parents=[_connection()], **kwargs)
    parser.set_defaults(func=lambda args: run(command, args))
    return parser


def _add_produce(sub: Any) -> None:
    p = _command(sub, "produce", cmd_produce, help="append records (arguments, stdin or a file)",
                 description="Append records: the VALUEs, else each line of --file, else "
                             "each line of stdin. Many records go in one request, each "
                             "batch with an idempotency key, so retries never duplicate.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("values", metavar="VALUE", nargs="*", help="record values")
    p.trailing_values = "values"
    p.add_argument("--partition", type=int, default=None, metavar="N",
                   help="the partition (default: the key's partition with --key, else 0)")
    p.add_argument("--key", default=None, help="key of every record")
    p.add_argument("--header", type=_header, action="append", default=[],
                   metavar="NAME=VALUE", help="a header of every record (repeatable)")
    p.add_argument("--timestamp-ms", type=int, default=None, metavar="MS",
                   help="the producer's timestamp of every record")
    p.add_argument("--file", metavar="PATH", default=None,
                   help="read values from the lines of PATH ('-': stdin)")
    p.add_argument("--print-offsets", action="store_true",
                   help="print each acknowledged batch as a JSON line")
    p.add_argument("--compression", choices=("auto", *COMPRESSIONS), default="auto",
                   help="how request bodies are compressed; auto: zstd for topics stored "
                        "compressed, else none (bodies under 1 KiB, or that would not "
                        "shrink, go raw)")
    p.add_argument("--route", choices=ROUTING_CHOICES,
                   default=os.environ.get(ROUTE_ENV) or "any",
                   help="preferred: send the records of one partition straight to the "
                        "broker that appends it (the brokers' GET /cluster), falling back "
                        f"to --broker; ${ROUTE_ENV} sets the default")


def _add_reading_options(p: argparse.ArgumentParser, wait_ms: int) -> None:
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--partition", type=partition_list, action="extend", default=None,
                   metavar="N[,N...]",
                   help="read only these partitions (repeatable; default: every partition)")
    p.add_argument("--count", type=lambda text: _number(text, 1), default=None, metavar="N",
                   help="stop after N records in all (default: no limit)")
    p.add_argument("--format", type=output_format, default="value",
                   metavar="value|json|TEMPLATE", help=FORMAT_HELP)
    p.add_argument("--max-wait-ms", type=int, default=wait_ms, metavar="MS",
                   help="longest wait of one long-poll while following")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep waiting for new records on every partition read (Ctrl-C "
                        "stops)")


_ALL_PARTITIONS = ("Every partition of the topic is read (kcat's default), or those "
                   "--partition names, the records interleaved by append time (ties by "
                   "partition, then offset). ")


def _add_consume(sub: Any) -> None:
    p = _command(sub, "consume", cmd_consume, help="print records of a topic",
                 description="Print the records of a topic from --from to the end (with "
                             "-f: and then those that arrive). " + _ALL_PARTITIONS +
                             "--from applies to each partition: an OFFSET outside a "
                             "partition's log starts it at the nearer end (with "
                             "--partition, it is an error); --count counts records of "
                             "all partitions.")
    _add_reading_options(p, 10_000)
    p.add_argument("--from", dest="start", type=_start, default="earliest",
                   metavar="earliest|latest|OFFSET",
                   help="where to start in each partition")


def _add_tail(sub: Any) -> None:
    p = _command(sub, "tail", cmd_tail, help="print the last records (-f: and follow)",
                 description="Print the last records of a topic; with -f, keep printing "
                             "those that arrive. " + _ALL_PARTITIONS + "--lines counts "
                             "the last records of all partitions together, as does "
                             "--count (the first ones included).")
    _add_reading_options(p, 10_000)
    p.add_argument("-n", "--lines", type=lambda text: _number(text, 0), default=10, metavar="N",
                   help="how many of the last records to print first")


def _topic_format() -> ArgumentParser:
    common = ArgumentParser(add_help=False)
    common.add_argument("--format", choices=("text", "json"), default="text")
    return common


def _add_topics(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "topics", help="list, create, describe, update or delete topics",
        description="Topic administration.")
    p.set_defaults(func=lambda args: run(cmd_topics, args))
    parents = [_connection(), _topic_format()]
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                               parser_class=ArgumentParser)
    actions.add_parser("list", help="the topics", parents=parents)
    create = actions.add_parser("create", help="create a topic", parents=parents)
    create.add_argument("name", metavar="TOPIC")
    create.add_argument("--partitions", type=int, default=1, metavar="N")
    update = actions.add_parser("update", parents=parents,
                                help="change retention, limits, compression or partitions",
                                description="Change only what is given; 'none' clears a "
                                            "limit; partitions only grow.")
    update.add_argument("name", metavar="TOPIC")
    update.add_argument("--partitions", type=int, default=None, metavar="N",
                        help="grow to N partitions (default: unchanged)")
    for parser, limit_type, default, stored in (
            (create, int, "no limit", "the broker's LLOG_TOPIC_DEFAULT_COMPRESSION"),
            (update, _limit, "unchanged", "unchanged")):
        for flag in ("--retention-ms", "--retention-bytes", "--max-record-bytes"):
            parser.add_argument(flag, type=limit_type, default=None, metavar="N",
                                help=f"(default: {default})")
        # Its own dest: a client's --compression (of request bodies) is another thing.
        parser.add_argument("--compression", type=_compression, default=None,
                            dest="topic_compression", metavar="none|zstd[:LEVEL]",
                            help=f"how new appends are stored (default: {stored})")
    for name, text in (("describe", "a topic and its partitions"), ("delete", "delete a topic")):
        actions.add_parser(name, help=text, parents=parents).add_argument("name", metavar="TOPIC")


def cmd_groups(args: argparse.Namespace) -> int:
    with _client(args) as llog:
        print(run_groups(llog, args))
    return 0


def _add_groups(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "groups", help="list, describe or reset consumer groups",
        description="Consumer groups: their members, committed offsets and lag.")
    p.set_defaults(func=lambda args: run(cmd_groups, args))
    parents = [_connection(), _topic_format()]
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                               parser_class=ArgumentParser)
    actions.add_parser("list", help="every group", parents=parents)
    actions.add_parser("describe", parents=parents,
                       help="members, generation, committed offsets and lag"
                       ).add_argument("group", metavar="GROUP")
    reset = actions.add_parser(
        "reset", parents=parents, help="set a group's committed offsets",
        description="Set the committed offsets of a group without live members (the "
                    "broker refuses while one is live), for one partition or every "
                    "partition of --topic.")
    reset.add_argument("group", metavar="GROUP")
    reset.add_argument("--topic", required=True, metavar="TOPIC")
    reset.add_argument("--partition", type=int, default=None, metavar="N",
                       help="only this partition (default: every partition of the topic)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", type=reset_target, default=None,
                    metavar="earliest|latest|OFFSET",
                    help="earliest: read from the log start next; latest: only what is "
                         "written next; OFFSET: the last offset processed (reading "
                         "resumes at OFFSET+1)")
    to.add_argument("--to-timestamp-ms", type=int, default=None, metavar="MS",
                    help="read next from the first record appended at or after MS")


def add_client_commands(sub: Any) -> None:
    """Register produce, consume, tail, topics and groups on ``llog``'s subcommands."""
    for add in (_add_produce, _add_consume, _add_tail, _add_topics, _add_groups):
        add(sub)


# -- the llog command ----------------------------------------------------------------

# Each entry point of this group names a function that takes ``llog``'s subcommands (the
# action ``add_subparsers`` returns) and adds its distribution's commands to them. A
# command's parser may set two defaults beside ``func``: ``pass_through``, a function of
# the arguments after the command's name, for a command with an argument parser of its
# own (nothing after the name is parsed here, not even --help); and ``runner``, called
# as ``runner(func, args)`` instead of ``func(args)`` (to turn its own errors into
# messages). Both reach the nested subcommands of the parser that sets them.
COMMANDS_GROUP = "llog.commands"
Register = Callable[[Any], None]


def installed_commands() -> list[Register]:
    """The registering functions of the installed distributions, in their names' order.
    One that fails to load is left out with a note on stderr: the client's own commands
    still work (and a broken install still says what is broken)."""
    found: list[Register] = []
    for entry in sorted(metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            found.append(entry.load())
        except Exception as exc:
            print(f"llog: the commands of {entry.value} are left out: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return found


def _build(commands: Sequence[Register] | None) -> tuple[ArgumentParser, Any]:
    parser = ArgumentParser(prog="llog", description="leaderless-log: the client's commands "
                            "and, where the broker is installed, its tools")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    add_client_commands(sub)
    for register in installed_commands() if commands is None else commands:
        register(sub)
    return parser, sub


def build_parser(commands: Sequence[Register] | None = None) -> ArgumentParser:
    """``llog``'s parser: the client's commands, and those that ``commands`` add
    (default: those of the installed distributions, :data:`COMMANDS_GROUP`)."""
    return _build(commands)[0]


def main(argv: Sequence[str] | None = None, commands: Sequence[Register] | None = None
         ) -> int:
    """Run ``llog`` with ``argv`` (default: the process's arguments); the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, sub = _build(commands)
    named = sub.choices.get(argv[0]) if argv else None
    pass_through = named.get_default("pass_through") if named is not None else None
    if pass_through is not None:
        return int(pass_through(argv[1:]))
    args = parser.parse_args(argv)
    runner = getattr(args, "runner", None)
    return int(args.func(args) if runner is None else runner(args.func, args))


if __name__ == "__main__":
    sys.exit(main())
