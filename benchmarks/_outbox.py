"""The transactional outbox (issue 16): relay throughput and lag, SQLite and PostgreSQL.

Every case names itself ``outbox ...`` (``python -m benchmarks --only outbox``):

- ``relay``: N rows committed beforehand (1,000 per transaction, JSON payloads of about 30
  bytes), then the time for ``relay_once()`` calls to move all of them into a new
  ``JobStore`` (``fsync="flush"``) and delete them: rows/s. Batches of 1,000 rows.
- ``lag``: the relay runs as a thread; one producer commits one row per transaction, a row
  every 2 ms, and a consumer thread reserves each job as soon as it is ready; the lag of a
  row is from the return of its commit to its reservation (wake-up included). p50 and p99
  in milliseconds. SQLite in WAL mode with ``synchronous=NORMAL`` (what a web app runs);
  the relay polls ``PRAGMA data_version`` every 5 ms. PostgreSQL wakes the relay with
  LISTEN/NOTIFY.
- ``relay sqlite to beanstalkd``: the same N rows relayed by ``BeanstalkRelay`` into Debian's
  ``beanstalkd -b DIR`` (each job put parked, its id recorded, then kicked: two round trips
  a row and three commits a batch); rows/s. Skipped where beanstalkd is not installed.
- peer: pgqueuer's own enqueue on the same PostgreSQL (its batched ``enqueue`` of N jobs,
  1,000 per call), the figure the issue compares the relay with (pgqueuer publishes 6.4k-18k
  jobs/s for it). A peer, so ``--no-peers`` skips it.

PostgreSQL is a real server, started from the ``pgserver`` wheel in a temporary directory
(``pip install '.[test]'``); without it the PostgreSQL cases are skipped with a note.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k7core import jobs, outbox

from ._harness import Case, Run, Samples, Skipped, in_fresh_dirs, percentile
from ._jobs import BeanstalkdServer
from ._workers import Postgres as PostgresServer

TUBE = "outbox"
PER_TX = 1000
LAG_PACE = 0.002


@dataclass(frozen=True)
class Sizes:
    rows: int
    lag_rows: int


QUICK = Sizes(rows=5_000, lag_rows=200)
FULL = Sizes(rows=100_000, lag_rows=2_000)


@contextmanager
def postgres(root: Path) -> Iterator[str]:
    """A PostgreSQL server (pgserver, as the workers' cases start it) in ``root``: its DSN;
    stopped after."""
    server = PostgresServer(root / "pgdata")
    try:
        yield server.uri
    finally:
        server.close()


# --- the databases -----------------------------------------------------------------------


class Sqlite:
    """An app database file with an outbox."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.box = outbox.Outbox()
        self.connect().close()  # the file and the outbox, before a relay opens it

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        self.box.create(conn)
        return conn

    def relay(self, store: jobs.JobStore) -> outbox.Relay:
        return outbox.SqliteRelay(self.path, store, batch=PER_TX)


class Postgres:
    """A database of the benchmark's PostgreSQL server, with an outbox."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn = dsn
        self.box = outbox.Outbox()
        self._psycopg = psycopg
        with psycopg.connect(dsn, autocommit=True) as conn:
            self.box.create(conn)
            conn.execute(f"TRUNCATE {outbox.DEFAULT_TABLE}, {outbox.DEFAULT_TABLE}_done")

    def connect(self) -> Any:
        return self._psycopg.connect(self.dsn)

    def relay(self, store: jobs.JobStore) -> outbox.Relay:
        return outbox.PostgresRelay(self.dsn, store, batch=PER_TX)


Db = Sqlite | Postgres


def _fill(db: Db, n: int) -> None:
    conn = db.connect()
    try:
        for start in range(0, n, PER_TX):
            for i in range(start, min(n, start + PER_TX)):
                db.box.put(conn, TUBE, {"order": i, "item": "tea"})
            conn.commit()
    finally:
        conn.close()


def _drain(relay: outbox.Relay, n: int) -> float:
    """Rows/s of ``relay_once()`` calls moving ``n`` committed rows."""
    t0 = time.perf_counter()
    done = 0
    while done < n:
        got = relay.relay_once()
        if not got:
            raise RuntimeError(f"the relay stopped at {done} of {n} rows")
        done += got
    return n / (time.perf_counter() - t0)


def _relay_rate(db: Db, path: Path, n: int) -> float:
    _fill(db, n)
    with jobs.JobStore(path / "jobs", fsync="flush") as store:
        relay = db.relay(store)
        try:
            rate = _drain(relay, n)
        finally:
            relay.close()
        if len(store) != n:
            raise RuntimeError(f"{len(store)} jobs for {n} rows")
    return rate


def _beanstalk_rate(path: Path, n: int) -> float:
    """Rows/s of ``BeanstalkRelay`` from a SQLite outbox into ``beanstalkd -b``."""
    from k7core.beanstalk import Client

    db = Sqlite(path / "app.db")
    _fill(db, n)
    server = BeanstalkdServer(path / "binlog", ())
    try:
        address = f"127.0.0.1:{server.port}"
        relay = outbox.BeanstalkRelay(db.path, address, batch=PER_TX)
        try:
            rate = _drain(relay, n)
        finally:
            relay.close()
        with Client(address, timeout=30) as c:
            ready = c.stats_tube(TUBE)["current-jobs-ready"]
        if ready != n:
            raise RuntimeError(f"{ready} ready jobs for {n} rows")
    finally:
        server.close()
    return rate


def _lags(db: Db, path: Path, n: int) -> list[float]:
    """Seconds from each commit's return to its job's reservation."""
    committed = [0.0] * n
    reserved = [0.0] * n
    with jobs.JobStore(path / "jobs", fsync="flush") as store, db.relay(store) as relay:
        owner = store.owner()

        def consume() -> None:
            for _ in range(n):
                job = owner.reserve([TUBE], timeout=30)
                if job is None:
                    return
                reserved[int(job.body[9:job.body.index(b",")])] = time.perf_counter()
                owner.delete(job.id)

        consumer = threading.Thread(target=consume)
        consumer.start()
        conn = db.connect()
        try:
            start = time.perf_counter()
            for i in range(n):
                db.box.put(conn, TUBE, {"order": i, "item": "tea"})
                conn.commit()
                committed[i] = time.perf_counter()
                pause = start + (i + 1) * LAG_PACE - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
        finally:
            conn.close()
            consumer.join()
        if relay.relayed != n or not all(reserved):
            raise RuntimeError(f"{relay.relayed} of {n} rows relayed")
    return sorted(max(0.0, r - c) for r, c in zip(reserved, committed, strict=True))


def _cases_for(kind: str, make: Callable[[Path], Any], s: Sizes, params: dict[str, Any]
               ) -> list[Case]:
    def relay_measure(path: Path) -> Samples:
        with make(path) as db:
            rate = _relay_rate(db, path, s.rows)
        return {f"outbox relay {kind}": ("rows/s", rate)}

    def lag_measure(path: Path) -> Samples:
        with make(path) as db:
            lags = _lags(db, path, s.lag_rows)
        return {f"outbox lag {kind} p50": ("ms", percentile(lags, 0.5) * 1e3),
                f"outbox lag {kind} p99": ("ms", percentile(lags, 0.99) * 1e3)}

    def setup_for(measure: Callable[[Path], Samples]) -> Callable[[Path], Any]:
        @contextmanager
        def setup(root: Path) -> Iterator[Run]:
            yield in_fresh_dirs(root, measure)
        return setup

    return [
        Case(f"outbox relay {kind}", "k7", setup_for(relay_measure),
             {**params, "rows": s.rows, "batch": PER_TX, "fsync": "flush"}),
        Case(f"outbox lag {kind}", "k7", setup_for(lag_measure),
             {**params, "rows": s.lag_rows, "pace": f"a commit every {LAG_PACE * 1e3:g} ms"}),
    ]


@contextmanager
def _sqlite_db(path: Path) -> Iterator[Sqlite]:
    yield Sqlite(path / "app.db")


def _pgqueuer_case(s: Sizes) -> Case:
    """pgqueuer's batched enqueue of N jobs (1,000 per call) on the same kind of server."""

    def measure(path: Path) -> Samples:
        import asyncio

        import psycopg
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        async def run(dsn: str) -> float:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            try:
                queries = Queries(PsycopgDriver(conn))
                await queries.install()
                payload = b'{"order": 1, "item": "tea"}'
                t0 = time.perf_counter()
                for start in range(0, s.rows, PER_TX):
                    k = min(PER_TX, s.rows - start)
                    await queries.enqueue(["receipts"] * k, [payload] * k, [0] * k)
                return s.rows / (time.perf_counter() - t0)
            finally:
                await conn.close()

        with postgres(path) as dsn:
            rate = asyncio.run(run(dsn))
        return {"outbox peer pgqueuer enqueue": ("jobs/s", rate)}

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case("outbox peer pgqueuer enqueue", "peer", setup,
                {"jobs": s.rows, "per_call": PER_TX, "driver": "psycopg async, autocommit"})


def _beanstalk_case(s: Sizes) -> Case:
    name = "outbox relay sqlite to beanstalkd"

    def measure(path: Path) -> Samples:
        return {name: ("rows/s", _beanstalk_rate(path, s.rows))}

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(name, "k7", setup, {
        "db": "SQLite WAL, synchronous=NORMAL", "rows": s.rows, "batch": PER_TX,
        "server": "beanstalkd -b DIR (binlog, fsync at most every 50 ms)"})


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    out = _cases_for("sqlite", _sqlite_db, s, {"db": "SQLite WAL, synchronous=NORMAL"})
    skipped: list[Skipped] = []
    if shutil.which("beanstalkd") is None:
        skipped.append(Skipped("outbox relay sqlite to beanstalkd", "beanstalkd not installed"))
    else:
        out.append(_beanstalk_case(s))
    try:
        import pgserver  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError as exc:
        skipped.append(Skipped("outbox ... postgres", f"needs pgserver and psycopg ({exc})"))
        return out, skipped

    @contextmanager
    def pg_db(path: Path) -> Iterator[Postgres]:
        with postgres(path) as dsn:
            yield Postgres(dsn)

    out += _cases_for("postgres", pg_db, s, {"db": "PostgreSQL 16 (pgserver)"})
    if with_peers:
        try:
            import pgqueuer  # noqa: F401
        except ImportError as exc:
            skipped.append(Skipped("outbox peer pgqueuer enqueue", f"not installed ({exc})"))
        else:
            out.append(_pgqueuer_case(s))
    return out, skipped
