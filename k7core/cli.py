"""The ``k7`` command line (``pip install 'k7py[cli]'``): inspect, verify, tail, produce,
manage groups, repair and benchmark a queue directory; ``k7 jobs`` for a job store's
(``k7core.jobs._cli``).

Exit status: 0 success; 1 ``verify`` found corruption; 2 bad usage or argument; 3 the
operation failed (missing directory, not a queue, locked by a writer, group busy, ...).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ._errors import MissingExtraError

try:
    import click
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table
except ImportError as exc:
    raise SystemExit(f"k7: {MissingExtraError('the command line', 'cli', exc)}") from exc

from k7async.server._cli import serve_command

from ._errors import CursorError, DataLossError, K7Error, StorageError
from ._format import (
    CURSOR_SIZE,
    DEFAULT_SEGMENT_SIZE,
    FRAME_ALIGN,
    cursor_name,
    decode_cursor,
    frame_size,
    segment_name,
)
from ._group import check_cursor
from ._kernel import SCAN_CORRUPT, SCAN_OK, ffi, lib
from ._queue import Queue
from ._shared import writer_live
from ._stats import LAG_COUNT_LIMIT, GroupInfo, SegmentInfo, list_segment_infos, read_cursors
from ._storage import (
    frames_end,
    held_by,
    last_data,
    map_file,
    next_frame,
    open_fd,
    try_lock,
)
from .jobs._cli import jobs as jobs_group
from .outbox._cli import outbox as outbox_group
from .topics._cli import topics as topics_group
from .workers._cli import workers as workers_group

EXIT_CORRUPT = 1
EXIT_ERROR = 3


class CliError(click.ClickException):
    """An operation failed: printed as ``Error: ...`` with exit status 3."""

    exit_code = EXIT_ERROR


def _message(exc: K7Error) -> str:
    """``exc``'s message without its hint."""
    return str(exc).removesuffix(f" ({exc.hint})") if exc.hint else str(exc)


def _cli_text(exc: K7Error, params: Mapping[str, Any]) -> str:
    """``exc``'s message, its hint said in the command line's terms (:func:`_cli_hint`)."""
    if not exc.hint:
        return str(exc)
    return f"{_message(exc)} ({_cli_hint(exc.hint, params)})"


def _cli_hint(hint: str, params: Mapping[str, Any]) -> str:
    """A k7core hint, written for the Python API (``readonly=True``, ``seek(N)``,
    ``segment_size``), with the commands and flags that do the same here. ``params`` are the
    command's: its ``directory`` and ``group`` go into the commands it suggests."""
    d = shlex.quote(str(params.get("directory") or "DIR"))
    group = params.get("group")

    def seek(off: str) -> str:
        if group is None:
            return f"`k7 tail {d} --from {off}`"
        return f"`k7 group {d} seek {shlex.quote(group)} {off}`"

    rules: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
        (r"close the other Queue, or open this one with readonly=True",
         "stop the process that writes to it; `k7 info`, `k7 tail` and `k7 verify` read a "
         "queue while it is written"),
        (r"raise segment_size", "produce into a new queue (--create) with a larger "
                                "--segment-size"),
        (r"a readonly Queue only reads segments, but each of its consumer groups creates and "
         r"writes its cursor file", "`k7 info`, `k7 verify` and `k7 tail` without --group only "
                                    "read; `k7 tail --group` and `k7 group seek` write the "
                                    "group's cursor file"),
        (r"seek\(queue\.earliest\(\)\)", seek("earliest")),
        (r"seek\((\d+)\)|seek to (\d+)", lambda m: seek(m[1] or m[2])),
    ]
    for pattern, repl in rules:
        hint = re.sub(pattern, repl if callable(repl) else lambda _, text=repl: text, hint)
    return hint


def _translated(ctx: click.Context, invoke: Callable[[click.Context], Any]) -> Any:
    """Run a command; a ``K7Error`` becomes a clear message (its hint in the command line's
    terms) and exit status 3."""
    try:
        return invoke(ctx)
    except K7Error as exc:
        params: dict[str, Any] = {}
        c: click.Context | None = ctx
        while c is not None:  # `k7 group DIR seek G N`: DIR is the parent command's
            params, c = {**c.params, **params}, c.parent
        raise CliError(f"{type(exc).__name__}: {_cli_text(exc, params)}") from exc


class _Command(click.Command):
    def invoke(self, ctx: click.Context) -> Any:
        return _translated(ctx, super().invoke)


class _Group(click.Group):
    """Its commands turn every ``K7Error`` into a clear message and exit status 3."""

    command_class = _Command

    def invoke(self, ctx: click.Context) -> Any:
        return _translated(ctx, super().invoke)


def _err() -> Console:
    return Console(stderr=True)


def _queue_dir(path: str, create_hint: str = "") -> Path:
    """``path`` as an existing queue directory, or a CliError that says what is wrong
    (followed by ``create_hint`` when a queue could be created there)."""
    d = Path(path)
    if not d.exists():
        raise CliError(f"{d}: no such directory{create_hint}")
    if not d.is_dir():
        raise CliError(f"{d} is not a directory")
    try:
        segs = list_segment_infos(d)
    except PermissionError as exc:
        raise CliError(f"{d}: {exc.strerror}") from exc
    if not segs:
        raise CliError(f"{d} is not a k7 queue (it holds no seg-*.k7 file){create_hint}")
    return d


def _segment_size(segs: list[SegmentInfo]) -> int:
    """The segment size of an existing queue: its largest segment file (new segments match)."""
    size = max((s.size for s in segs), default=DEFAULT_SEGMENT_SIZE)
    return size if size >= 64 and size % FRAME_ALIGN == 0 else DEFAULT_SEGMENT_SIZE


def _writer(d: Path, **kw: Any) -> Queue:
    return Queue(d, segment_size=_segment_size(list_segment_infos(d)), **kw)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="k7py", prog_name="k7")
def cli() -> None:
    """Operate k7 queue directories (and job stores: k7 jobs)."""


cli.add_command(jobs_group)  # under cli: its K7Error translation covers the jobs commands
cli.add_command(outbox_group)
cli.add_command(serve_command)
cli.add_command(topics_group)  # and the topics commands
cli.add_command(workers_group)  # and the workers commands


# ---------------------------------------------------------------------------------- info


@cli.command()
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help="Print the stats as JSON.")
def info(directory: str, as_json: bool) -> None:
    """Segments, sizes, offsets and groups (with lag) of a queue."""
    d = _queue_dir(directory)
    with Queue(d, readonly=True) as q:
        st = q.stats()
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(st), indent=2))
        return
    out = Console(width=max(100, shutil.get_terminal_size().columns))
    shared = f" (shared: pids {', '.join(map(str, st.writer_pids))})" if st.writer_pids else ""
    out.print(f"[bold]{escape(str(d))}[/bold]  writer {'open' if st.writer_active else 'closed'}"
              f"{shared}")
    head = Table("earliest", "next offset", "log bytes", "segments", "on disk", box=None)
    head.add_row(str(st.earliest_offset), str(st.next_offset),
                 f"{st.next_offset - st.earliest_offset:,}", f"{st.segment_count:,}",
                 _human(st.disk_bytes))
    out.print(head)
    segs = Table("segment", "base", "data bytes", "file size", title="segments")
    for i, s in enumerate(st.segments):
        end = st.segments[i + 1].base if i + 1 < len(st.segments) else max(st.next_offset, s.base)
        segs.add_row(segment_name(s.base), str(s.base), f"{end - s.base:,}", _human(s.size))
    out.print(segs)
    _print_groups(out, st.groups, title="groups")


def _print_groups(out: Console, groups: Sequence[GroupInfo], title: str | None = None) -> None:
    """The groups table of ``info`` and ``group list``: offsets as they are (to paste into
    ``--from`` or ``seek``), counts with thousands separators, a note under a ``?``."""
    if not groups:
        out.print("no consumer groups")
        return
    t = Table("group", "committed", "lag bytes", "lag messages", "owner", title=title)
    for g in groups:
        t.add_row(escape(g.name), str(g.committed), f"{g.lag_bytes:,}",
                  "?" if g.lag_messages is None else f"{g.lag_messages:,}",
                  "yes" if g.owned else "-")
    out.print(t)
    if any(g.lag_messages is None for g in groups):
        out.print(f"?: lag messages not counted: they are counted (a scan of their frames) "
                  f"only when the lag is at most {_human(LAG_COUNT_LIMIT)} "
                  f"({LAG_COUNT_LIMIT:,} bytes) and its frames can be read; the lag in bytes "
                  "is exact", highlight=False)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


# ---------------------------------------------------------------------------------- verify


@dataclasses.dataclass
class _Problem:
    kind: str  # "corrupt-frame" | "missing-data" | "short-segment" | "torn-tail" | "beyond-seal"
    segment: int
    offset: int
    nbytes: int | None = None

    def describe(self) -> str:
        where = f"{segment_name(self.segment)} offset {self.offset} " \
                f"(position {self.offset - self.segment})"
        if self.kind == "corrupt-frame":
            return f"corrupt frame: {where}"
        if self.kind == "missing-data":
            return f"no frame where the sealed segment has data: {where}"
        if self.kind == "short-segment":
            return (f"segment file too short: {segment_name(self.segment)} ends at position "
                    f"{self.offset - self.segment}, before its seal point {self.nbytes}")
        if self.kind == "beyond-seal":
            return (f"note: {segment_name(self.segment)} holds {self.nbytes:,} bytes after its "
                    f"sealed end (position {self.offset - self.segment}, where the next "
                    "segment starts): not part of the log and never read (a writer's "
                    "recovery, such as k7's on the JVM, leaves them)")
        return (f"torn tail: {where}, {self.nbytes:,} bytes after the last valid frame "
                "(a writer's open cuts it; `k7 repair` does it now)")

    @property
    def harmful(self) -> bool:
        return self.kind != "beyond-seal"


def _verify_segment(
    path: Path, base: int, limit: int | None, advance: Any, problems: list[_Problem]
) -> int:
    """CRC-check every frame of one segment (``limit``: where a sealed segment was sealed,
    i.e. where its data must end; None for the last one). Returns the valid frames."""
    m = map_file(path, writable=False)
    if m is None:
        if limit:
            problems.append(_Problem("short-segment", base, base, limit))
        return 0
    chunk = 65536
    starts, lens = ffi.new("int64_t[]", chunk), ffi.new("int64_t[]", chunk)
    nxt, status = ffi.new("int64_t *"), ffi.new("int32_t *")
    size = m.size
    end = size if limit is None else min(limit, size)
    pos = frames = 0
    try:
        while pos < end:
            frames += int(lib.k7_scan(m.ptr, size, pos, end, chunk, starts, lens, nxt, status))
            advance(int(nxt[0]) - pos)
            pos = int(nxt[0])
            st = int(status[0])
            if st == SCAN_OK:
                continue  # the seal point, or a full chunk
            if limit is None:
                break  # the end of the written data, or a torn tail (checked below)
            # a sealed segment's frames run up to its seal point without a break
            kind = "corrupt-frame" if st == SCAN_CORRUPT else "missing-data"
            problems.append(_Problem(kind, base, base + pos))
            resync = next_frame(m, pos + FRAME_ALIGN, end)
            advance(resync - pos)
            pos = resync
        if limit is None:
            last = last_data(m.ptr, path, pos, size)
            if last > pos:
                problems.append(_Problem("torn-tail", base, base + pos, last - pos))
        elif size < limit:
            problems.append(_Problem("short-segment", base, base + size, limit))
        else:
            stale = last_data(m.ptr, path, limit, size)
            if stale > limit:
                problems.append(_Problem("beyond-seal", base, base + limit, stale - limit))
        advance(max(0, size - pos))
    finally:
        m.close()
    return frames


@cli.command()
@click.argument("directory")
def verify(directory: str) -> None:
    """CRC-check every frame; report corrupt frames and the torn tail. Never writes.

    Exit status 0 when clean, 1 when anything is corrupt or torn. A writer that is
    appending while this runs may show an in-progress frame as a torn tail.
    """
    d = _queue_dir(directory)
    segs = list_segment_infos(d)
    problems: list[_Problem] = []
    frames = 0
    console = _err()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("verifying", total=sum(s.size for s in segs))

        def advance(n: int) -> None:
            progress.advance(task, n)

        for i, s in enumerate(segs):
            progress.update(task, description=segment_name(s.base))
            limit = segs[i + 1].base - s.base if i + 1 < len(segs) else None
            try:
                frames += _verify_segment(d / segment_name(s.base), s.base, limit, advance,
                                          problems)
            except StorageError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                continue  # deleted by retention while we were verifying
    cursor_errors = _verify_cursors(d, segs)
    for p in problems:
        click.echo(p.describe())
    for err in cursor_errors:
        click.echo(f"bad cursor: {err}")
    problems = [p for p in problems if p.harmful]
    if problems or cursor_errors:
        click.echo(f"{len(problems):,} problem(s) in {len(segs):,} segment(s); "
                   f"{frames:,} valid frames; {len(cursor_errors):,} bad cursor(s)")
        sys.exit(EXIT_CORRUPT)
    click.echo(f"ok: {frames:,} frames in {len(segs):,} segment(s), every CRC32C matches; "
               "every cursor is a frame boundary")


def _verify_cursors(d: Path, segs: list[SegmentInfo]) -> list[str]:
    """Each group's stored cursor must be a frame boundary of the log (or lie before it):
    what is wrong with each that is not."""
    end = segs[-1].base + frames_end(d / segment_name(segs[-1].base)) if segs else 0
    out = []
    for name, committed in read_cursors(d):
        err = check_cursor(d, name, committed, end)
        if err is not None:
            out.append(_cli_text(err, {"directory": d, "group": name}))
    return out


# ---------------------------------------------------------------------------------- tail


def _emit(out: IO[bytes], fmt: str, offsets: bool, offset: int, payload: memoryview) -> None:
    if fmt == "raw":
        out.write(payload)
        return
    if fmt == "json":
        data = bytes(payload)
        rec: dict[str, Any] = {"offset": offset}
        try:
            rec["payload"] = data.decode("utf-8")
        except UnicodeDecodeError:
            rec["payload_base64"] = base64.b64encode(data).decode()
        out.write(json.dumps(rec).encode() + b"\n")
        return
    text = bytes(payload).hex().encode() if fmt == "hex" else bytes(payload)
    out.write((b"%d\t" % offset if offsets else b"") + text + b"\n")


def _start_offset(q: Queue, value: str, param: str = "--from") -> int:
    if value == "earliest":
        return q.earliest()
    if value == "latest":
        return q.end
    try:
        off = int(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not 'earliest', 'latest' or an offset", param_hint=param
        ) from None
    if off < 0:
        raise click.BadParameter("an offset is >= 0", param_hint=param)
    return off


def _tail_start(q: Queue, value: str) -> int:
    """``--from``: an offset past the end of the log is refused, also with ``--follow`` (it
    is no frame boundary that the log could reach)."""
    off = _start_offset(q, value)
    if off > q.end:
        raise click.BadParameter(
            f"offset {off} is past the end of the log ({q.end}), so there is nothing to print; "
            "`--from latest --follow` waits for new messages", param_hint="--from")
    return off


def _skip_lost(exc: DataLossError) -> int:
    """Say that retention deleted what was to be read; the offset to go on from."""
    _err().print(f"[yellow]warning:[/yellow] {escape(_message(exc))}; "
                 f"jumping to {exc.earliest}")
    return exc.earliest


@cli.command()
@click.argument("directory")
@click.option("--group", "-g", help="Read as this consumer group, acking what is printed.")
@click.option("--from", "start", metavar="earliest|latest|OFFSET",
              help="Where to start (default: earliest; with --group, the group's cursor).")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new messages.")
@click.option("--format", "fmt", type=click.Choice(["utf8", "hex", "json", "raw"]),
              default="utf8", show_default=True)
@click.option("--offsets", is_flag=True, help="Prefix utf8 / hex lines with the offset.")
@click.option("--max", "max_n", type=click.IntRange(min=1), help="Stop after N messages.")
def tail(directory: str, group: str | None, start: str | None, follow: bool, fmt: str,
         offsets: bool, max_n: int | None) -> None:
    """Print messages, one per line (``raw``: the bytes as they are)."""
    d = _queue_dir(directory)
    out = sys.stdout.buffer
    left = max_n if max_n is not None else -1
    try:
        with Queue(d, readonly=True) as q:
            first = None if start is None else _tail_start(q, start)
            if group is not None:
                with q.consumer_group(group) as g:
                    if first is not None:
                        g.seek(first)
                    while left:
                        try:
                            msgs = g.poll(max_batch=256 if left < 0 else min(256, left),
                                          timeout=0.2 if follow else 0)
                        except DataLossError as exc:
                            g.seek(_skip_lost(exc))
                            continue
                        if not msgs:
                            if not follow:
                                break
                            continue
                        for m in msgs:
                            _emit(out, fmt, offsets, m.offset, m.payload)
                        out.flush()
                        g.ack_many(msgs)
                        left -= len(msgs) if left > 0 else 0
                return
            pos = q.earliest() if first is None else first
            while left:
                try:
                    batch = q.read_columnar(pos, 4096 if left < 0 else min(4096, left))
                except DataLossError as exc:
                    pos = _skip_lost(exc)
                    continue
                if not len(batch):
                    if not follow:
                        break
                    q.wait(pos, 0.2)
                    continue
                for i in range(len(batch)):
                    _emit(out, fmt, offsets, batch.offsets[i], batch.payload(i))
                out.flush()
                pos = batch.next
                left -= len(batch) if left > 0 else 0
    except BrokenPipeError:  # `k7 tail DIR | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        pass


# ---------------------------------------------------------------------------------- produce


def _records(stream: IO[bytes], sep: bytes) -> Iterator[bytes]:
    rest = b""
    while chunk := stream.read(1 << 20):
        parts = (rest + chunk).split(sep)
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


@cli.command()
@click.argument("directory")
@click.option("--null", "-0", "null", is_flag=True, help="Messages are NUL-separated.")
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Messages per enqueue_many call.")
@click.option("--create", is_flag=True, help="Create the queue if the directory is not one.")
@click.option("--segment-size", type=click.IntRange(min=64), default=None,
              help="Segment size in bytes for a new queue (default 256 MiB).")
@click.option("--fsync", type=click.Choice(["flush", "async", "sync"]), default="async",
              show_default=True)
def produce(directory: str, null: bool, batch: int, create: bool, segment_size: int | None,
            fsync: str) -> None:
    """Append one message per line of standard input (or per NUL-separated record)."""
    if create and not (Path(directory).is_dir() and list_segment_infos(Path(directory))):
        if Path(directory).exists() and not Path(directory).is_dir():
            raise CliError(f"{directory} is not a directory")
        if segment_size is not None and segment_size % FRAME_ALIGN:
            raise click.BadParameter(f"a multiple of {FRAME_ALIGN}", param_hint="--segment-size")
        q = Queue(directory, segment_size=segment_size or DEFAULT_SEGMENT_SIZE, fsync=fsync)
    else:
        q = _writer(_queue_dir(directory, "; add --create to create a new queue there"),
                    fsync=fsync)
    n, first, last = 0, -1, -1
    with q:
        pending: list[bytes] = []
        for rec in _records(sys.stdin.buffer, b"\0" if null else b"\n"):
            pending.append(rec)
            if len(pending) >= batch:
                offs = q.enqueue_many(pending)
                first = offs[0] if first < 0 else first
                last, n, pending = offs[-1], n + len(offs), []
        if pending:
            offs = q.enqueue_many(pending)
            first = offs[0] if first < 0 else first
            last, n = offs[-1], n + len(offs)
    where = f" (offsets {first}..{last})" if n else ""
    _err().print(f"produced {n:,} message(s){where}")


# ---------------------------------------------------------------------------------- group


@cli.group("group", cls=_Group)
@click.argument("directory")
@click.pass_context
def group_cmd(ctx: click.Context, directory: str) -> None:
    """Consumer groups: list, seek, delete."""
    ctx.obj = _queue_dir(directory)


def _existing_group(d: Path, name: str) -> Path:
    path = d / cursor_name(name)
    if "/" in name or not path.is_file():
        raise CliError(f"{d} has no consumer group {name!r}")
    return path


@group_cmd.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def group_list(d: Path, as_json: bool) -> None:
    """Every group: committed offset, lag, whether a consumer owns it now."""
    with Queue(d, readonly=True) as q:
        groups = q.stats().groups
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(g) for g in groups], indent=2))
        return
    _print_groups(Console(width=100), groups)


@group_cmd.command("seek", context_settings={"ignore_unknown_options": True})  # -8: an offset
@click.argument("group")
@click.argument("target", metavar="OFFSET|earliest|latest")
@click.pass_obj
def group_seek(d: Path, group: str, target: str) -> None:
    """Move GROUP's committed cursor (the group must not be owned by a running consumer)."""
    _existing_group(d, group)
    with Queue(d, readonly=True) as q:
        off = _start_offset(q, target, "OFFSET")
        with q.consumer_group(group, cursor_fsync="sync") as g:
            before = g.committed
            try:
                g.seek(off)  # checks the offset as the library does
            except CursorError as exc:
                text = _cli_text(exc, {"directory": str(d), "group": group})
                raise click.BadParameter(text, param_hint="OFFSET") from None
        earliest = q.earliest()
    click.echo(f"group {group!r}: committed {before} -> {off}")
    if off < earliest:
        _err().print(f"[yellow]note:[/yellow] {off} is before the earliest offset {earliest} "
                     "(deleted by retention): the group's next poll reports DataLossError, "
                     f"or jumps to {earliest} with on_data_loss='earliest'")


@group_cmd.command("delete")
@click.argument("group")
@click.pass_obj
def group_delete(d: Path, group: str) -> None:
    """Delete GROUP's cursor file (refused while a consumer owns it)."""
    path = _existing_group(d, group)
    fd = open_fd(path, os.O_RDWR)
    try:
        if not try_lock(fd):
            raise CliError(f"group {group!r} is owned by a running consumer "
                           f"({held_by(path)}); close it first")
        committed = decode_cursor(os.pread(fd, CURSOR_SIZE, 0))
        os.unlink(path)
    finally:
        os.close(fd)
    click.echo(f"deleted group {group!r} (it had committed {committed})")


# ---------------------------------------------------------------------------------- repair


@cli.command()
@click.argument("directory")
def repair(directory: str) -> None:
    """Cut a torn tail now (the bytes go to a k7py-torn-*.bin side file) and say what was done.

    This is the recovery a writer runs when it opens the queue; it needs the writer lock.
    """
    d = _queue_dir(directory)
    if writer_live(d):
        raise CliError(f"{d} is open by a writer, whose open already repaired it; "
                       "stop the writer to repair")
    log = logging.getLogger("k7core")
    quiet = logging.NullHandler()  # the events are reported below, not logged twice
    log.addHandler(quiet)
    try:
        with _writer(d, fsync="sync") as q:
            events = q.stats().recovery_events
    finally:
        log.removeHandler(quiet)
    if not events:
        click.echo("nothing to repair: the last segment ends with a valid frame")
        return
    for ev in events:
        if ev.kind == "torn-tail-cut":
            click.echo(f"cut the torn tail of {segment_name(ev.segment)} at offset {ev.offset}: "
                       f"{ev.nbytes:,} bytes saved to {ev.side_file} and zeroed")
        else:
            click.echo(f"re-created the short last segment {segment_name(ev.segment)} "
                       f"({ev.nbytes:,} bytes) as an empty segment")


# ---------------------------------------------------------------------------------- bench


@cli.command()
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Total duration.")
@click.option("--size", type=click.IntRange(0, 1 << 20), default=32, show_default=True,
              help="Payload bytes.")
@click.option("--fsync", type=click.Choice(["flush", "async", "sync"]), default="flush",
              show_default=True)
@click.option("--dir", "where", type=click.Path(exists=True, file_okay=False), default=None,
              help="Where to put the temporary queue (default: the system temp directory).")
@click.option("--json", "as_json", is_flag=True)
def bench(seconds: float, size: int, fsync: str, where: str | None, as_json: bool) -> None:
    """A quick measurement of this machine: enqueue, enqueue_many and poll+ack."""
    payload = b"x" * size
    cap = 512 << 20  # bytes of log at most, whatever the speed
    rows: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="k7-bench-", dir=where)
    try:
        with Queue(tmp, segment_size=64 << 20, fsync=fsync) as q:
            rows.append(_timed("enqueue", seconds * 0.4, size, cap // 2,
                               lambda: [q.enqueue(payload) for _ in range(1000)]))
            batch = [payload] * 256
            rows.append(_timed("enqueue_many(256)", seconds * 0.2, size, cap // 2,
                               lambda: q.enqueue_many(batch)))
            q.sync()
            with q.consumer_group("bench") as g:

                def poll_ack() -> list[Any]:
                    msgs = g.poll(max_batch=256, timeout=0)
                    g.ack_many(msgs)
                    return msgs

                rows.append(_timed("poll+ack(256)", seconds * 0.4, size, cap, poll_ack))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    t = Table("operation", "messages", "seconds", "msg/s", "MB/s",
              title=f"k7 bench: {size}-byte payloads, fsync={fsync}")
    for r in rows:
        t.add_row(r["operation"], f"{r['messages']:,}", f"{r['seconds']:.2f}",
                  f"{r['per_second']:,.0f}", f"{r['mb_per_second']:.1f}")
    Console().print(t)


def _timed(name: str, seconds: float, size: int, max_bytes: int, step: Any) -> dict[str, Any]:
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    frame = frame_size(size)
    while time.perf_counter() < deadline and n * frame < max_bytes:
        got = len(step())
        if not got:
            break
        n += got
    dt = max(time.perf_counter() - t0, 1e-9)
    return {"operation": name, "messages": n, "seconds": dt, "per_second": n / dt,
            "mb_per_second": n * size / dt / 1e6}


def main() -> None:
    """Entry point of the ``k7`` console script and ``python -m k7core``."""
    try:
        cli(prog_name="k7")
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            sys.exit(0)
        raise


__all__ = ["cli", "main"]
