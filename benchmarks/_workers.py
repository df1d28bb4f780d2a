"""Worker throughput (issue 16): how fast a worker empties a queue with an empty consumer,
k7's workers and the Python job libraries a user would pick, side by side in the same run.

Every case names itself ``workers ...`` (``python -m benchmarks --only workers``). Each run
puts N jobs first (not timed), then times from starting the worker until it has run the
consumer on all N jobs and they are gone from the queue (deleted, or acknowledged as the
peer does it): jobs/s = N / that time. The consumer only counts (the N-th call sets an
event); payloads are a 100-byte JSON string (the k7 body is that JSON text; the peers get
the same string as their task's argument).

k7 (``group`` k7):

- ``k7core.workers.Worker`` over a ``k7core.jobs.JobStore`` of this process
  (``fsync="flush"``; and ``"sync"``, for the peers that fsync per job), 1 and 4 threads;
- ``k7async.AsyncWorker`` over ``k7async.open_jobs`` (``"flush"``), asyncio 1 and 4 tasks,
  trio 1 task;
- ``Worker("beanstalk://127.0.0.1:PORT")`` over our server (``python -m k7async.server
  -F``, a child process, as ``_server`` starts it), 1 and 4 connections.

Baseline: the same N jobs taken by a bare ``owner.reserve(timeout=0)`` + ``delete`` loop
on one thread: the store's own cost, what a worker adds is the rest.

Peers (``pip install '.[bench]'``; each one missing or unable to start is skipped with the
reason; ``--no-peers`` skips them all):

- ``Worker`` over Debian's ``beanstalkd -b`` (1 and 4 connections): our worker, their server;
- huey ``SqliteHuey`` (SQLite storage, huey's defaults) run by huey's own ``Consumer``
  with 1 and 4 worker threads (``create_consumer(workers=k)``: what ``huey_consumer``
  runs). Its workers only sleep when ``dequeue`` finds nothing, so with a full queue the
  polling never shows;
- pgqueuer 1.x on PostgreSQL (the ``pgserver`` package's binaries, a server started in a
  temporary directory for the case, default settings: ``synchronous_commit=on``):
  ``QueueManager.run()`` with its default batch size (10), psycopg 3 driver, timed until
  its queue table is empty (a finished job's row is deleted when its status is logged;
  ``mode=drain`` would add its seconds-long shutdown to the time);
- arq on a local ``redis-server`` (a child process on a free port, ``appendonly yes``,
  ``appendfsync everysec``): ``Worker(burst=True)`` with ``max_jobs=10`` (its default) and
  ``poll_delay=0`` (by default it sleeps 0.5 s after every poll of the queue, and a poll
  starts about ``max_jobs`` jobs: that would time the sleeps, not arq);
- RQ on the same redis: ``SimpleWorker.work(burst=True)`` (runs each job in the worker's
  own process; ``rq worker``'s default forks a child per job, far slower).

Each case is labelled with its durability class, as ``_jobs`` does: ``"os buffered"``
(the delete or acknowledgement is in the OS's hands when it returns: it survives a crash
of the process, not a power loss) or ``"fsync per put"`` (on disk when it returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import itertools
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from k7core import jobs, workers

from ._harness import Case, Run, Samples, Skipped, in_fresh_dirs
from ._jobs import (
    FSYNC_PER_PUT,
    OS_BUFFERED,
    BeanstalkClient,
    BeanstalkdServer,
    sqlite_default_synchronous,
    stop,
)
from ._server import K7Server, put_pipelined

PAYLOAD = "j" * 98
BODY = json.dumps(PAYLOAD).encode()  # 100 bytes: what a k7 worker puts for PAYLOAD
PUT = b"put 1024 0 60 %d\r\n%b\r\n" % (len(BODY), BODY)
TUBE = "default"  # beanstalkd's default tube: a new connection uses and watches it
DONE_TIMEOUT = 600.0  # seconds a run may take before it is called stuck

# Record names that benchmarks/targets.py reads.
K7_WORKER = "workers k7 Worker [flush], 1 thread"
K7_WORKER_SYNC = "workers k7 Worker [sync], 4 threads"
K7_ASYNC = "workers k7 AsyncWorker [flush], 1 task (asyncio)"
BARE_LOOP = "workers baseline: reserve+delete loop [flush]"


@dataclass(frozen=True)
class Sizes:
    k7_jobs: int  # jobs per run, k7 in process (and the baseline)
    server_jobs: int  # jobs per run, Worker over a beanstalkd server
    peer_jobs: int  # jobs per run, every other peer


QUICK = Sizes(k7_jobs=3_000, server_jobs=1_000, peer_jobs=300)
FULL = Sizes(k7_jobs=100_000, server_jobs=20_000, peer_jobs=3_000)


class Countdown:
    """The empty consumer's bookkeeping: :meth:`hit` once per job; ``done`` is set at the
    ``n``-th (``next`` on an ``itertools.count`` is atomic, whatever the threads)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._count = itertools.count(1)
        self.done = threading.Event()

    def hit(self) -> None:
        if next(self._count) == self.n:
            self.done.set()

    def wait(self) -> None:
        if not self.done.wait(DONE_TIMEOUT):
            raise RuntimeError(f"the worker did not run {self.n} jobs in {DONE_TIMEOUT} s")


def _until(cond: Callable[[], bool], what: str) -> None:
    """Poll ``cond`` (every 0.2 ms) until it holds: the last deletes after the last run."""
    deadline = time.monotonic() + 30
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done 30 s after the last job ran")
        time.sleep(0.0002)


@contextmanager
def _signals_kept() -> Iterator[None]:
    """Restore SIGINT, SIGTERM and SIGHUP afterwards (huey's and RQ's workers set their
    own handlers)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _params(durability: str, setting: str, **extra: Any) -> dict[str, Any]:
    return {"payload": len(BODY), **extra, "durability": durability, "setting": setting}


def _case(name: str, group: str, measure: Callable[[Path], Samples],
          params: dict[str, Any]) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(name, group, setup, params)


# ------------------------------------------------------------------------ k7 in process


def _fill(store: jobs.JobStore, n: int) -> None:
    put = store.put
    for _ in range(n):
        put(BODY, tube=TUBE)


def _k7_worker_case(n: int, threads: int, fsync: str) -> Case:
    name = f"workers k7 Worker [{fsync}], {threads} thread{'s' if threads > 1 else ''}"

    def measure(path: Path) -> Samples:
        with jobs.JobStore(path, fsync=fsync) as store:
            _fill(store, n)
            count = Countdown(n)
            w = workers.Worker(store)
            w.consumer(TUBE, lambda _: count.hit(), concurrency=threads)
            t0 = time.perf_counter()
            try:
                w.start()
                count.wait()
                _until(lambda: len(store) == 0, name)
                elapsed = time.perf_counter() - t0
            finally:
                w.close()
        return {name: ("jobs/s", n / elapsed)}

    return _case(name, "k7", measure, _params(
        OS_BUFFERED if fsync == "flush" else FSYNC_PER_PUT,
        f'JobStore(fsync="{fsync}"), Worker(store), consumer(concurrency={threads})',
        jobs=n))


def _k7_async_case(n: int, tasks: int, backend: str) -> Case:
    name = (f"workers k7 AsyncWorker [flush], {tasks} task{'s' if tasks > 1 else ''} "
            f"({backend})")

    async def once(path: Path) -> float:
        import k7async

        async with k7async.open_jobs(path, fsync="flush") as astore:
            store = astore.store
            _fill(store, n)
            done = anyio.Event()
            count = itertools.count(1)

            async def consume(_: Any) -> None:
                if next(count) == n:
                    done.set()

            w = k7async.AsyncWorker(astore)
            w.consumer(TUBE, consume, concurrency=tasks)
            t0 = time.perf_counter()
            async with w:
                with anyio.fail_after(DONE_TIMEOUT):
                    await done.wait()
                    while len(store):
                        await anyio.sleep(0)
                elapsed = time.perf_counter() - t0
            return elapsed

    def measure(path: Path) -> Samples:
        return {name: ("jobs/s", n / anyio.run(once, path, backend=backend))}

    return _case(name, "k7", measure, _params(
        OS_BUFFERED, f'k7async.open_jobs(fsync="flush"), AsyncWorker(store), '
        f"consumer(concurrency={tasks})", jobs=n))


def _bare_loop_case(n: int) -> Case:
    def measure(path: Path) -> Samples:
        with jobs.JobStore(path, fsync="flush") as store:
            _fill(store, n)
            tubes = (TUBE,)
            t0 = time.perf_counter()
            with store.owner() as me:
                reserve, delete = me.reserve, me.delete
                for _ in range(n):
                    job = reserve(tubes, timeout=0)
                    if job is None:
                        raise RuntimeError("JobStore: reserve found nothing")
                    delete(job.id)
            elapsed = time.perf_counter() - t0
        return {BARE_LOOP: ("jobs/s", n / elapsed)}

    return _case(BARE_LOOP, "baseline", measure, _params(
        OS_BUFFERED, "one owner, reserve(timeout=0) + delete(job.id), no worker", jobs=n))


# -------------------------------------------------------------- Worker over a server


def server_name(ours: bool, conns: str) -> str:
    """The record of ``Worker`` over our server (or beanstalkd) with ``conns``
    (``"1 connection"``, ``"4 connections"``)."""
    return (f"workers {'k7' if ours else 'peer'} Worker over "
            f"{'k7 server [flush]' if ours else 'beanstalkd -b'}, {conns}")


def _connections(n: int) -> str:
    return f"{n} connection{'s' if n > 1 else ''}"


def _server_case(n: int, conns: int, ours: bool) -> Case:
    name = server_name(ours, _connections(conns))

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        data = root / "data"
        data.mkdir()
        proc = K7Server(data, ("-F",)) if ours else BeanstalkdServer(data, ())
        try:
            def run() -> Samples:
                client = BeanstalkClient(proc.port)
                try:
                    put_pipelined(client, n, put=PUT)
                finally:
                    client.close()
                count = Countdown(n)
                w = workers.Worker(f"beanstalk://127.0.0.1:{proc.port}")
                w.consumer(TUBE, lambda _: count.hit(), concurrency=conns)

                def empty() -> bool:
                    tube = w.stats().get(TUBE, {})
                    return not tube.get("ready") and not tube.get("reserved")

                t0 = time.perf_counter()
                try:
                    w.start()
                    count.wait()
                    _until(empty, name)
                    elapsed = time.perf_counter() - t0
                finally:
                    w.close()
                return {name: ("jobs/s", n / elapsed)}

            yield run
        finally:
            proc.close()

    setting = ("python -m k7async.server -F (flush: in the mmap before the reply)" if ours
               else "beanstalkd -b DIR (binlog, fsync at most every 50 ms)")
    return Case(name, "k7" if ours else "peer", setup, _params(
        OS_BUFFERED, f"{setting}; Worker(\"beanstalk://...\"), consumer(concurrency={conns})"
        ", a connection per slot", jobs=n))


# ------------------------------------------------------------------------------ huey


def _huey_case(n: int, threads: int) -> Case:
    name = f"workers peer huey SqliteHuey consumer, {threads} thread{'s' if threads > 1 else ''}"
    sync = sqlite_default_synchronous()

    def measure(path: Path) -> Samples:
        from huey import SqliteHuey

        huey = SqliteHuey("bench", filename=str(path / "huey.db"))
        count = Countdown(n)

        @huey.task()  # type: ignore[untyped-decorator,unused-ignore]
        def empty(payload: str) -> None:
            count.hit()

        for _ in range(n):
            empty(PAYLOAD)
        with _signals_kept():
            consumer = huey.create_consumer(workers=threads, worker_type="thread")
            t0 = time.perf_counter()
            try:
                consumer.start()
                count.wait()
                elapsed = time.perf_counter() - t0
            finally:
                consumer.stop(graceful=True)
                huey.storage.close()
        return {name: ("jobs/s", n / elapsed)}

    return _case(name, "peer", measure, _params(
        FSYNC_PER_PUT if sync in ("FULL", "EXTRA") else OS_BUFFERED,
        f"SqliteHuey defaults (WAL, synchronous={sync}); huey's Consumer, "
        f"workers={threads}, worker_type=thread; dequeue deletes the row (no ack)", jobs=n))


# ------------------------------------------------------------------------- PostgreSQL


class Postgres:
    """A PostgreSQL server from the ``pgserver`` package in ``directory``; :meth:`close`
    stops it."""

    def __init__(self, directory: Path) -> None:
        pgserver = importlib.import_module("pgserver")  # re-exports without __all__

        self._server = pgserver.get_server(directory, cleanup_mode="stop")
        self.uri: str = self._server.get_uri()

    def close(self) -> None:
        self._server.cleanup()


def _pgqueuer_case(n: int) -> Case:
    name = "workers peer pgqueuer on PostgreSQL, batch 10"

    async def once(uri: str) -> float:
        import psycopg
        from pgqueuer import PsycopgDriver, Queries, QueueManager
        from pgqueuer.models import Job

        async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn, \
                await psycopg.AsyncConnection.connect(uri, autocommit=True) as probe:
            queries = Queries(PsycopgDriver(conn))
            await queries.enqueue(["empty"] * n, [BODY] * n, [0] * n)
            count = Countdown(n)
            qm = QueueManager(queries)

            @qm.entrypoint("empty")  # type: ignore[untyped-decorator,unused-ignore]
            async def empty(job: Job) -> None:
                count.hit()

            async def left() -> int:
                cur = await probe.execute("SELECT count(*) FROM pgqueuer")
                row = await cur.fetchone()
                return int(row[0]) if row else 0

            t0 = time.perf_counter()
            task = asyncio.create_task(qm.run())
            try:
                async with asyncio.timeout(DONE_TIMEOUT):
                    while not count.done.is_set() and not task.done():
                        await asyncio.sleep(0.001)
                    while await left() and not task.done():  # finished rows are deleted
                        await asyncio.sleep(0.001)
                elapsed = time.perf_counter() - t0
            finally:
                qm.shutdown.set()
                await task  # raises what made it stop early
            if not count.done.is_set():
                raise RuntimeError("pgqueuer: stopped before running every job")
            return elapsed

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        pg = Postgres(root / "pgdata")
        try:
            async def install() -> None:
                import psycopg
                from pgqueuer import PsycopgDriver, Queries

                async with await psycopg.AsyncConnection.connect(pg.uri,
                                                                 autocommit=True) as conn:
                    await Queries(PsycopgDriver(conn)).install()

            asyncio.run(install())
            yield lambda: {name: ("jobs/s", n / asyncio.run(once(pg.uri)))}
        finally:
            pg.close()

    return Case(name, "peer", setup, _params(
        FSYNC_PER_PUT, "PostgreSQL (pgserver) defaults, synchronous_commit=on; "
        "QueueManager.run() (batch_size=10), PsycopgDriver; timed until its table is empty",
        jobs=n))


# ------------------------------------------------------------------------------ Redis


class Redis:
    """``redis-server`` as a child process on a free port, its files in ``directory``
    (append-only file, fsync every second); :meth:`close` stops it."""

    def __init__(self, directory: Path) -> None:
        import redis

        directory.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            self.port = _free_port()
            with open(directory / "redis.log", "ab") as log:
                self.proc = subprocess.Popen(
                    ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                     "--dir", str(directory), "--appendonly", "yes",
                     "--appendfsync", "everysec", "--save", ""],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self.client = redis.Redis(port=self.port)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                with contextlib.suppress(redis.ConnectionError):
                    if self.client.ping():
                        return
                time.sleep(0.02)
            self.close()
        raise RuntimeError(f"redis-server did not start; see {directory / 'redis.log'}")

    def close(self) -> None:
        self.client.close()
        stop(self.proc)


@contextmanager
def _redis_setup(root: Path, run: Callable[[Redis], Samples]) -> Iterator[Run]:
    r = Redis(root / "redis")
    try:
        def each() -> Samples:
            r.client.flushall()
            return run(r)
        yield each
    finally:
        r.close()


_ARQ_COUNT: Countdown | None = None  # the countdown of the arq run under way


async def _arq_empty(ctx: dict[str, Any], payload: str) -> None:
    assert _ARQ_COUNT is not None
    _ARQ_COUNT.hit()


def _arq_case(n: int) -> Case:
    name = "workers peer arq on redis, max_jobs=10"

    async def once(port: int) -> float:
        global _ARQ_COUNT
        from arq import create_pool
        from arq.connections import RedisSettings
        from arq.worker import Worker, func

        settings = RedisSettings(port=port)
        pool = await create_pool(settings)
        try:
            for _ in range(n):
                await pool.enqueue_job("empty", PAYLOAD)
            _ARQ_COUNT = Countdown(n)
            w = Worker(functions=[func(_arq_empty, name="empty")], redis_pool=pool,
                       burst=True, poll_delay=0, handle_signals=False)
            t0 = time.perf_counter()
            await asyncio.wait_for(w.main(), DONE_TIMEOUT)
            elapsed = time.perf_counter() - t0  # (not w.close(): it calls the pool's
            # deprecated close(); the pool is closed below)
            if not _ARQ_COUNT.done.is_set():
                raise RuntimeError("arq: burst ended before running every job")
            return elapsed
        finally:
            _ARQ_COUNT = None
            await pool.aclose()

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with _redis_setup(root, lambda r: {name: ("jobs/s", n / asyncio.run(once(r.port)))}
                          ) as run:
            yield run

    return Case(name, "peer", setup, _params(
        OS_BUFFERED, "redis-server appendonly yes, appendfsync everysec; "
        "arq Worker(burst=True, max_jobs=10, poll_delay=0), results kept (arq default)",
        jobs=n))


_RQ_COUNT: Countdown | None = None


def _rq_empty(payload: str) -> None:
    assert _RQ_COUNT is not None
    _RQ_COUNT.hit()


def _rq_case(n: int) -> Case:
    name = "workers peer RQ SimpleWorker on redis"

    def run(r: Redis) -> Samples:
        global _RQ_COUNT
        import rq

        q = rq.Queue("bench", connection=r.client)
        for _ in range(n):
            q.enqueue(_rq_empty, PAYLOAD)
        _RQ_COUNT = Countdown(n)
        try:
            w = rq.SimpleWorker([q], connection=r.client)
            with _signals_kept():
                t0 = time.perf_counter()
                w.work(burst=True, logging_level="WARNING")
                elapsed = time.perf_counter() - t0
            if not _RQ_COUNT.done.is_set():
                raise RuntimeError("RQ: burst ended before running every job")
        finally:
            _RQ_COUNT = None
        return {name: ("jobs/s", n / elapsed)}

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with _redis_setup(root, run) as each:
            yield each

    return Case(name, "peer", setup, _params(
        OS_BUFFERED, "redis-server appendonly yes, appendfsync everysec; "
        "rq SimpleWorker.work(burst=True) (no fork per job), results kept (RQ default)",
        jobs=n))


# ------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class _Peer:
    names: tuple[str, ...]
    modules: tuple[str, ...]  # imports needed
    binary: str  # an executable needed on the PATH ("" = none)
    make: Callable[[Sizes], list[Case]]


def _peers() -> list[_Peer]:
    return [
        _Peer(tuple(server_name(False, _connections(c)) for c in (1, 4)), (), "beanstalkd",
              lambda s: [_server_case(s.server_jobs, c, ours=False) for c in (1, 4)]),
        _Peer(("workers peer huey",), ("huey",), "",
              lambda s: [_huey_case(s.peer_jobs, t) for t in (1, 4)]),
        _Peer(("workers peer pgqueuer",), ("pgserver", "psycopg", "pgqueuer"), "",
              lambda s: [_pgqueuer_case(s.peer_jobs)]),
        _Peer(("workers peer arq",), ("arq", "redis"), "redis-server",
              lambda s: [_arq_case(s.peer_jobs)]),
        _Peer(("workers peer RQ",), ("rq", "redis"), "redis-server",
              lambda s: [_rq_case(s.peer_jobs)]),
    ]


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    out = [
        _bare_loop_case(s.k7_jobs),
        _k7_worker_case(s.k7_jobs, 1, "flush"),
        _k7_worker_case(s.k7_jobs, 4, "flush"),
        _k7_worker_case(s.server_jobs, 4, "sync"),
        _k7_async_case(s.k7_jobs, 1, "asyncio"),
        _k7_async_case(s.k7_jobs, 4, "asyncio"),
    ]
    skipped: list[Skipped] = []
    if importlib.util.find_spec("trio") is not None:
        out.append(_k7_async_case(s.k7_jobs, 1, "trio"))
    else:
        skipped.append(Skipped("workers k7 AsyncWorker [flush], 1 task (trio)",
                               "trio not installed (pip install trio)"))
    out += [_server_case(s.server_jobs, c, ours=True) for c in (1, 4)]
    for p in _peers():
        missing = "--no-peers" if not with_peers else ""
        for module in p.modules if with_peers else ():
            if importlib.util.find_spec(module) is None:  # not imported here: pgqueuer warns
                missing = f"{module} not installed; pip install '.[bench]'"
                break
        if not missing and p.binary and shutil.which(p.binary) is None:
            missing = (f"{p.binary} not on the PATH (apt-get install "
                       f"{'redis-server' if p.binary == 'redis-server' else p.binary})")
        if missing:
            skipped += [Skipped(name, missing) for name in p.names]
        else:
            out += p.make(s)
    return out, skipped
