"""``k7 jobs``: look into a job store's directory and act on its jobs from the command line.

``stats``, ``peek`` and ``errors`` only read: they open the journal read-only and rebuild the
state from the newest snapshot plus the journal after it (as an open does), so they work next
to the process that owns the store, take no lock and write nothing. Reservations are not
journaled, so jobs that the running store has reserved show as ready there.

``kick``, ``kick-job`` and ``delete`` change the store: they open it (a :class:`JobStore`,
``fsync="sync"``) and so need its lock, which the process that owns a live store holds.

``k7core.cli`` adds the ``jobs`` group to ``k7``; its ``K7Error`` translation covers these
commands (``Error: <Type>: message (hint)``, exit status 3).
"""

from __future__ import annotations

import base64
import errno
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .._errors import CorruptFrameError, DataLossError, QueueLockedError, StorageError
from .._queue import Queue
from .._stats import list_segment_infos
from ._errors import CorruptJobDataError, InvalidJobError, JobNotFoundError
from ._files import JOURNAL, journal_holder
from ._machine import Job, JobMachine, JobState, check_tube
from ._store import JobStore, State, load_state, overview

EXIT_ERROR = 3
READ_ATTEMPTS = 5
"""Reads of a live store's directory retried when a background snapshot or journal trim
deleted a file between listing it and reading it."""
LOCKED_HINT = (
    "stop the process that owns the store to change it there, or, if that process serves "
    "the store over the beanstalkd protocol, send the command through its server; "
    "`k7 jobs stats`, `peek` and `errors` read a store while it is open"
)
STATES = ("ready", "urgent", "reserved", "delayed", "buried", "waiting")
"""The per-tube counts of ``stats``, in its columns' order (urgent: ready, priority < 1024)."""


class CommandError(click.ClickException):
    """The operation failed: printed as ``Error: ...`` with exit status 3."""

    exit_code = EXIT_ERROR


# ---------------------------------------------------------------------------------- reading


def store_dir(path: str) -> Path:
    """``path`` as an existing job store's directory, or a CommandError that says what is
    wrong. Checked before anything opens it: a read-only open of a directory that is no
    store would create files there, and a JobStore would create a new store."""
    d = Path(path)
    if not d.exists():
        raise CommandError(f"{d}: no such directory")
    if not d.is_dir():
        raise CommandError(f"{d} is not a directory")
    journal = d / JOURNAL
    try:
        found = journal.is_dir() and not journal.is_symlink() and bool(
            list_segment_infos(journal))
    except PermissionError as exc:
        raise CommandError(f"{journal}: {exc.strerror}") from exc
    if not found:
        raise CommandError(f"{d} is not a k7 job store (it holds no {JOURNAL}/ directory "
                           "with seg-*.k7 files)")
    return d


@dataclass
class _Look:
    """What a read of a store's directory found."""

    state: State
    now: float
    open: bool
    """A process holds the store (its journal's writer lock)."""
    journal_earliest: int
    journal_end: int
    journal_segments: int
    disk_bytes: int


def _raced(exc: Exception) -> bool:
    """A file listed a moment ago was deleted (by the owner's snapshotter or trim)."""
    return isinstance(exc, DataLossError) or (
        isinstance(exc, StorageError) and exc.errno == errno.ENOENT)


def read_store(d: Path) -> _Look:
    """Rebuild the store's state from its directory without a lock and without writing."""
    for attempt in range(READ_ATTEMPTS):
        try:
            with Queue(d / JOURNAL, readonly=True) as journal:
                state = load_state(d, journal)
                st = journal.stats()
            break
        except CorruptFrameError as exc:
            raise CorruptJobDataError(
                f"the journal of {d} has a corrupt frame at offset {exc.offset}",
                path=d / JOURNAL, offset=exc.offset,
                hint=f"`k7 verify {d / JOURNAL}` lists the damage; restore the store's "
                     f"directory from a backup, or, if the damage lies in the journal's "
                     f"last segment, `k7 jobs repair {d}` drops the records from it on",
            ) from exc
        except (DataLossError, StorageError) as exc:
            if not _raced(exc) or attempt == READ_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    # snapshots that vanished while being read (a newer one replaced them) were not damaged
    state.skipped = [(p, why) for p, why in state.skipped if p.exists()]
    now = time.time()
    state.machine.advance(now)  # delays that ran out: ready, as the live store has them
    return _Look(state, now, st.writer_active, st.earliest_offset, st.next_offset,
                 st.segment_count, st.disk_bytes + _snapshot_bytes(d))


def _snapshot_bytes(d: Path) -> int:
    total = 0
    for p in d.glob("snapshot-*.k7jobs"):
        try:
            total += p.stat().st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def tube_arg(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A tube name as beanstalkd allows it, else a usage error (exit status 2)."""
    if value is None:
        return None
    try:
        return check_tube(value)
    except InvalidJobError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _not_found(job_id: int, d: Path) -> JobNotFoundError:
    return JobNotFoundError(f"job {job_id} not found in {d}", job_id=job_id,
                            hint="it was deleted, or never existed; `k7 jobs stats` shows "
                                 "the tubes, `k7 jobs peek --ready TUBE` a job of one")


def _job_fields(machine: JobMachine, job: Job, now: float) -> dict[str, Any]:
    """beanstalkd's stats-job fields of ``job``, then its key, dependencies and errors."""
    return {**machine.job_stats(job.id, now), "key": job.key,
            "depends_on": list(job.depends_on), "errors": list(job.errors)}


def body_json(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode()}


def error_lines(errors: Iterable[str]) -> list[str]:
    """Error texts as indented list items, their further lines (a traceback) under them."""
    return ["  - " + e.rstrip("\n").replace("\n", "\n    ") for e in errors]


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                      ("min", 60, "s", 1)):
        if s >= size:
            return f"{s // size} {unit} {s % size // sub_size} {sub}"
    return f"{s} s"


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


# ---------------------------------------------------------------------------------- group


@click.group("jobs")
def jobs() -> None:
    """Job stores (k7core.jobs): stats, peek, errors, kick, delete.

    stats, peek and errors only read, next to the process that owns the store; kick,
    kick-job and delete open the store, so it must not be open elsewhere.
    """


# ---------------------------------------------------------------------------------- stats


@jobs.command()
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def stats(directory: str, as_json: bool) -> None:
    """Live jobs per tube by state, the age of each tube's oldest ready job, and the
    store's journal and snapshot. Reads only."""
    d = store_dir(directory)
    look = read_store(d)
    machine, now = look.state.machine, look.now
    tubes: dict[str, dict[str, Any]] = {}
    for name, ov in overview(machine, now).items():
        urgent = machine.tube_stats(name, now)["current-jobs-urgent"]
        tubes[name] = {"ready": ov.ready, "urgent": urgent, "reserved": ov.reserved,
                       "delayed": ov.delayed, "buried": ov.buried, "waiting": ov.waiting,
                       "oldest_ready_age": ov.oldest_ready_age}
    totals = {k: sum(int(t[k]) for t in tubes.values()) for k in STATES}
    covered = look.state.covered
    report: dict[str, Any] = {
        "path": str(d),
        "open": look.open,
        "jobs": len(machine),
        "totals": totals,
        "tubes": tubes,
        "journal": {"earliest_offset": look.journal_earliest, "next_offset": look.journal_end,
                    "segments": look.journal_segments},
        "snapshot": ({"covers_offset": covered, "bytes": look.state.snapshot_size}
                     if covered else None),
        "skipped_snapshots": [{"file": p.name, "reason": why}
                              for p, why in look.state.skipped],
        "disk_bytes": look.disk_bytes,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    out = Console(width=max(100, shutil.get_terminal_size().columns))
    out.print(f"[bold]{escape(str(d))}[/bold]  store "
              f"{'open (by another process)' if look.open else 'closed'}")
    head = Table("jobs", "tubes", "journal", "snapshot at", "on disk", box=None)
    head.add_row(f"{len(machine):,}", f"{len(tubes):,}",
                 f"{look.journal_earliest}..{look.journal_end}",
                 "-" if not covered else f"{covered} ({_human(look.state.snapshot_size)})",
                 _human(look.disk_bytes))
    out.print(head)
    if not tubes:
        out.print("no tubes (the store holds no job)")
    else:
        t = Table(title="tubes", show_footer=True)
        t.add_column("tube", footer="all tubes")
        for k in STATES:
            t.add_column(k, footer=f"{totals[k]:,}", justify="right")
        t.add_column("oldest ready", justify="right")
        for name, row in tubes.items():
            t.add_row(escape(name), *(f"{row[k]:,}" for k in STATES),
                      human_age(row["oldest_ready_age"]))
        out.print(t)
    if look.open:
        out.print("reserved: not journaled, so jobs reserved in the running store count as "
                  "ready here", highlight=False)
    for p, why in look.state.skipped:
        out.print(f"[yellow]note:[/yellow] snapshot {escape(p.name)} could not be read "
                  f"({escape(why)}); an older one and more of the journal were used")


# ---------------------------------------------------------------------------------- peek


def _emit_job(machine: JobMachine, job: Job, now: float, fmt: str) -> None:
    fields = _job_fields(machine, job, now)
    if fmt == "json":
        click.echo(json.dumps({**fields, **body_json(job.body)}, indent=2))
        return
    lines = [f"{k}: {v}" for k, v in fields.items() if k not in ("key", "depends_on", "errors")]
    if job.key is not None:
        lines.append(f"key: {job.key}")
    if job.depends_on:
        lines.append("depends-on: " + ", ".join(map(str, job.depends_on)))
    if job.errors:
        lines.append(f"errors: {len(job.errors)} (newest last)")
        lines += error_lines(job.errors)
    lines.append(f"body: {len(job.body):,} bytes")
    out = sys.stdout.buffer
    if fmt == "raw":  # the body's bytes alone on stdout (to redirect to a file)
        click.echo("\n".join(lines), err=True)
        out.write(job.body)
    else:
        out.write(("\n".join(lines) + "\n").encode())
        out.write((job.body.hex().encode() if fmt == "hex" else job.body) + b"\n")
    out.flush()


@jobs.command()
@click.argument("directory")
@click.argument("job_id", metavar="[ID]", required=False, type=click.IntRange(min=1))
@click.option("--ready", metavar="TUBE", callback=tube_arg,
              help="The job a reserve would take next from TUBE.")
@click.option("--delayed", metavar="TUBE", callback=tube_arg,
              help="The delayed job of TUBE due first.")
@click.option("--buried", metavar="TUBE", callback=tube_arg,
              help="The buried job of TUBE that a kick would move first.")
@click.option("--format", "fmt", type=click.Choice(["utf8", "hex", "json", "raw"]),
              default="utf8", show_default=True,
              help="The body as text, in hex, everything as JSON, or the body's bytes alone "
                   "(raw: the fields go to standard error).")
def peek(directory: str, job_id: int | None, ready: str | None, delayed: str | None,
         buried: str | None, fmt: str) -> None:
    """A job's stats-job fields, key, dependencies, errors and body: job ID, or the next
    job of a tube (--ready, --delayed, --buried TUBE). Reads only."""
    chosen = [x for x in (job_id, ready, delayed, buried) if x is not None]
    if len(chosen) != 1:
        raise click.UsageError("give a job ID, or one of --ready, --delayed, --buried TUBE")
    d = store_dir(directory)
    look = read_store(d)
    machine = look.state.machine
    how: tuple[str, Callable[[str], Job | None], str] | None = None
    if ready is not None:
        how = ("ready", machine.peek_ready, ready)
    elif delayed is not None:
        how = ("delayed", machine.peek_delayed, delayed)
    elif buried is not None:
        how = ("buried", machine.peek_buried, buried)
    if how is None:
        assert job_id is not None
        job = machine.peek(job_id)
        if job is None:
            raise _not_found(job_id, d)
    else:
        state, find, tube = how
        job = find(tube)
        if job is None:
            raise CommandError(f"tube {tube!r} of {d} has no {state} job")
    _emit_job(machine, job, look.now, fmt)


# ---------------------------------------------------------------------------------- errors


@jobs.command()
@click.argument("directory")
@click.argument("tube", callback=tube_arg)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def errors(directory: str, tube: str, as_json: bool) -> None:
    """The buried jobs of TUBE (buried longest ago first) with their error texts (newest
    last). Reads only."""
    d = store_dir(directory)
    look = read_store(d)
    machine, now = look.state.machine, look.now
    found = machine.errors(tube)
    if as_json:
        click.echo(json.dumps([_job_fields(machine, j, now) for j in found], indent=2))
        return
    echo_buried(tube, [(
        f"job {j.id}  pri {j.priority}  age {human_age(now - j.created_at)}  "
        f"reserves {j.reserves}  releases {j.releases}  buries {j.buries}  kicks {j.kicks}"
        + ("" if j.key is None else f"  key {j.key}"), [], j.errors) for j in found])


def echo_buried(tube: str, jobs: Sequence[tuple[str, Sequence[str], Sequence[str]]]) -> None:
    """The text of ``errors`` (here and in ``k7 workers``): for each buried job of ``tube``
    its heading, its detail lines and its error texts, then how many."""
    if not jobs:
        click.echo(f"no buried job in tube {tube!r}")
        return
    lines = []
    for heading, details, texts in jobs:
        lines += [heading, *details, *(error_lines(texts) if texts else ["  (no error text)"])]
    lines.append(f"{len(jobs):,} buried job(s) in tube {tube!r}")
    click.echo("\n".join(lines))


# ---------------------------------------------------------------------------------- writes


def open_store(directory: str, hint: str = LOCKED_HINT, *, repair: bool = False) -> JobStore:
    """The store, opened to change it; a QueueLockedError with ``hint`` if a process owns
    it."""
    d = store_dir(directory)
    try:
        return JobStore(d, fsync="sync", repair=repair)
    except QueueLockedError as exc:
        pid = journal_holder(d)
        raise QueueLockedError(f"job store {d} is open in "
                               + (f"process {pid}" if pid else "another process"), path=d,
                               hint=hint) from exc


@jobs.command(context_settings={"ignore_unknown_options": True})  # N = -1: out of range
@click.argument("directory")
@click.argument("tube", callback=tube_arg)
@click.argument("bound", metavar="N", type=click.IntRange(min=0))
def kick(directory: str, tube: str, bound: int) -> None:
    """Move up to N jobs of TUBE to ready: its buried jobs (buried longest ago first) if it
    has any, else its delayed ones (due first). Needs the store's lock."""
    with open_store(directory) as store:
        kind = "buried" if store.tube_stats(tube)["current-jobs-buried"] else "delayed"
        n = store.kick(tube, bound)
    click.echo(f"kicked {n:,} {kind} job(s) of tube {tube!r} to ready")


@jobs.command("kick-job")
@click.argument("directory")
@click.argument("job_id", metavar="ID", type=click.IntRange(min=1))
def kick_job(directory: str, job_id: int) -> None:
    """Move job ID (buried or delayed) to ready. Needs the store's lock."""
    with open_store(directory) as store:
        job = store.peek(job_id)
        if job is None:
            raise _not_found(job_id, store.path)
        if job.state not in (JobState.BURIED, JobState.DELAYED):
            raise CommandError(f"job {job_id} is {job.state.value}: only a buried or delayed "
                               "job can be kicked")
        store.kick_job(job_id)
    click.echo(f"kicked job {job_id} ({job.state.value}, tube {job.tube!r}) to ready")


@jobs.command()
@click.argument("directory")
@click.argument("job_ids", metavar="ID...", nargs=-1, required=True,
                type=click.IntRange(min=1))
def delete(directory: str, job_ids: tuple[int, ...]) -> None:
    """Delete jobs (any state: the store's owner is not running, so none is reserved).
    All or nothing: if one ID is no live job, none is deleted. Needs the store's lock."""
    with open_store(directory) as store:
        found = {i: store.peek(i) for i in dict.fromkeys(job_ids)}
        missing = [i for i, job in found.items() if job is None]
        if missing:
            raise JobNotFoundError(
                f"no live job {', '.join(map(str, missing))} in {store.path}: nothing deleted",
                job_id=missing[0], hint="`k7 jobs stats` and `k7 jobs peek` show what is there")
        for job_id, job in found.items():
            store.delete(job_id)
            assert job is not None
            click.echo(f"deleted job {job_id} ({job.state.value}, tube {job.tube!r})")



@jobs.command()
@click.argument("directory")
def repair(directory: str) -> None:
    """Open a store whose journal lost records it had written (JournalDamagedError: a
    damaged frame with valid ones after it, or a journal that ends before its snapshot)
    anyway: keep what can be read, move the next job id past every id handed out, and say
    what was done. Opening an undamaged store changes nothing. Needs the store's lock."""
    with open_store(directory, repair=True) as store:
        events, live = store.recovery_events, len(store)
    for e in events:
        saved = f", saved to {e.side_file}" if e.side_file else ""
        click.echo(f"{e.kind}: {e.nbytes:,} bytes from journal offset {e.offset:,}{saved}")
    click.echo(f"{live:,} live job(s); the next job id is past every id handed out")


__all__ = ["jobs"]
