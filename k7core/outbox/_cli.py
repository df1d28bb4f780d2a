"""``k7 outbox``: run a relay as its own process, and look at an outbox's backlog.

``k7core.cli`` adds the group to ``k7``; its ``K7Error`` translation covers these commands.
"""

from __future__ import annotations

import logging
import re
import signal
import sqlite3
import threading
from pathlib import Path
from types import FrameType

import click

from ..jobs._store import JobStore
from ._open import relay
from ._postgres import driver
from ._relay import Relay, is_postgres, sqlite_path
from ._sql import DEFAULT_TABLE, Postgres, Sqlite


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
    yet to forget)."""
    if is_postgres(source):
        pg = Postgres(table)
        with driver().connect(source) as conn:
            (waiting,) = conn.execute(pg.count).fetchone()
            (done,) = conn.execute(pg.count_done).fetchone()
        click.echo(f"{waiting} rows waiting, {done} relayed keys to forget")
        return
    lite = Sqlite(table)
    path = Path(sqlite_path(source))
    if not path.exists():
        raise click.ClickException(f"{path}: no such file")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        try:
            (waiting,) = conn.execute(lite.count).fetchone()
        except sqlite3.OperationalError as exc:
            raise click.ClickException(f"{path}: no outbox {table!r} ({exc})") from exc
    click.echo(f"{waiting} rows waiting")
