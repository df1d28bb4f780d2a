"""``k7 topics``: create, look into, write to and read a topic's directory, and manage an
exchange's bindings, from the command line.

``info`` and ``tail`` open the topic ``readonly=True``: they take no lock, write nothing and
run next to the processes that send to it and consume it. ``send`` opens it as one more
shared writer, with the segment size its partitions were created with. ``exchange``, ``bind``
and ``unbind`` read and change an exchange's bindings file, as ``Exchange`` does.

``k7core.cli`` adds the ``topics`` group to ``k7``; its ``K7Error`` translation covers these
commands (``Error: <Type>: message (hint)``, exit status 3).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .._errors import CursorError
from .._format import FRAME_ALIGN
from .._group import check_offset
from .._stats import LAG_COUNT_LIMIT, list_segment_infos
from ..jobs._cli import CommandError
from ._envelope import Record
from ._errors import TopicError
from ._exchange import EXCHANGE_FILE, Exchange
from ._layout import MAX_PARTITIONS, META_FILE, PARTITION_PREFIX, partition_dir
from ._partitioner import PARTITIONERS
from ._routing import X_MATCH_MODES, Binding, ExchangeKind, InvalidBindingError
from ._stats import TopicStats
from ._topic import TOPIC_SEGMENT_SIZE, Topic

KINDS = tuple(k.value for k in ExchangeKind)
"""The exchange kinds ``--create`` takes."""
BINDING_COLUMNS = {"direct": ("routing key",), "topic": ("pattern",), "fanout": (),
                   "headers": ("headers", "x-match")}
"""The fields of a binding each kind reads: the columns ``exchange`` shows."""
_ESCAPED = re.compile(r"[\\\x00-\x1f\x7f\udc80-\udcff]")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quoted(path: Path) -> str:
    return shlex.quote(str(path))


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


# ---------------------------------------------------------------------------------- checks


def _kind_of(d: Path) -> str | None:
    """What the directory ``d`` holds: a k7 ``"topic"``, ``"exchange"`` or ``"queue"``, or
    None (nothing of k7's, or no such directory)."""
    if (d / META_FILE).is_file():
        return "topic"
    if (d / EXCHANGE_FILE).is_file():
        return "exchange"
    try:
        return "queue" if d.is_dir() and list_segment_infos(d) else None
    except OSError as exc:
        raise CommandError(f"{d}: {exc.strerror}") from exc


READERS = {"queue": "`k7 info {}` reads it", "topic": "`k7 topics info {}` reads it",
           "exchange": "`k7 topics exchange {}` reads it"}
"""What to say of a directory that holds another kind of thing than the command needs."""


def _checked(path: str, want: str, create: str) -> Path:
    """``path`` as an existing directory holding a k7 ``want``, or a CommandError that says
    what it is (``create``: the command that makes one). Checked before anything opens it,
    so that nothing is created where none is."""
    d = Path(path)
    if not d.exists():
        raise CommandError(f"{d}: no such directory ({create.format(_quoted(d))} creates "
                           f"{_a(want)} there)")
    if not d.is_dir():
        raise CommandError(f"{d} is not a directory")
    found = _kind_of(d)
    if found == want:
        return d
    if found is not None:
        raise CommandError(f"{d} is a k7 {found}, not {_a(want)} "
                           f"({READERS[found].format(_quoted(d))})")
    what = META_FILE if want == "topic" else EXCHANGE_FILE
    raise CommandError(f"{d} is not {_a('k7 ' + want)} (it holds no {what}; "
                       f"{create.format(_quoted(d))} creates one)")


def topic_dir(path: str) -> Path:
    """``path`` as an existing topic's directory, or a CommandError."""
    return _checked(path, "topic", "`k7 topics create {} --partitions N`")


def exchange_dir(path: str) -> Path:
    """``path`` as an existing exchange's directory, or a CommandError."""
    return _checked(path, "exchange", "`k7 topics exchange {} --create KIND`")


def _own_dir(d: Path, want: str) -> None:
    """Before creating a ``want`` in ``d``: a CommandError if ``d`` is a file or holds
    another k7 thing."""
    if d.exists() and not d.is_dir():
        raise CommandError(f"{d} is not a directory")
    found = _kind_of(d)
    if found not in (None, want):
        raise CommandError(f"{d} is a k7 {found}: {_a(want)} needs a directory of its own")


def _check_partition(topic: Topic, partition: int | None) -> None:
    if partition is not None and partition >= topic.partitions:
        raise click.BadParameter(
            f"partition {partition} is out of range: topic {topic.path} has "
            f"{topic.partitions} partition(s), 0 .. {topic.partitions - 1}",
            param_hint="--partition")


def _segment_size(d: Path) -> int:
    """The segment size of an existing topic: its largest segment file. A writer opened with
    another size would resize the partitions' last segments and write new ones in it."""
    sizes = [s.size for p in d.glob(f"{PARTITION_PREFIX}*") if p.is_dir()
             for s in list_segment_infos(p)]
    size = max(sizes, default=TOPIC_SEGMENT_SIZE)
    return size if size >= 64 and size % FRAME_ALIGN == 0 else TOPIC_SEGMENT_SIZE


def _header_pairs(ctx: click.Context, param: click.Parameter,
                  values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``--header NAME=VALUE`` arguments as pairs (split at the first ``=``), or a usage
    error (exit status 2)."""
    out = []
    for v in values:
        name, eq, value = v.partition("=")
        if not eq:
            raise click.BadParameter(f"{v!r} is not NAME=VALUE", ctx, param)
        if not name:
            raise click.BadParameter(f"{v!r} has an empty name", ctx, param)
        try:
            name.encode()
        except UnicodeEncodeError:
            raise click.BadParameter(f"header name {name!r} is not valid UTF-8", ctx,
                                     param) from None
        out.append((name, value))
    return tuple(out)


def _arg_bytes(text: str) -> bytes:
    """A command-line argument's own bytes (one that is not UTF-8 reaches Python with its
    bytes escaped as surrogates: they come back as they were)."""
    return text.encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------------- group


@click.group("topics")
def topics() -> None:
    """Topics (k7core.topics): create, info, send, tail; exchanges and their bindings.

    info and tail only read (next to live producers and consumers); send is one more
    shared writer.
    """


_header = click.option(
    "--header", "headers", metavar="NAME=VALUE", multiple=True, callback=_header_pairs,
    help="A header (repeat for more); split at the first '='.")


# ---------------------------------------------------------------------------------- create


def _cli_hint(exc: TopicError, d: Path) -> str | None:
    """A TopicError's hint about the settings a topic was created with, in the command
    line's terms."""
    info = f"`k7 topics info {_quoted(d)}` shows the topic's settings"
    hint = exc.hint or ""
    hint = re.sub(r"open it with partitions=None \(or its own count\)", info, hint)
    return re.sub(r"open it with partitioner=None or its own partitioner",
                  f"{info}; its partitioner is fixed when it is created, so that keys keep "
                  "their partition", hint) or None


@topics.command()
@click.argument("directory")
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), required=True,
              help="How many partitions (fixed for the topic's life).")
@click.option("--partitioner", type=click.Choice(PARTITIONERS), default=None,
              help="How keys are placed (fixed for the topic's life; a new topic's default: "
                   "kafka).")
@click.option("--segment-size", type=click.IntRange(min=64), default=None, metavar="BYTES",
              help=f"The partitions' segment size (default {TOPIC_SEGMENT_SIZE:,}).")
def create(directory: str, partitions: int, partitioner: str | None,
           segment_size: int | None) -> None:
    """Create a topic in DIRECTORY; one that exists with these settings is left as it is."""
    d = Path(directory)
    if segment_size is not None and segment_size % FRAME_ALIGN:
        raise click.BadParameter(f"a multiple of {FRAME_ALIGN}", param_hint="--segment-size")
    _own_dir(d, "topic")
    exists = (d / META_FILE).is_file()
    try:
        if exists:  # read only: a writer with another segment size would resize segments
            Topic(d, partitions, partitioner, readonly=True).close()
        else:
            Topic(d, partitions, partitioner,
                  segment_size=segment_size or TOPIC_SEGMENT_SIZE).close()
    except TopicError as exc:
        message = str(exc).removesuffix(f" ({exc.hint})") if exc.hint else str(exc)
        raise TopicError(message, path=exc.path, hint=_cli_hint(exc, d)) from None
    with Topic(d, readonly=True) as topic:
        name = topic.partitioner
    size = _segment_size(d)
    if exists and segment_size is not None and segment_size != size:
        raise CommandError(
            f"topic {d} exists with {size:,}-byte segments, not {segment_size:,} (a "
            "topic's writers keep the size of its segments)")
    click.echo(f"{'topic' if exists else 'created topic'} {d}{' exists' if exists else ''}: "
               f"{partitions} partition(s), partitioner {name}, {size:,}-byte segments")


# ---------------------------------------------------------------------------------- info


@topics.command()
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True,
              help="Print Topic.stats() as JSON (dataclasses.asdict).")
def info(directory: str, as_json: bool) -> None:
    """Partitions (offsets, writer processes), and every consumer group: generation,
    strategy, members and, per partition, its owner, holder, committed offset and lag.
    Reads only."""
    d = topic_dir(directory)
    with Topic(d, readonly=True) as topic:
        st = topic.stats()
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(st), indent=2, ensure_ascii=False))
        return
    _print_info(d, st)


def _print_info(d: Path, st: TopicStats) -> None:
    out = Console(width=max(100, shutil.get_terminal_size().columns))
    out.print(f"[bold]{escape(str(d))}[/bold]  {len(st.partitions)} partition(s), "
              f"partitioner {st.partitioner}", soft_wrap=True)
    parts = Table("partition", "earliest", "next offset", "log bytes", "writer pids",
                  title="partitions")
    for p in st.partitions:
        parts.add_row(str(p.partition), str(p.earliest_offset), str(p.next_offset),
                      f"{p.next_offset - p.earliest_offset:,}",
                      ", ".join(map(str, p.writer_pids)) or "-")
    out.print(parts)
    if not st.groups:
        out.print("no consumer groups")
        return
    uncounted = False
    for g in st.groups:
        out.print(f"group [bold]{escape(g.name)}[/bold]: generation {g.generation}, strategy "
                  f"{g.strategy or '-'}, members: {escape(', '.join(g.members)) or 'none'}",
                  soft_wrap=True)
        total = g.lag_messages
        t = Table(show_footer=True)
        t.add_column("partition", footer="all")
        for col in ("owner", "holder", "committed"):
            t.add_column(col)
        t.add_column("lag bytes", footer=f"{g.lag_bytes:,}", justify="right")
        t.add_column("lag messages", footer="?" if total is None else f"{total:,}",
                     justify="right")
        for lag in g.partitions:
            t.add_row(str(lag.partition), escape(lag.owner or "-"),
                      escape(lag.holder or ("locked" if lag.owned else "-")),
                      str(lag.committed), f"{lag.lag_bytes:,}",
                      "?" if lag.lag_messages is None else f"{lag.lag_messages:,}")
        out.print(t)
        uncounted = uncounted or total is None
    if uncounted:
        out.print(f"?: lag messages not counted: they are counted (a scan of their frames) "
                  f"only when the lag is at most {LAG_COUNT_LIMIT:,} bytes and its frames "
                  "can be read; the lag in bytes is exact", highlight=False)


# ---------------------------------------------------------------------------------- send


@topics.command()
@click.argument("directory")
@click.argument("value")
@click.option("--key", default=None, help="The record's key (it places the record).")
@_header
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="This partition, whatever the key.")
def send(directory: str, value: str, key: str | None, headers: tuple[tuple[str, str], ...],
         partition: int | None) -> None:
    """Send one record (VALUE, its key and headers as given, UTF-8 or the argument's own
    bytes); print its partition and offset."""
    d = topic_dir(directory)
    with Topic(d, segment_size=_segment_size(d)) as topic:
        _check_partition(topic, partition)
        p, offset = topic.send(_arg_bytes(value), None if key is None else _arg_bytes(key),
                               [(n, _arg_bytes(v)) for n, v in headers], partition=partition)
    click.echo(f"{p} {offset}")


# ---------------------------------------------------------------------------------- tail


def _start(ctx: click.Context, param: click.Parameter, value: str) -> str | int:
    if value in ("earliest", "latest"):
        return value
    try:
        off = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not 'earliest', 'latest' or an offset", ctx,
                                 param) from None
    if off < 0:
        raise click.BadParameter("an offset is >= 0", ctx, param)
    return off


def _first(topic: Topic, p: int, start: str | int) -> int:
    """Where partition ``p`` is read from: ``start`` checked, as a usage error (exit status
    2) if no record starts there."""
    q = topic.partition(p)
    if start == "earliest":
        return q.earliest()
    if start == "latest":
        return q.end
    assert isinstance(start, int)
    earliest = q.earliest()
    if start < earliest:
        raise click.BadParameter(f"offset {start} is before partition {p}'s earliest offset "
                                 f"{earliest} (deleted by retention)", param_hint="--from")
    bad: CursorError | None = check_offset(partition_dir(topic.path, p), start, q.end,
                                           said=f"partition {p}: offset",
                                           path=partition_dir(topic.path, p))
    if bad is not None:
        text = str(bad).removesuffix(f" ({bad.hint})")
        if bad.boundary is not None:
            text += f"; `--from {bad.boundary}` starts at the next record"
        raise click.BadParameter(text, param_hint="--from")
    return start


def _shown(data: bytes) -> str:
    """Bytes as UTF-8 text on one line: bytes that are not UTF-8 as ``\\xNN``; backslash,
    tab, newlines and other control characters escaped."""
    def one(m: re.Match[str]) -> str:
        c = m[0]
        if c in _ESCAPES:
            return _ESCAPES[c]
        code = ord(c)
        return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"

    return _ESCAPED.sub(one, data.decode("utf-8", "surrogateescape"))


def _when(ms: int) -> str:
    try:
        t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text_line(r: Record) -> str:
    key = "-" if r.key is None else _shown(r.key)
    headers = ",".join(f"{_shown(n.encode())}={_shown(v)}" for n, v in r.headers) or "-"
    return f"{r.partition}\t{r.offset}\t{_when(r.timestamp)}\t{key}\t{headers}\t{_shown(r.value)}"


def _field(name: str, data: bytes | None) -> dict[str, Any]:
    """``{name: text}`` for UTF-8 (None for None), else ``{name_base64: ...}``."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode()}


def record_json(r: Record) -> dict[str, Any]:
    """A record as ``tail --json`` prints it (one object a line)."""
    return {"partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
            **_field("key", r.key),
            "headers": [{"name": n, **_field("value", v)} for n, v in r.headers],
            **_field("value", r.value)}


def _records(topic: Topic, parts: Iterable[int], start: str | int,
             limit: int | None) -> Iterable[Record]:
    firsts = [(p, _first(topic, p, start)) for p in parts]  # every --from checked first
    left = limit
    for p, first in firsts:
        for r in topic.records(p, first):
            if left == 0:
                return
            yield r
            left = None if left is None else left - 1


@topics.command()
@click.argument("directory")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="This partition only (default: each in turn, 0 first).")
@click.option("--from", "start", metavar="earliest|latest|OFFSET", default="earliest",
              show_default=True, callback=_start,
              help="Where each partition is read from (an OFFSET needs --partition).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Stop after N records (over all the partitions read).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a record.")
def tail(directory: str, partition: int | None, start: str | int, limit: int | None,
         as_json: bool) -> None:
    """Print records, one a line: partition, offset, timestamp, key, headers and value,
    tab-separated (no key, no headers: -). Without a consumer group: reads only."""
    if isinstance(start, int) and partition is None:
        raise click.UsageError("--from OFFSET needs --partition: offsets are per partition")
    d = topic_dir(directory)
    out = sys.stdout.buffer
    try:
        with Topic(d, readonly=True) as topic:
            _check_partition(topic, partition)
            parts = range(topic.partitions) if partition is None else [partition]
            for r in _records(topic, parts, start, limit):
                line = json.dumps(record_json(r), ensure_ascii=False) if as_json else \
                    _text_line(r)
                out.write(line.encode() + b"\n")
            out.flush()
    except BrokenPipeError:  # `k7 topics tail DIR | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# ---------------------------------------------------------------------------------- exchanges


def _is_a(dest: str) -> str:
    """What a binding's destination is now, for the table: topic, queue, missing or ?."""
    p = Path(dest)
    return _kind_of(p) or ("?" if p.exists() else "missing")


def _header_text(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{n}={v}" for n, v in pairs)


def _fields(kind: str, b: Binding) -> list[str]:
    """The binding's fields that ``kind`` reads, as text (``BINDING_COLUMNS``' order)."""
    return {"direct": [json.dumps(b.routing_key, ensure_ascii=False)],
            "topic": [json.dumps(b.routing_key, ensure_ascii=False)], "fanout": [],
            "headers": [_header_text(b.headers) or "-", b.x_match]}[kind]


def _describe(kind: str, b: Binding) -> str:
    return " ".join([b.destination, *(f"{c} {v}" for c, v in
                                      zip(BINDING_COLUMNS[kind], _fields(kind, b), strict=True))])


@topics.command()
@click.argument("directory")
@click.option("--create", "kind", type=click.Choice(KINDS), default=None,
              help="Create the exchange if DIRECTORY holds none (an existing one must be "
                   "of this kind).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the kind and the bindings (Binding.to_json) as JSON.")
def exchange(directory: str, kind: str | None, as_json: bool) -> None:
    """An exchange's kind and bindings (Exchange(DIRECTORY)); --create KIND creates it."""
    d = Path(directory)
    created = False
    if kind is not None and not (d / EXCHANGE_FILE).exists():
        _own_dir(d, "exchange")
        Exchange(d, kind).close()
        created = True
    d = exchange_dir(directory)
    with Exchange(d) as ex:
        if kind is not None and ex.kind != kind:
            raise CommandError(f"exchange {d} is of kind {ex.kind!r}, not {kind!r} (its kind "
                               "is fixed when it is created)")
        bindings = ex.bindings()
        kind = ex.kind
    if as_json:
        click.echo(json.dumps({"path": str(d), "kind": kind,
                               "bindings": [b.to_json() for b in bindings]},
                              indent=2, ensure_ascii=False))
        return
    out = Console(width=max(100, shutil.get_terminal_size().columns))
    if created:
        out.print(f"created {kind} exchange {escape(str(d))}", highlight=False, soft_wrap=True)
    out.print(f"[bold]{escape(str(d))}[/bold]  {kind} exchange, {len(bindings):,} binding(s)",
              soft_wrap=True)
    if not bindings:
        out.print(f"no bindings (`k7 topics bind {escape(_quoted(d))} DEST` adds one)",
                  highlight=False, soft_wrap=True)
        return
    t = Table("destination", "is a", *BINDING_COLUMNS[kind])
    for b in bindings:
        t.add_row(escape(b.destination), _is_a(b.destination), *map(escape, _fields(kind, b)))
    out.print(t)


def _binding(destination: str, key: str, headers: tuple[tuple[str, str], ...],
             x_match: str) -> Binding:
    """The binding the arguments describe (the destination as an absolute path, as
    ``Exchange.bind`` stores it), or a usage error (exit status 2)."""
    try:
        return Binding(str(Path(destination).resolve()), key, headers, x_match)
    except InvalidBindingError as exc:
        text = str(exc).replace("set Binding.x_match instead of an x-match header",
                                "--x-match sets it")
        raise click.UsageError(text) from None


def _same(a: Binding, b: Binding) -> bool:
    """One binding: the same fields, headers in any order (they match the same records)."""
    return (a.destination, a.routing_key, a.x_match, sorted(a.headers)) == (
        b.destination, b.routing_key, b.x_match, sorted(b.headers))


def _binding_args(f: Any) -> Any:
    for option in reversed([
        click.argument("exchange_path", metavar="EXCHANGE"),
        click.argument("destination", metavar="DEST"),
        click.option("--key", default="", metavar="PATTERN",
                     help="The routing key (direct) or pattern (topic; * one word, # any)."),
        _header,
        click.option("--x-match", "x_match", type=click.Choice(X_MATCH_MODES), default="all",
                     show_default=True, help="How a headers exchange matches the headers."),
    ]):
        f = option(f)
    return f


@topics.command()
@_binding_args
def bind(exchange_path: str, destination: str, key: str,
         headers: tuple[tuple[str, str], ...], x_match: str) -> None:
    """Bind DEST (a topic's or a queue's directory) to EXCHANGE: records that match go
    there (a topic gets the whole record, a queue the value)."""
    x = exchange_dir(exchange_path)
    b = _binding(destination, key, headers, x_match)
    dest = Path(b.destination)
    if not dest.exists():
        raise CommandError(
            f"destination {destination}: no such directory (`k7 topics create "
            f"{_quoted(Path(destination))} --partitions N` creates a topic, `k7 produce "
            f"{_quoted(Path(destination))} --create` a queue)")
    if (dest.parent / META_FILE).is_file():
        raise CommandError(f"destination {destination} is a partition of topic {dest.parent}: "
                           "bind the topic (its partitions hold only records)")
    if _kind_of(dest) not in ("topic", "queue"):
        raise CommandError(f"destination {destination} is neither a k7 topic nor a k7 queue")
    with Exchange(x) as ex:
        kind = ex.kind
        ignored = [flag for flag, given, reads in (
            ("--key", key != "", kind in ("direct", "topic")),
            ("--header", bool(headers), kind == "headers"),
            ("--x-match", x_match != "all", kind == "headers")) if given and not reads]
        there = [old for old in ex.bindings() if _same(old, b)]
        if not there:
            ex.bind(b.destination, key, headers=dict(headers), x_match=x_match)
    for flag in ignored:
        click.echo(f"note: a {kind} exchange ignores {flag}", err=True)
    click.echo(f"{'already bound' if there else 'bound'}: {_describe(kind, b)}")


@topics.command()
@_binding_args
def unbind(exchange_path: str, destination: str, key: str,
           headers: tuple[tuple[str, str], ...], x_match: str) -> None:
    """Remove the binding of DEST to EXCHANGE that these arguments describe (as given to
    bind; headers in any order)."""
    x = exchange_dir(exchange_path)
    want = _binding(destination, key, headers, x_match)
    with Exchange(x) as ex:
        kind = ex.kind
        found = [b for b in ex.bindings() if _same(b, want)]
        if not found:
            raise CommandError(f"exchange {x} has no binding {_describe(kind, want)} "
                               f"(`k7 topics exchange {_quoted(x)}` lists its bindings)")
        ex.unbind(found[0])
    click.echo(f"unbound: {_describe(kind, found[0])}")


__all__ = ["topics"]
