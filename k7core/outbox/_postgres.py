"""The PostgreSQL relay: sequence values can commit out of order, so rows are claimed
(``FOR UPDATE SKIP LOCKED``), put with a key the store remembers, and deleted; the store
forgets the keys once the delete has committed."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from .._errors import MissingExtraError
from ..jobs._store import JobStore
from ._errors import OutboxBusyError
from ._guard import Target, check_ids, check_target, store_target
from ._relay import StoreRelay, put_row, store_lock
from ._sql import DEFAULT_TABLE, Postgres, key_prefix, row, run_steps

if TYPE_CHECKING:
    import psycopg


def driver() -> Any:
    """The psycopg module (the ``postgres`` extra)."""
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtraError("the PostgreSQL outbox relay", "postgres", exc) from exc
    return psycopg

LOCK_TIMEOUT = 10.0
"""Seconds a relay's statement waits for a row or table lock another session holds (a relay
or an app stopped in the middle of its transaction) before the call raises
``OutboxBusyError`` naming it (PostgreSQL's ``lock_timeout``)."""

_APP_PID = re.compile(r"^k7 relay \(pid (\d+)\)$")


def relay_application_name() -> str:
    """The ``application_name`` of a relay's sessions: another relay that finds one of them
    holding a lock names its process."""
    return f"k7 relay (pid {os.getpid()})"


NOTIFY_POLL = 0.1
"""Seconds a listening relay waits for a notification before it looks whether it was
closed."""


def listen(dsn: str, statement: str) -> psycopg.Connection[Any]:
    """A new autocommit connection that ran ``statement`` (``LISTEN <channel>``)."""
    listener = driver().connect(dsn, autocommit=True)
    try:
        listener.execute(statement)
    except BaseException:
        listener.close()
        raise
    return listener  # type: ignore[no-any-return]


def wait_notified(listener: psycopg.Connection[Any] | None, stop: threading.Event,
                  timeout: float) -> None:
    """Return once ``listener`` got a notification, ``stop`` is set or ``timeout`` ran out
    (without a listener: the latter two)."""
    if listener is None:
        stop.wait(timeout)
        return
    end = time.monotonic() + timeout
    while not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return
        for _ in listener.notifies(timeout=min(NOTIFY_POLL, left), stop_after=1):
            return


class PostgresRelay(StoreRelay):
    """Relays the outbox table ``table`` of the PostgreSQL database at ``dsn`` into ``store``.

    A batch is one transaction: claim up to ``batch`` rows (``FOR UPDATE SKIP LOCKED``, so
    several relays share the rows), put each with the row's own key or
    ``<outbox name>:<row id>`` and ``remember=True`` (a row put again after a crash stores
    nothing), delete the rows and record their keys in ``<table>_done``, commit; then the
    store forgets the keys and the done rows go. A relay that starts forgets the keys of
    rows deleted by one that died before it could. Relays take rows up to the id recorded
    in ``<table>_meta`` (``upto``), moved to the sequence's highest in a transaction of its
    own before they are put; the last row of a batch moves the store mark ``<outbox name>``
    to its id (if higher). A relay refuses (:class:`OutboxError`) an outbox bound to
    another store, or whose ids went back below its store's mark (``upto`` below it: a
    restored database; the sequence below it: a reset sequence, a table made by hand).
    Wakes up on ``LISTEN <table>`` (the table's insert trigger notifies), with a look every
    second besides.
    """

    def __init__(self, dsn: str, store: JobStore, *, table: str = DEFAULT_TABLE,
                 batch: int = 1000, lock_timeout: float = LOCK_TIMEOUT) -> None:
        super().__init__(store, batch=batch)
        if not 0 < lock_timeout <= 3600:
            raise ValueError(f"lock_timeout must be in (0, 3600] seconds, not {lock_timeout!r}")
        self.lock_timeout = lock_timeout
        self._psycopg = driver()
        self.dsn = dsn
        self._sql = Postgres(table)
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._outbox = f"outbox {table!r}"
        self._target: Target | None = None
        self._forgotten: dict[str, list[str]] = {}  # done rows to delete at the next batch

    def __repr__(self) -> str:
        return f"<PostgresRelay {self._sql.table}>"

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            conn = self._psycopg.connect(self.dsn, application_name=relay_application_name())
            try:
                conn.execute(f"SET lock_timeout = {max(1, round(self.lock_timeout * 1000))}")
                found = conn.execute(self._sql.name).fetchone()
                conn.commit()
                if found is None:
                    raise LookupError("no name row")
                with conn.transaction():  # an outbox made by an older version
                    run_steps(conn, self._sql.upgrade_steps())
                self._outbox = f"outbox {self._sql.table!r} of database {conn.info.dbname!r}"
                self._target = self._target or store_target(self.store)
                bound = conn.execute(self._sql.target).fetchone() or (None, None)
                conn.commit()
                if bound[0] is not None:  # the done keys are another store's to forget
                    check_target(self._outbox, bound, self._target, lambda: bound)
                self._forget_done(conn)
            except (self._psycopg.errors.UndefinedTable, LookupError) as exc:
                conn.close()
                raise FileNotFoundError(f"the database has no outbox {self._sql.table!r} "
                                        f"({exc}); create it with Outbox.create") from exc
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _forget_done(self, conn: psycopg.Connection[Any]) -> None:
        """Forget the keys of every row a relay deleted (this one, or one that died)."""
        by_tube: dict[str, list[str]] = defaultdict(list)
        for tube, key in conn.execute(self._sql.done):
            by_tube[tube].append(key)
        conn.commit()
        for tube, keys in by_tube.items():
            self.store.forget(tube, keys)
        with conn.transaction():
            for tube, keys in by_tube.items():
                conn.execute(self._sql.undone, (tube, keys))

    def relay_once(self) -> int:
        with self._lock:
            try:
                conn = self._connect()
                n, behind = self._batch(conn)
                if behind and n < self.batch:  # rows may wait above what relays may take
                    self._take(conn)
                    n += self._batch(conn)[0]
                return n
            except self._psycopg.errors.LockNotAvailable as exc:
                if self._conn is not None:
                    self._conn.rollback()
                raise self._busy() from exc

    def _busy(self) -> OutboxBusyError:
        """The error of a lock wait that ran out: names the session that holds one of the
        outbox's tables (a relay's names its process)."""
        holders: list[tuple[int, str]] = []
        try:
            with self._psycopg.connect(self.dsn, autocommit=True) as look:
                look.execute("SET statement_timeout = 5000")
                holders = look.execute(self._sql.lock_holders).fetchall()
        except self._psycopg.Error:
            pass
        backend, app = holders[0] if holders else (None, "")
        found = _APP_PID.match(app or "")
        pid = int(found.group(1)) if found else None
        who = (f"process {pid} (PostgreSQL backend {backend})" if pid else
               f"PostgreSQL backend {backend} ({app or 'no application name'})" if backend
               else "another session")
        end = f"kill -CONT {pid}" if pid else f"SELECT pg_terminate_backend({backend or '<pid>'})"
        return OutboxBusyError(
            f"{self._outbox} has been locked by {who} for more than {self.lock_timeout:g} s "
            "(the relay's lock_timeout); nothing was put",
            pid=pid, path=None,
            hint="that session is in the middle of a transaction, or stopped or stuck in one: "
            f"let it commit, resume or end it ({end})",
        )

    def _take(self, conn: psycopg.Connection[Any]) -> None:
        """Bind the outbox to this relay's store if no relay did, and record the sequence's
        highest id as what relays may take, in a transaction that commits before any of
        those rows is put: a database restored from an older copy is then told by its
        ``upto`` below the store's mark."""
        with conn.transaction():
            conn.execute(self._sql.bind, self._target)
            conn.execute(self._sql.take)

    def _batch(self, conn: psycopg.Connection[Any]) -> tuple[int, bool]:
        """One batch of the rows relays may take; how many, and whether rows may wait
        beyond them (or the outbox is not bound yet)."""
        store, sql, target = self.store, self._sql, self._target
        assert target is not None
        with conn.transaction():
            for tube, gone in self._forgotten.items():
                conn.execute(sql.undone, (tube, gone))
            self._forgotten = {}
            name, bound_to, where, upto = conn.execute(sql.meta).fetchone() or (
                None, None, None, 0)
            (highest,) = conn.execute(sql.seq).fetchone() or (0,)
            if name is None:
                raise FileNotFoundError(f"{self._outbox} has no name row; create it with "
                                        "Outbox.create")
            check_ids(self._outbox, relayed=store.mark(name) or 0, highest=highest,
                      taken=upto if upto >= 0 else None)  # -1: not known
            if bound_to is None:  # the first relay that finds rows binds the outbox
                return 0, conn.execute(sql.any_row).fetchone() is not None
            check_target(self._outbox, (bound_to, where), target, lambda: (None, None))
            rows = [row(r) for r in conn.execute(sql.claim, (upto, self.batch))]
            if not rows:
                return 0, highest > upto
            prefix, now = key_prefix(name), self._now()
            keys: dict[str, list[str]] = defaultdict(list)
            put: list[int] = []
            skipped: list[int] = []
            with store.batch():
                for i, r in enumerate(rows, 1 - len(rows)):  # i == 0: the last row
                    key = r.key if r.key is not None else f"{prefix}{r.id}"
                    if i:
                        job = put_row(store, r, key=key, mark=None, remember=True, now=now)
                    else:  # the batch's highest id marks the store (if above its mark)
                        with store_lock(store, f"mark {name}"):
                            mark = (name, r.id) if r.id > (store.mark(name) or 0) else None
                            job = put_row(store, r, key=key, mark=mark, remember=True,
                                          now=now)
                    if job is None:
                        self.skipped += 1
                        skipped.append(r.id)
                    else:
                        self.relayed += 1
                        keys[r.tube].append(key)
                        put.append(r.id)
            conn.execute(sql.delete, (put, prefix))
            if skipped:  # nothing remembered (a bad tube or key would fail forget)
                conn.execute(sql.drop, (skipped,))
        for tube, tube_keys in keys.items():  # committed: the rows are gone for good
            store.forget(tube, tube_keys)
        self._forgotten = dict(keys)
        return len(rows), highest > upto

    def _arm(self) -> None:
        if self._listener is None:
            self._listener = listen(self.dsn, self._sql.listen)

    def _wait(self, stop: threading.Event, timeout: float) -> None:
        wait_notified(self._listener, stop, timeout)

    def _disconnect(self) -> None:
        self._forgotten = {}
        for conn in (self._conn, self._listener):
            if conn is not None:
                conn.close()
        self._conn = self._listener = None
