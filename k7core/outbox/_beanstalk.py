"""The relay into a beanstalkd server (beanstalkd itself or ``k7 serve``), exactly once.

beanstalkd has no unique keys or marks, so the relay keeps its own record,
``<table>_sent``, in the outbox's database, and puts each job *parked* (delayed by the
outbox's park delay, more than 131 years: no consumer can reserve it) until its id is
recorded; only then is the job made live. A batch:

(a) probe the server's highest job id (a parked put, deleted at once, in the outbox's tube
    :data:`PROBE_TUBE`), insert
    the rows into ``<table>_sent`` with that id as their ``floor``, commit;
(b) put each row's job parked, in its tube, with its priority and ttr;
(c) record the job ids, commit;
(d) make each job live: ``kick-job`` (no delay left), or ``reserve-job`` then ``release``
    with the delay left;
(e) delete the rows and their ``<table>_sent`` rows, commit.

Before each batch the relay recovers what a relay that failed left in ``<table>_sent``: a
recorded job still parked is made live, any other (live, reserved, gone) is done; for a row
without an id, the ids from its floor up to the server's highest (at most
:data:`SCAN_LIMIT` of them) are looked at for parked jobs of this outbox with its tube,
priority, ttr and body: one is adopted, the others deleted; a row with none is put again.
A job that was never recorded stays parked, so a consumer never gets one twice.

One relay of an outbox moves rows at a time: SQLite, an exclusive ``flock`` on
``<database>-<table>.relay-lock``; PostgreSQL, a session advisory lock. Others wait.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import zlib
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._storage import try_lock
from ..beanstalk import Client, JobNotFoundError, JobTooBigError, Stats, calls, parse_address
from ..jobs._errors import InvalidJobError
from ._guard import Bound, check_ids, check_target, server_target
from ._postgres import driver, listen, wait_notified
from ._relay import Relay, is_postgres, log, sqlite_path
from ._sql import DEFAULT_TABLE, Postgres, Row, Sent, Sqlite, Steps, row, run_steps
from ._sqlite import busy_named, data_version, is_busy, wait_version

if TYPE_CHECKING:
    import psycopg

LIVE_MAX = calls.MAX_U32 - (1 << 24)
"""The longest delay a relayed job gets (seconds, over 131 years); park delays are above."""
PROBE_TUBE = "k7-probe-{name}"
"""The tube of the puts (deleted at once) that tell the relay the server's highest id, one
per outbox (``name``: the outbox's); a relay deletes what a failed one left there."""
SCAN_LIMIT = 100_000
"""The most job ids a recovery looks at for parked jobs whose ids were not recorded (on
``k7 serve`` ids are journal offsets, so this covers about 100 KB of its journal); a row
whose job lies beyond is put again, its first job staying parked."""
TIMEOUT = 30.0
"""Seconds a server's reply may take."""


def park_delay(name: str) -> int:
    """The delay of this outbox's parked jobs: above :data:`LIVE_MAX`, from the outbox's
    name, so two outboxes relaying into one server do not take each other's jobs."""
    return calls.MAX_U32 - zlib.crc32(name.encode()) % (1 << 24)


Writes = Sequence[tuple[str, Iterable[Sequence[Any]]]]


class _Sqlite:
    """The outbox's SQLite file: one connection, writes under ``BEGIN IMMEDIATE``."""

    def __init__(self, path: Path, table: str, busy_timeout: float) -> None:
        self.path = path
        self.sql = Sent(table, "?", Sqlite(table))
        self.describe = f"outbox {table!r} of {path}"
        self.lock_path = Path(f"{path}-{table}.relay-lock")
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._version = -1

    def connect(self) -> Any:
        if self._conn is None:
            if not self.path.exists():
                raise FileNotFoundError(f"outbox database {self.path} does not exist "
                                        "(create it with Outbox.create)")
            self._conn = sqlite3.connect(self.path, timeout=self._busy_timeout,
                                         isolation_level=None, check_same_thread=False)
        return self._conn

    def busy_named(self) -> AbstractContextManager[None]:
        """A busy database in the block: :class:`OutboxBusyError`, naming its holder."""
        return busy_named(self.path, self._busy_timeout)

    def turn(self) -> bool:
        if self._lock_fd < 0:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            if not try_lock(fd):
                os.close(fd)
                return False
            self._lock_fd = fd
        return True

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.connect().execute(sql, params).fetchall()  # type: ignore[no-any-return]

    def write(self, writes: Writes) -> None:
        conn = self.connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in writes:
                conn.executemany(sql, params)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def run(self, steps: Steps) -> None:
        conn = self.connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            run_steps(conn, steps)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def arm(self) -> None:
        pass

    def wait(self, stop: threading.Event, timeout: float, lock: threading.Lock) -> None:
        def read() -> int:
            with lock:  # the connection is the relay's
                return data_version(self.connect())

        self._version = wait_version(read, self._version, stop, timeout)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)  # the flock goes with it


class _Postgres:
    """The outbox's PostgreSQL database: an autocommit connection holding the session
    advisory lock, writes in transactions, a listener to wake on commits."""

    def __init__(self, dsn: str, table: str) -> None:
        self.psycopg = driver()
        self.dsn = dsn
        self.sql = Sent(table, "%s", Postgres(table))
        self.describe = f"outbox {table!r}"
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._locked = False

    def connect(self) -> Any:
        if self._conn is None:
            self._conn = self.psycopg.connect(self.dsn, autocommit=True)
            self._locked = False
        return self._conn

    def busy_named(self) -> AbstractContextManager[None]:
        return nullcontext()  # PostgreSQL waits on locks as the DSN's settings say

    def turn(self) -> bool:
        if not self._locked:
            self._locked = bool(self.query(self.sql.lock)[0][0])
        return self._locked

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.connect().execute(sql, params).fetchall()  # type: ignore[no-any-return]
        except self.psycopg.errors.UndefinedTable as exc:
            raise FileNotFoundError(f"the database has no outbox {self.sql.table!r} ({exc}); "
                                    "create it with Outbox.create") from exc

    def write(self, writes: Writes) -> None:
        conn = self.connect()
        with conn.transaction(), conn.cursor() as cur:
            for sql, params in writes:
                cur.executemany(sql, list(params))

    def run(self, steps: Steps) -> None:
        conn = self.connect()
        with conn.transaction():
            run_steps(conn, steps)

    def arm(self) -> None:
        if self._listener is None:
            self._listener = listen(self.dsn, self.sql.listen)

    def wait(self, stop: threading.Event, timeout: float, lock: threading.Lock) -> None:
        wait_notified(self._listener, stop, timeout)

    def close(self) -> None:
        for conn in (self._conn, self._listener):
            if conn is not None:
                conn.close()  # the advisory lock goes with the session
        self._conn = self._listener = None
        self._locked = False


class BeanstalkRelay(Relay):
    """Relays the outbox table ``table`` of ``source`` (a PostgreSQL DSN, or a SQLite file:
    its path, ``sqlite:PATH``) into the beanstalkd server at ``address``
    (``beanstalk://host:port``, ``host:port``, ``unix:/path``), exactly once: see
    ``docs/outbox.md``. Rows with a ``key``, ``depends_on`` or ``group`` (beanstalkd has
    none of them) are skipped (logged at ERROR, counted in ``skipped``, deleted). One relay
    of an outbox moves rows at a time; another waits its turn, looking every second.
    """

    def __init__(self, source: str | os.PathLike[str], address: str, *,
                 table: str = DEFAULT_TABLE, batch: int = 1000, busy_timeout: float = 5.0
                 ) -> None:
        super().__init__(batch=batch)
        parse_address(address)  # a bad address fails here
        self.address = address
        self._db: _Sqlite | _Postgres = (
            _Postgres(source, table) if isinstance(source, str) and is_postgres(source)
            else _Sqlite(Path(sqlite_path(os.fspath(source))), table, busy_timeout))
        self._target = server_target(address)
        self._client: Client | None = None
        self._park = 0
        self._used = ""
        self._probe_tube = ""
        self._swept = False

    def __repr__(self) -> str:
        return f"<BeanstalkRelay {self._db.sql.table} -> {self.address}>"

    # --- connections -----------------------------------------------------------------

    def _connect(self) -> Client:
        """The database (its ``_sent`` table created, the outbox's name read) and the
        server, once connected."""
        if self._client is None:
            db = self._db
            try:
                found = db.query(db.sql.name)
            except sqlite3.OperationalError as exc:
                if is_busy(exc):
                    raise
                raise FileNotFoundError(f"the database has no outbox {db.sql.table!r} "
                                        f"({exc}); create it with Outbox.create") from exc
            if not found:
                raise FileNotFoundError(f"outbox {db.sql.table!r} has no name row; create "
                                        "it with Outbox.create")
            db.run(db.sql.tables.upgrade_steps())  # an outbox made by an older version
            db.write([(db.sql.create, [()])])
            self._park = park_delay(found[0][0])
            self._probe_tube = PROBE_TUBE.format(name=found[0][0])
            self._client, self._used = Client(self.address, timeout=TIMEOUT), "default"
            self._swept = False
        return self._client

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
        self._db.close()

    def _arm(self) -> None:
        self._db.arm()

    def _wait(self, stop: threading.Event, timeout: float) -> None:
        self._db.wait(stop, timeout, self._lock)

    # --- the batch -------------------------------------------------------------------

    def relay_once(self) -> int:
        with self._lock, self._db.busy_named():
            client = self._connect()
            db, sql = self._db, self._db.sql
            if not db.turn():
                return 0  # another relay of this outbox moves its rows
            bound = self._bound()
            if bound[0] is not None:
                check_target(db.describe, bound, self._target, self._bind)
            if not self._swept:
                self._sweep_probes(client)
            done = self._recover(client)
            rows = [row(r) for r in db.query(sql.first, (self.batch,))]
            if not rows:
                return done
            check_target(db.describe, bound, self._target, self._bind)
            now = self._now()
            good: list[tuple[Row, calls.Call[int]]] = []
            bad: list[Row] = []
            for r in rows:
                put = self._put_call(r)
                if put is None:
                    bad.append(r)
                else:
                    good.append((r, put))
            floor = self._top(client)
            db.write([(sql.intend, [(r.id, floor) for r, _ in good]),
                      (sql.drop, [(r.id,) for r in bad])])
            self.skipped += len(bad)
            put_ids = self._put_parked(client, good)
            self._go_live(client, put_ids, now)
            self._finish([r for r, _ in put_ids])
            return len(rows) + done

    def _bound(self) -> Bound:
        found = self._db.query(self._db.sql.target)
        return (found[0][0], found[0][1]) if found else (None, None)

    def _bind(self) -> Bound:
        self._db.write([(self._db.sql.bind, [self._target])])
        return self._bound()

    def _put_call(self, r: Row) -> calls.Call[int] | None:
        """The parked put of ``r``, or None when it cannot be a beanstalkd job (logged)."""
        why = ("it has a key (beanstalkd has no unique keys)" if r.key is not None else
               "it has dependencies (beanstalkd has none)" if r.depends_on else
               "it has a job group (beanstalkd has none)" if r.group is not None else "")
        if not why:
            try:
                calls.use(r.tube)
                return calls.put(r.body, priority=r.priority, delay=self._park,
                                 ttr=max(1, math.ceil(r.ttr)))
            except (InvalidJobError, TypeError, ValueError) as exc:
                why = str(exc)
        _skipped(r, why)
        return None

    def _use(self, client: Client, tube: str) -> None:
        if tube != self._used:
            self._used = ""
            client.use(tube)
            self._used = tube

    def _sweep_probes(self, client: Client) -> None:
        """Delete the probe jobs a relay that failed left parked."""
        self._use(client, self._probe_tube)
        while (job := client.peek_delayed()) is not None:
            log.warning("%s: deleted probe job %d a failed relay left", self, job.id)
            with suppress(JobNotFoundError):
                client.delete(job.id)
        self._swept = True

    def _top(self, client: Client) -> int:
        """The server's highest job id now (a put and delete in :data:`PROBE_TUBE`)."""
        self._use(client, self._probe_tube)
        job_id = client.put(b"", delay=self._park)
        client.delete(job_id)
        return job_id

    def _put_parked(self, client: Client, batch: list[tuple[Row, calls.Call[int]]]
                    ) -> list[tuple[Row, int]]:
        """(b) and (c): put the jobs parked and record their ids (those put so far, on a
        failure too)."""
        sql = self._db.sql
        out: list[tuple[Row, int]] = []
        too_big: list[Row] = []
        try:
            for r, put in batch:
                self._use(client, r.tube)
                try:
                    out.append((r, client.call(put)))
                except JobTooBigError as exc:
                    _skipped(r, str(exc))
                    too_big.append(r)
        finally:
            self._db.write([(sql.record, [(job_id, r.id) for r, job_id in out]),
                            (sql.forget, [(r.id,) for r in too_big]),
                            (sql.drop, [(r.id,) for r in too_big])])
            self.skipped += len(too_big)
        return out

    def _go_live(self, client: Client, jobs: list[tuple[Row, int]], now: float) -> None:
        """(d): each parked job ready, or delayed by what is left of its row's delay."""
        for r, job_id in jobs:
            left = math.ceil(r.created_at + r.delay - now) if r.delay else 0
            try:
                if left <= 0:
                    client.kick_job(job_id)
                else:
                    client.reserve_job(job_id)
                    client.release(job_id, priority=r.priority, delay=min(left, LIVE_MAX))
            except JobNotFoundError:  # live already (kicked), or reserved by another
                log.info("%s: job %d of row %d was live already", self, job_id, r.id)

    def _finish(self, rows: list[Row]) -> None:
        """(e): the rows are relayed."""
        sql = self._db.sql
        ids = [(r.id,) for r in rows]
        self._db.write([(sql.drop, ids), (sql.forget, ids)])
        self.relayed += len(rows)

    # --- recovery --------------------------------------------------------------------

    def _parked(self, st: Stats) -> bool:
        return st["state"] == "delayed" and int(st["delay"]) == self._park

    def _recover(self, client: Client) -> int:
        """Finish what a failed batch left in ``<table>_sent``; how many rows it relayed."""
        db, sql = self._db, self._db.sql
        if not db.query(sql.count)[0][0]:
            return 0  # (a read: no write transaction when there is nothing to do)
        check_ids(db.describe, relayed=db.query(sql.highest_sent)[0][0],
                  highest=db.query(sql.seq)[0][0])  # a row id in flight now reused?
        db.write([(sql.strays, [()])])
        pending = db.query(sql.pending)
        if not pending:
            return 0
        n = len(Row._fields)
        now = self._now()
        recorded = {int(p[n]): row(p[:n]) for p in pending if p[n] is not None}
        lost = [(row(p[:n]), int(p[n + 1])) for p in pending if p[n] is None]
        live: list[tuple[Row, int]] = []
        done: list[Row] = []
        for job_id, r in recorded.items():
            try:
                st = client.stats_job(job_id)
            except JobNotFoundError:
                st = None
            if st is not None and self._parked(st):
                live.append((r, job_id))
            else:  # made live before (ready, reserved, delayed, buried, deleted)
                done.append(r)
        if lost:
            adopted = self._adopt(client, lost, set(recorded))
            db.write([(sql.record, [(job_id, r.id) for r, job_id in adopted]),
                      (sql.forget, [(r.id,) for r, _ in lost
                                    if all(r is not a for a, _ in adopted)])])
            live += adopted
        log.warning("%s: recovering %d rows of a failed batch (%d jobs to make live, "
                    "%d put again)", self, len(pending), len(live),
                    len(pending) - len(live) - len(done))
        self._go_live(client, live, now)
        self._finish(done + [r for r, _ in live])
        return len(done) + len(live)

    def _adopt(self, client: Client, lost: list[tuple[Row, int]], recorded: set[int]
               ) -> list[tuple[Row, int]]:
        """The parked jobs of ``lost`` rows whose ids were not recorded, found among the
        ids above their floors; parked jobs of this outbox that no row takes are deleted."""
        first = min(floor for _, floor in lost) + 1
        top = self._top(client)
        end = min(top, first + SCAN_LIMIT)
        if end < top:
            log.warning("%s: looking for unrecorded jobs in ids %d to %d only, not up to %d "
                        "(jobs beyond stay parked)", self, first, end - 1, top - 1)
        waiting: dict[tuple[str, int, int, bytes], list[Row]] = {}
        for r, _ in lost:
            waiting.setdefault((r.tube, r.priority, max(1, math.ceil(r.ttr)), r.body),
                               []).append(r)
        adopted: list[tuple[Row, int]] = []
        for job_id in range(first, end):
            if job_id in recorded:
                continue
            try:
                st = client.stats_job(job_id)
                if not self._parked(st):
                    continue
                peeked = client.peek(job_id)
            except JobNotFoundError:
                continue
            if peeked is None:
                continue
            rows = waiting.get((str(st["tube"]), int(st["pri"]), int(st["ttr"]), peeked.body))
            if rows:
                r = rows.pop(0)
                log.warning("%s: adopted parked job %d for row %d", self, job_id, r.id)
                adopted.append((r, job_id))
            else:
                log.warning("%s: deleted parked job %d (a duplicate no row takes)", self,
                            job_id)
                with suppress(JobNotFoundError):
                    client.delete(job_id)
        return adopted


def _skipped(r: Row, why: str) -> None:
    log.error("outbox row %d (tube %r) cannot be a beanstalkd job and is skipped: %s", r.id,
              r.tube, why)
