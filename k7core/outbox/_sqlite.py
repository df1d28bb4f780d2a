"""The SQLite relay: row ids follow commit order (one writer at a time, ``AUTOINCREMENT``
never reuses an id), so the relay's position is a store mark, journaled with each put."""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from .._errors import ClosedError
from ..jobs._store import JobStore
from ._relay import StoreRelay, log, put_row
from ._sql import DEFAULT_TABLE, Sqlite, row

POLL = 0.005
"""Seconds between two looks at ``PRAGMA data_version`` while the relay waits for rows."""

# Relays of one outbox into one store take turns (the mark is read, then moved by puts).
_turns: weakref.WeakKeyDictionary[JobStore, dict[str, threading.Lock]] = (
    weakref.WeakKeyDictionary())
_turns_lock = threading.Lock()


def _turn(store: JobStore, name: str) -> threading.Lock:
    with _turns_lock:
        return _turns.setdefault(store, {}).setdefault(name, threading.Lock())


def data_version(conn: sqlite3.Connection) -> int:
    """``PRAGMA data_version``: changes when another connection commits."""
    (version,) = conn.execute("PRAGMA data_version").fetchone()
    return int(version)


def wait_version(read: Callable[[], int], seen: int, stop: threading.Event,
                 timeout: float) -> int:
    """Poll ``read`` (a data version) every :data:`POLL` s until it is not ``seen``,
    ``stop`` is set or ``timeout`` ran out; the last version read."""
    remaining = timeout
    while remaining > 0 and not stop.is_set():
        version = read()
        if version != seen:
            return version
        stop.wait(POLL)
        remaining -= POLL
    return seen


class SqliteRelay(StoreRelay):
    """Relays the outbox table ``table`` of the SQLite database file ``path`` into ``store``.

    Each put carries the store mark ``<outbox name>`` (from the ``<table>_meta`` table) at
    the row's id, in the same journal record; after any crash the mark is the last row
    stored, and the relay goes on after it. Relayed rows are then deleted from the outbox,
    a batch at a time or once the relay is idle.
    Wakes up by polling ``PRAGMA data_version`` every 5 ms (cheap: no disk read). One outbox
    goes to one store; several relays of it into that store take turns.
    """

    def __init__(self, path: str | os.PathLike[str], store: JobStore, *,
                 table: str = DEFAULT_TABLE, batch: int = 1000, busy_timeout: float = 5.0
                 ) -> None:
        super().__init__(store, batch=batch)
        self.path = Path(path)
        self._sql = Sqlite(table)
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._name: str | None = None
        self._version = -1
        self._skip_upto = 0  # rows the store refused, in this run
        self._deleted_upto = -1

    def __repr__(self) -> str:
        return f"<SqliteRelay {str(self.path)!r} {self._sql.table}>"

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self.path.exists():
                raise FileNotFoundError(f"outbox database {self.path} does not exist "
                                        "(create it with Outbox.create)")
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout,
                                   isolation_level=None, check_same_thread=False)
            try:
                found = conn.execute(self._sql.name).fetchone()
            except sqlite3.OperationalError as exc:
                conn.close()
                raise FileNotFoundError(
                    f"{self.path} has no outbox {self._sql.table!r} ({exc}); create it "
                    "with Outbox.create") from exc
            if found is None:
                conn.close()
                raise FileNotFoundError(f"{self.path}: outbox {self._sql.table!r} has no "
                                        "name row; create it with Outbox.create")
            self._conn, self._name = conn, found[0]
        return self._conn

    def relay_once(self) -> int:
        with self._lock:
            conn = self._connect()
            name = self._name
            assert name is not None
            store, sql = self.store, self._sql
            with _turn(store, name):
                done = max(store.mark(name) or 0, self._skip_upto)
                rows = [row(r) for r in conn.execute(sql.after, (done, self.batch))]
                now = self._now()
                with store.batch():
                    for r in rows:
                        if put_row(store, r, key=r.key, mark=(name, r.id), remember=False,
                                   now=now) is None:
                            self.skipped += 1
                            self._skip_upto = r.id
                        else:
                            self.relayed += 1
                upto = store.mark(name) or 0
            # Stored (under "sync": durable): drop the rows, a batch at a time or when idle,
            # as each delete is a write transaction that the app's writers wait for; not
            # before a first row was stored.
            if upto > max(self._deleted_upto, 0) and (
                    not rows or upto - self._deleted_upto >= self.batch):
                try:
                    conn.execute(sql.delete_upto, (upto,))
                    self._deleted_upto = upto
                except sqlite3.OperationalError as exc:  # busy past the timeout: next time
                    log.warning("%s: relayed rows not deleted yet: %s", self, exc)
            return len(rows)

    def _wait(self, stop: threading.Event, timeout: float) -> None:
        self._version = wait_version(self._data_version, self._version, stop, timeout)

    def _data_version(self) -> int:
        with self._lock:
            return data_version(self._connect())

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._name is not None and not self.store.closed:  # drop what was relayed
            with suppress(sqlite3.Error, ClosedError):  # the store closing meanwhile
                upto = self.store.mark(self._name) or 0
                if upto > self._deleted_upto:
                    conn.execute(self._sql.delete_upto, (upto,))
        self._deleted_upto = -1
        conn.close()
