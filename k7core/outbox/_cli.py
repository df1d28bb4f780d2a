"""``k7 outbox``: run a relay as its own process, and look at an outbox's backlog.

``k7core.cli`` adds the group to ``k7``; its ``K7Error`` translation covers these commands.
"""

from __future__ import annotations

import logging
import re
import signal
import sqlite3
import threading
from contextlib import AbstractContextManager, closing
from pathlib import Path
from types import FrameType
from typing import Any

import click

from ..jobs._store import JobStore
from ._open import relay
from ._outbox import Outbox
from ._postgres import driver
from ._relay import Relay, is_postgres, sqlite_path
from ._sql import DEFAULT_TABLE, Postgres, Sqlite
from ._sqlite import busy_named, is_busy

BUSY_TIMEOUT = 5.0
"""Seconds ``status`` and ``reset`` wait for a SQLite outbox another process holds locked."""


@click.group("outbox")
def outbox() -> None:
    """The transactional outbox: relay rows into a job store or a beanstalkd server, look at
    the backlog.

    SOURCE: a PostgreSQL DSN (postgresql://...) or a SQLite file (PATH, sqlite:PATH).
    """


ADDRESS = re.compile(r"[^/\s]+:\d+")
"""A bare ``host:port``: a beanstalkd address when no such directory exists."""


def is_address(target: str) -> bool:
    """Whether TARGET names a beanstalkd server (else a job store's directory)."""
    return target.startswith(("beanstalk://", "unix:")) or bool(
        ADDRESS.fullmatch(target) and not Path(target).exists())


@outbox.command("relay")
@click.argument("source")
@click.argument("target")
@click.option("--table", default=DEFAULT_TABLE, show_default=True, help="The outbox table.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True,
              help="Rows per batch (one transaction).")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="Relays at once (PostgreSQL: they share the rows; SQLite: they take turns).")
@click.option("--fsync", type=click.Choice(["flush", "sync", "async"]), default="flush",
              show_default=True, help="The job store's fsync strategy (sync: a relayed row "
              "survives power loss).")
@click.option("--verbose", "-v", count=True, help="Log each batch's failures and more.")
def relay_command(source: str, target: str, table: str, batch: int, threads: int, fsync: str,
                  verbose: int) -> None:
    """Relay the outbox of SOURCE into TARGET, exactly once, until SIGTERM or SIGINT:
    the job store in directory TARGET (created if missing), or the beanstalkd server at
    TARGET (beanstalk://HOST:PORT, HOST:PORT, unix:/PATH; one relay moves rows at a time,
    --threads and --fsync do not apply). Prints "relaying" once running."""
    logging.basicConfig(level=logging.WARNING if verbose == 0 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    if is_address(target):
        _relay_until(stop, [relay(source, target, table=table, batch=batch)], table, target)
        return
    with JobStore(target, fsync=fsync) as jobs:
        _relay_until(stop, [relay(source, jobs, table=table, batch=batch)
                            for _ in range(threads)], table, target)


def _relay_until(stop: threading.Event, relays: list[Relay], table: str, target: str) -> None:
    try:
        relays[0].relay_once()  # a missing table or a bad DSN fails here, in the open
        for r in relays:
            r.start()
        click.echo(f"relaying {table} to {target}", err=False)
        stop.wait()
    finally:
        for r in relays:
            r.close()
    click.echo(f"stopped: {sum(r.relayed for r in relays)} jobs relayed")


@outbox.command("status")
@click.argument("source")
@click.option("--table", default=DEFAULT_TABLE, show_default=True, help="The outbox table.")
def status_command(source: str, table: str) -> None:
    """Rows of SOURCE's outbox waiting for a relay (and, on PostgreSQL, keys a relay has
    yet to forget), and the store or server it feeds."""
    if is_postgres(source):
        pg = Postgres(table)
        with _postgres(source, table) as conn:
            (waiting,) = conn.execute(pg.count).fetchone()
            (done,) = conn.execute(pg.count_done).fetchone()
            target = _target(conn, pg.target, driver().Error)
        click.echo(f"{waiting} rows waiting, {done} relayed keys to forget; {target}")
        return
    lite = Sqlite(table)
    with _busy_named(source), closing(_sqlite(source, table, readonly=True)) as conn:
        (waiting,) = conn.execute(lite.count).fetchone()
        target = _target(conn, lite.target, sqlite3.Error)
    click.echo(f"{waiting} rows waiting; {target}")


def _target(conn: Any, statement: str, error: type[Exception]) -> str:
    """Which store or server the outbox feeds, said for people."""
    try:
        found = conn.execute(statement).fetchone()
    except error:  # an outbox made by an older version, not relayed since
        conn.rollback()
        found = None
    if found is None or found[0] is None:
        return "not bound to a store yet (the first relay binds its own)"
    return f"feeds {found[1]}"


def _busy_named(source: str) -> AbstractContextManager[None]:
    """A SQLite outbox locked by another process past ``BUSY_TIMEOUT``: an error naming it."""
    return busy_named(Path(sqlite_path(source)), BUSY_TIMEOUT)


def _sqlite(source: str, table: str, *, readonly: bool) -> sqlite3.Connection:
    """A connection to the SQLite outbox of ``source`` (its table checked)."""
    path = Path(sqlite_path(source))
    if not path.exists():
        raise click.ClickException(f"{path}: no such file")
    conn = sqlite3.connect(f"file:{path}?mode=ro" if readonly else path, uri=readonly,
                           timeout=BUSY_TIMEOUT)
    _check(conn, Sqlite(table), sqlite3.Error, f"{path} has")
    return conn


def _check(conn: Any, sql: Sqlite | Postgres, error: type[Exception], where: str) -> None:
    """Read the outbox's name on ``conn`` (closed, and a clear error, if it cannot)."""
    try:
        conn.execute(sql.name).fetchone()
    except error as exc:
        conn.close()
        if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
            raise  # another process's transaction, not a missing table
        raise click.ClickException(f"{where} no outbox {sql.table!r} ({exc})") from exc


def _postgres(source: str, table: str) -> Any:
    """A connection to the PostgreSQL outbox of ``source`` (its table checked)."""
    psycopg = driver()
    try:
        conn = psycopg.connect(source)
    except psycopg.Error as exc:
        raise click.ClickException(f"cannot connect to the database: {exc}") from exc
    _check(conn, Postgres(table), psycopg.Error, "the database has")
    return conn


@outbox.command("reset")
@click.argument("source")
@click.option("--table", default=DEFAULT_TABLE, show_default=True, help="The outbox table.")
@click.option("--skip-upto", type=click.IntRange(0), default=None, metavar="ID",
              help="Delete the rows with ids up to ID first (they were relayed before).")
def reset_command(source: str, table: str, skip_upto: int | None) -> None:
    """Start SOURCE's outbox afresh after a relay refused it (its ids went back, or it
    feeds another store or server) and you know why: a new outbox name, no bound store;
    the next relay binds its own and relays every row left in the table (run it with the
    relays stopped)."""
    box = Outbox(table)
    if is_postgres(source):
        with _postgres(source, table) as conn:
            box.reset(conn, skip_upto=skip_upto)
            (left,) = conn.execute(Postgres(table).count).fetchone()
    else:
        with _busy_named(source), closing(_sqlite(source, table, readonly=False)) as conn:
            box.reset(conn, skip_upto=skip_upto)
            (left,) = conn.execute(Sqlite(table).count).fetchone()
    click.echo(f"outbox {table!r} reset: the next relay binds its store or server and "
               f"relays the {left} rows in the table")
