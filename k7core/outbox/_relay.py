"""What every relay shares: the thread that relays until closed (:class:`Relay`), and, for
the relays into a job store (:class:`StoreRelay`), putting a row into the store. The
databases' own parts are ``_sqlite`` and ``_postgres``; ``_beanstalk`` relays into a
beanstalkd server."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from abc import abstractmethod
from typing import Self

from .._errors import K7Error
from .._resource import Resource
from ..jobs._errors import DependencyError, InvalidJobError
from ..jobs._store import JobStore
from ._sql import Row, deps_of

log = logging.getLogger("k7core.outbox")

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SCHEME = "sqlite:"


def is_postgres(source: str) -> bool:
    """Whether ``source`` names a PostgreSQL database (else a SQLite file)."""
    return source.startswith(POSTGRES_SCHEMES)


def sqlite_path(source: str) -> str:
    """The SQLite file ``source`` names (a path, ``sqlite:PATH`` or ``sqlite:///PATH``)."""
    path = source.removeprefix(SQLITE_SCHEME)
    return path[2:] if path.startswith("//") else path


_store_locks: weakref.WeakKeyDictionary[JobStore, dict[str, threading.Lock]] = (
    weakref.WeakKeyDictionary())
_store_locks_lock = threading.Lock()


def store_lock(store: JobStore, key: str) -> threading.Lock:
    """The lock named ``key`` of ``store``, shared by every relay into it in this process
    (a store is open in one process only): a store mark read, then moved, under it."""
    with _store_locks_lock:
        return _store_locks.setdefault(store, {}).setdefault(key, threading.Lock())


RETRY_CAP = 30.0
"""The longest wait, in seconds, between attempts after a relay's database or store failed."""


def put_row(store: JobStore, row: Row, *, key: str | None, mark: tuple[str, int] | None,
            remember: bool, now: float) -> int | None:
    """Put ``row`` into ``store``; return the job id, or None when the store refuses the row
    itself (logged at ERROR: it cannot become a job; rows put through ``Outbox`` never are).

    A dependency that is no longer live counts as done (the store keeps no record of
    finished jobs); the row's delay counts from when it was put."""
    try:  # a row written by other SQL than Outbox.put may hold anything
        deps = deps_of(row.depends_on)
        delay = max(0.0, row.created_at + row.delay - now) if row.delay else 0.0
    except (ValueError, TypeError, LookupError) as exc:
        _skipped(row, exc)
        return None
    for _ in range(3):
        try:
            return store.put(row.body, tube=row.tube, priority=row.priority, delay=delay,
                             ttr=row.ttr, key=key, depends_on=deps, mark=mark,
                             remember=remember, group=row.group)
        except DependencyError:
            deps = [d for d in deps if (store.peek(d) if isinstance(d, int)
                                        else store.find(*d)) is not None]
        except InvalidJobError as exc:
            _skipped(row, exc)
            return None
    return store.put(row.body, tube=row.tube, priority=row.priority, delay=delay,
                     ttr=row.ttr, key=key, mark=mark, remember=remember, group=row.group)


def _skipped(row: Row, exc: Exception) -> None:
    log.error("outbox row %d (tube %r) cannot be a job and is skipped: %s", row.id, row.tube,
              exc)


class Relay(Resource):
    """Moves committed outbox rows into a job store or a beanstalkd server, exactly once.

    ``relay_once()`` relays up to ``batch`` rows in the caller's thread; ``start()`` (or
    ``with``) runs a thread that relays until :meth:`close`, waking when rows are committed.
    A failure of the database or the server is logged and retried (after 0.1 s, doubling up
    to 30 s, with new connections); so is a refusal (:class:`OutboxError`), which a reset
    ends, and a full disk under the store (``StorageError``). A K7Error is logged without a
    traceback: its message says it all. The thread ends when a job
    store it puts into is closed.
    ``relayed`` counts the jobs put, ``skipped`` the rows refused (logged), ``error`` is the
    last failure.
    """

    def __init__(self, *, batch: int) -> None:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, not {batch!r}")
        self.batch = batch
        self.relayed = 0
        self.skipped = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()  # one relay_once at a time on this relay's connection

    @abstractmethod
    def relay_once(self) -> int:
        """Relay up to ``batch`` committed rows; return how many rows were handled."""

    @abstractmethod
    def _wait(self, stop: threading.Event, timeout: float) -> None:
        """Return once rows may have been committed, ``stop`` is set or ``timeout`` ran out."""

    def _arm(self) -> None:
        """Get ready to be woken by :meth:`_wait` (before the batch it should follow)."""

    @abstractmethod
    def _disconnect(self) -> None:
        """Close the database connections (the next relay_once opens new ones)."""

    def _ended(self) -> bool:
        """Whether what the relay puts into is gone for good (the thread then ends)."""
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> Self:
        """Relay on a thread of its own until :meth:`close`."""
        with self._lock:
            if self._closed:
                raise K7Error("this relay is closed", hint="make a new one")
            if self._thread is None:
                self._thread = threading.Thread(target=self.run, name=f"k7-outbox-{self}",
                                                daemon=True)
                self._thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def run(self) -> None:
        """Relay in this thread until :meth:`close` is called (from another thread) or the
        job store it puts into is closed."""
        stop, pause = self._stop, 0.0
        while not stop.is_set():
            try:
                self._arm()
                n = self.relay_once()
                pause = 0.0
                if n < self.batch:  # inside: a listener connection may fail too
                    self._wait(stop, 1.0)
            except Exception as exc:
                if self._ended() or self._closed:
                    break
                self.error = exc
                pause = min(RETRY_CAP, max(0.1, pause * 2))
                log.error("outbox relay %s failed (retrying in %.1f s): %s", self, pause, exc,
                          exc_info=None if isinstance(exc, K7Error) else exc)
                with self._lock:
                    self._disconnect()
                stop.wait(pause)

    def close(self) -> None:
        """Stop the thread (it finishes the batch it is on) and close the connections."""
        self._closed = True
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            self._disconnect()

    def _now(self) -> float:
        return time.time()


class StoreRelay(Relay):
    """A relay into a :class:`k7core.jobs.JobStore` (``store``)."""

    def __init__(self, store: JobStore, *, batch: int) -> None:
        if not isinstance(store, JobStore):
            raise TypeError(f"a relay puts into a k7core.jobs.JobStore, not {store!r:.80} "
                            "(for a k7async.AsyncJobStore, pass its .store)")
        super().__init__(batch=batch)
        self.store = store

    def _ended(self) -> bool:
        return self.store.closed
