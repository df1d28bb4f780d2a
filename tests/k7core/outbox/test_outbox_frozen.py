"""A process frozen (SIGSTOP) while it holds the outbox's SQLite database locked (an app in
the middle of a transaction): a relay's call waits at most its ``busy_timeout``, then raises
``OutboxBusyError`` naming that process, not a "no outbox, create it" error, and ``k7 outbox
relay`` says so in one line (no traceback).

Every wait is bounded by ``BOUND`` seconds, far above ``busy_timeout``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import psycopg
import pytest

from k7core import LockedError
from k7core.jobs import JobStore
from k7core.outbox import BeanstalkRelay, Outbox, OutboxBusyError, PostgresRelay, SqliteRelay
from tests._childproc import Child, bounded, stopped
from tests._queuehelp import child_env

PROGRAM = "tests.k7core.outbox._outboxchild"
BOUND = 60.0
BUSY = 0.2


@contextmanager
def frozen_lock(db: Path) -> Iterator[int]:
    """A child holding ``db``'s exclusive lock, stopped with SIGSTOP for the block; yields
    its pid. Continued and killed afterwards, whatever happens."""
    with Child("lock", str(db), program=PROGRAM) as child:
        assert child.line() == b"held"
        with stopped(child) as pid:
            yield pid


@pytest.fixture
def outbox_db(tmp_path: Path) -> Path:
    db = tmp_path / "app.db"
    with closing(sqlite3.connect(db)) as conn:
        box = Outbox()
        box.create(conn)
        box.put(conn, "t", {"n": 1})
        conn.commit()
    return db


def check_busy(exc: object, pid: int) -> None:
    assert isinstance(exc, OutboxBusyError), exc
    assert isinstance(exc, LockedError)
    assert exc.pid == pid
    assert f"process {pid}" in str(exc) and exc.hint and f"kill -CONT {pid}" in exc.hint


@pytest.mark.parametrize("kind", ["store", "beanstalk"])
def test_a_relay_beside_a_frozen_holder_of_the_database(outbox_db: Path, tmp_path: Path,
                                                         kind: str) -> None:
    """The first call (which opens the connection and reads the outbox's name) and a call on
    a connection opened before the freeze; the row is relayed once the holder is gone."""
    with JobStore(tmp_path / "jobs") as store:
        relay = (SqliteRelay(outbox_db, store, busy_timeout=BUSY) if kind == "store" else
                 BeanstalkRelay(outbox_db, "127.0.0.1:1", busy_timeout=BUSY))
        with closing(relay):
            with frozen_lock(outbox_db) as pid:
                check_busy(bounded(relay.relay_once, BOUND), pid)
            if kind == "store":
                assert relay.relay_once() == 1
                with frozen_lock(outbox_db) as pid:
                    check_busy(bounded(relay.relay_once, BOUND), pid)


@pytest.mark.parametrize("command", ["relay", "status", "reset"])
def test_the_outbox_commands_beside_a_frozen_holder(outbox_db: Path, tmp_path: Path,
                                                    command: str) -> None:
    """Each waits its busy timeout, then says who holds the database, in one line."""
    args = [str(outbox_db)] + ([str(tmp_path / "jobs")] if command == "relay" else [])
    with frozen_lock(outbox_db) as pid:
        done = subprocess.run([sys.executable, "-m", "k7core", "outbox", command, *args],
                              capture_output=True, timeout=BOUND, env=child_env(), text=True)
    assert done.returncode == 3, done
    assert "Traceback" not in done.stderr
    assert "OutboxBusyError" in done.stderr and f"process {pid}" in done.stderr


def test_a_pg_relay_beside_a_frozen_relay_in_its_transaction(dsn: str, tmp_path: Path) -> None:
    """Another relay stopped in the middle of its transaction holds the outbox's meta row:
    this relay's call waits at most its ``lock_timeout``, then raises OutboxBusyError naming
    that relay's process; once it is gone the row is relayed."""
    with psycopg.connect(dsn) as conn:
        box = Outbox()
        box.create(conn)
        box.put(conn, "t", {"n": 1})
        conn.commit()
    with JobStore(tmp_path / "jobs") as store, \
            closing(PostgresRelay(dsn, store, lock_timeout=BUSY)) as relay:
        with Child("pglock", dsn, program=PROGRAM) as child:
            assert child.line() == b"held"
            with stopped(child) as pid:
                check_busy(bounded(relay.relay_once, BOUND), pid)
        assert relay.relay_once() == 1
        assert store.stats()["total-jobs"] == 1
