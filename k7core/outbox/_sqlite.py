"""The SQLite relay: row ids follow commit order (one writer at a time, ``AUTOINCREMENT``
never reuses an id), so the relay's position is a store mark, journaled with each put."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .._errors import ClosedError
from .._storage import posix_writer
from ..jobs._store import JobStore
from ._errors import OutboxBusyError
from ._guard import Bound, Target, check_ids, check_target, store_target
from ._relay import StoreRelay, log, put_row, store_lock
from ._sql import DEFAULT_TABLE, Sqlite, row, run_steps

POLL = 0.005
"""Seconds between two looks at ``PRAGMA data_version`` while the relay waits for rows."""


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says another connection held the database past the busy timeout."""
    return exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


@contextmanager
def busy_named(path: Path, busy_timeout: float) -> Iterator[None]:
    """Turn a busy database in the block into :class:`OutboxBusyError` naming the process
    holding its lock (from ``/proc/locks``: SQLite's POSIX locks, on the file itself or, in
    WAL mode, on its ``-shm``)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if not is_busy(exc):
            raise
        pid = posix_writer(path) or posix_writer(Path(f"{path}-shm"))
        who = f"process {pid}" if pid else "another connection"
        raise OutboxBusyError(
            f"the outbox's database {path} has been locked by {who} for more than "
            f"{busy_timeout:g} s (the relay's busy_timeout)", pid=pid, path=path,
            hint=f"that process is in the middle of a transaction, or stopped or stuck in "
            f"one: let it commit, resume it (kill -CONT {pid or '<pid>'}) or end it",
        ) from exc


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
    stored, and the relay goes on after it. Before it puts rows above the highest id it
    recorded, the relay records the table's highest id in ``<table>_meta`` (``upto``) and
    deletes the rows relayed before, in one write transaction; the last ones go once it is
    idle. A relay refuses (:class:`OutboxError`) an outbox bound to another store, or
    whose ids went back below its store's mark (a restored database, a table made again by
    hand). Wakes up by polling ``PRAGMA data_version`` every 5 ms (cheap: no disk read).
    One outbox goes to one store; several relays of it into that store take turns.
    """

    def __init__(self, path: str | os.PathLike[str], store: JobStore, *,
                 table: str = DEFAULT_TABLE, batch: int = 1000, busy_timeout: float = 5.0
                 ) -> None:
        super().__init__(store, batch=batch)
        self.path = Path(path)
        self._sql = Sqlite(table)
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._outbox = f"outbox {table!r} of {self.path}"
        self._target: Target | None = None
        self._version = -1
        self._skip_upto = (0, "")  # rows the store refused in this run, and of which name
        self._deleted = (-1, "")  # rows deleted up to this id, and of which name

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
                columns = {c for (c,) in conn.execute(self._sql.meta_columns)}
                if found is not None and not columns.issuperset(self._sql.add_columns):
                    # an outbox made by an older version
                    self._write(conn, lambda: run_steps(conn, self._sql.upgrade_steps()))
            except sqlite3.OperationalError as exc:
                conn.close()
                if is_busy(exc):
                    raise
                raise FileNotFoundError(
                    f"{self.path} has no outbox {self._sql.table!r} ({exc}); create it "
                    "with Outbox.create") from exc
            if found is None:
                conn.close()
                raise FileNotFoundError(f"{self.path}: outbox {self._sql.table!r} has no "
                                        "name row; create it with Outbox.create")
            self._conn = conn
        if self._target is None:
            self._target = store_target(self.store)
        return self._conn

    @staticmethod
    def _write(conn: sqlite3.Connection, body: Callable[[], object]) -> None:
        """Run ``body`` in one write transaction of ``conn``."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            body()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def relay_once(self) -> int:
        with self._lock, busy_named(self.path, self._busy_timeout):
            conn = self._connect()
            store, sql, target = self.store, self._sql, self._target
            assert target is not None
            # relays of one outbox into one store take turns (the mark is read, then moved)
            with store_lock(store, f"{self.path.resolve()} {sql.table}"):
                conn.execute("BEGIN")  # one snapshot: the meta row and the rows agree
                try:
                    meta = conn.execute(sql.meta).fetchone()
                    (highest,) = conn.execute(sql.seq).fetchone()
                    name, bound, taken = meta[0], (meta[1], meta[2]), meta[3]
                    done = store.mark(name) or 0
                    skipped_upto = self._skip_upto[0] if self._skip_upto[1] == name else 0
                    rows = [row(r) for r in conn.execute(
                        sql.after, (max(done, skipped_upto), self.batch))]
                finally:
                    conn.execute("COMMIT")
                check_ids(self._outbox, relayed=done, highest=highest,
                          taken=taken if taken >= 0 else None)  # -1: not known
                if rows and (bound[0] is None or rows[-1].id > taken):
                    # bound and taken before the puts: a database restored from an older
                    # copy is told by its upto below the store's mark
                    try:
                        if not self._take(conn, name, bound, highest, done):
                            return 0  # renamed meanwhile (a reset, a table made again)
                    except sqlite3.OperationalError as exc:  # busy past the timeout
                        log.warning("%s: waiting for the write lock to record the rows it "
                                    "takes: %s", self, exc)
                        return 0  # the thread looks again at the next commit
                elif bound[0] is not None:
                    check_target(self._outbox, bound, target, lambda: bound)
                now = self._now()
                with store.batch():
                    for r in rows:
                        if put_row(store, r, key=r.key, mark=(name, r.id), remember=False,
                                   now=now) is None:
                            self.skipped += 1
                            self._skip_upto = (r.id, name)
                        else:
                            self.relayed += 1
                upto = store.mark(name) or 0
            if not rows and upto > self._deleted_upto(name):
                # idle: drop the last rows relayed (a write the app's writers wait for)
                try:
                    self._write(conn, lambda: conn.execute(sql.delete_upto, (upto, name)))
                    self._deleted = (upto, name)
                except sqlite3.OperationalError as exc:  # busy past the timeout: next time
                    log.warning("%s: relayed rows not deleted yet: %s", self, exc)
            return len(rows)

    def _deleted_upto(self, name: str) -> int:
        return self._deleted[0] if self._deleted[1] == name else -1

    def _take(self, conn: sqlite3.Connection, name: str, bound: Bound, highest: int,
              done: int) -> bool:
        """In one write transaction: bind the outbox to this relay's store if it is not
        bound (or refuse), record ``highest`` as taken, delete the rows relayed up to
        ``done``. False if the outbox has another name now."""
        sql, target = self._sql, self._target
        assert target is not None
        taken = False

        def bind() -> Bound:
            conn.execute(sql.bind, target)
            found = conn.execute(sql.target).fetchone()
            return (found[0], found[1]) if found else (None, None)

        def write() -> None:
            nonlocal taken
            check_target(self._outbox, bound, target, bind)
            taken = conn.execute(sql.take, (highest, name)).rowcount == 1
            if taken and done > self._deleted_upto(name):
                conn.execute(sql.delete_upto, (done, name))

        self._write(conn, write)
        if taken:
            self._deleted = (max(done, self._deleted_upto(name)), name)
        return taken

    def _wait(self, stop: threading.Event, timeout: float) -> None:
        self._version = wait_version(self._data_version, self._version, stop, timeout)

    def _data_version(self) -> int:
        with self._lock:
            return data_version(self._connect())

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        name = self._deleted[1]
        if name and not self.store.closed:  # drop what was relayed
            with suppress(sqlite3.Error, ClosedError):  # the store closing meanwhile
                upto = self.store.mark(name) or 0
                if upto > self._deleted_upto(name):
                    conn.execute(self._sql.delete_upto, (upto, name))
        self._deleted = (-1, "")
        conn.close()
