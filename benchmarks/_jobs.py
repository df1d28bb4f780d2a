"""Job queues (issue 14): ``k7core.jobs.JobStore`` against the job queues a Python user would
pick for local jobs, measured in the same run with the same cycle and 100-byte bodies.

Every case names itself ``jobs ...`` (``python -m benchmarks --only jobs``). Cases:

- In process, one thread, one job queue per run (fresh directory): put N jobs, then reserve +
  delete the N jobs one at a time. Each run gives three records: ``put`` (the put phase),
  ``reserve+delete`` (the second phase) and ``put+reserve+delete`` (issue 14's "full put +
  reserve + delete cycle": N jobs over the time of both phases). One job in flight at a time
  would measure a different thing (a queue that is always empty); the issue's targets are
  throughputs, so the cycle is the two phases.
- Durable puts from 100 producers: 100 threads, started before the clock and released
  together by a barrier, each putting its share; the peers that are thread-safe and durable
  share one queue object, beanstalkd gets one connection per thread.
- k7 only: reopening a store that holds 1M live jobs (100,000 with ``--quick``), and RAM per
  live job beyond the body, measured in a child process from its RSS before and after putting
  N jobs, minus N x 100 bytes; the same for beanstalkd's RSS growth for the same N jobs.

Each peer is labelled in its params with a durability class, so that ratios compare like
with like: ``"os buffered"`` (a put is in the OS's hands when it returns: it survives a crash
of the process, not a power loss) or ``"fsync per put"`` (a put is on disk when it returns).
``setting`` says how the peer gets there and ``maps`` what put / reserve / delete are.

Peers (``pip install '.[bench]'``; each one missing is skipped with a note):

- litequeue: ``put`` / ``pop`` / ``done``; WAL with ``synchronous=NORMAL``, hard-coded by
  litequeue (os buffered). Not thread-safe for several producers (one connection shared by
  every thread, ``pop`` opens ``BEGIN IMMEDIATE`` on it without a lock) and not durable, so it
  has no 100-producer case.
- persist-queue ``SQLiteAckQueue``: ``put`` / ``get`` / ``ack``, see :class:`PersistAck`.
- huey ``SqliteStorage``: ``enqueue`` / ``dequeue``, see :class:`Huey` (no acknowledgement).
- beanstalkd 1.12 with ``-b`` (binlog), a child process on a free port, spoken to by
  :class:`BeanstalkClient` (a plain socket, written here): default fsync (``-f 50``) and
  ``-f 0``. Skipped when the ``beanstalkd`` binary is not on the PATH.

The k7 side is ``k7core.jobs`` (and ``k7async.open_jobs`` for the async producers).
"""

from __future__ import annotations

import importlib
import json
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio

from k7core import jobs

from ._harness import Case, Run, Samples, Skipped, in_fresh_dirs, rate
from ._scenarios import PROC_STATUS, child_process

BODY = b"j" * 100
TUBE = "default"  # beanstalkd's and JobStore.put's default tube
PRODUCERS = 100

OS_BUFFERED = "os buffered"  # survives a crash of the process, not a power loss
FSYNC_PER_PUT = "fsync per put"  # on disk when put returns


# Record names that benchmarks/targets.py reads.
K7_INPROC = "jobs k7 JobStore [flush]"
K7_PRODUCERS = f"jobs k7 JobStore [sync], {PRODUCERS} producers"
K7_TASKS = f"jobs k7 JobStore [sync], {PRODUCERS} asyncio tasks (k7async)"
K7_RAM = "jobs k7 RAM per live job"
BEANSTALKD_RAM = "jobs peer beanstalkd -b RAM per live job"
RAM_BEYOND_BODY = "beyond the body"


def k7_reopen_name(live: int) -> str:
    return f"jobs k7 reopen {live:,} live jobs"


@dataclass(frozen=True)
class Sizes:
    peer_jobs: int  # jobs per run, every peer: put N, then reserve + delete N
    peer_producers: int  # puts per run from 100 producers, every durable peer
    k7_jobs: int  # jobs per run, k7 in process
    k7_producers: int  # puts per run from 100 producers, k7 [sync]
    reopen: int  # live jobs in the store that is reopened
    ram: int  # live jobs put for the RAM figures (k7 and beanstalkd)


QUICK = Sizes(peer_jobs=500, peer_producers=500, k7_jobs=20_000, k7_producers=10_000,
              reopen=100_000, ram=20_000)
FULL = Sizes(peer_jobs=5_000, peer_producers=2_000, k7_jobs=200_000, k7_producers=100_000,
             reopen=1_000_000, ram=200_000)


# ----------------------------------------------------------------------------- adapters

H = TypeVar("H")


class JobQueue(ABC, Generic[H]):
    """One job queue as the benchmark drives it: ``put(body)``, ``reserve()`` -> a handle
    (the queue must hold a ready job), ``delete(handle)``, ``close()``."""

    @abstractmethod
    def put(self, body: bytes) -> None: ...

    @abstractmethod
    def reserve(self) -> H: ...

    @abstractmethod
    def delete(self, handle: H) -> None: ...

    def producer(self) -> JobQueue[H]:
        """What one producer thread puts through: the queue itself when it is thread-safe,
        else a new connection (closed by the caller when it is not ``self``)."""
        return self

    def close(self) -> None:
        pass


class Litequeue(JobQueue[Any]):
    """litequeue ``LiteQueue`` (one SQLite file, WAL, ``synchronous=NORMAL`` hard-coded).
    put = ``put(body.decode())`` (litequeue stores text), reserve = ``pop()`` (marks the row
    LOCKED), delete = ``done(message_id)`` (marks it DONE; the row stays until ``prune``)."""

    def __init__(self, path: Path) -> None:
        litequeue = importlib.import_module("litequeue")  # untyped package
        self.q = litequeue.LiteQueue(str(path / "lq.sqlite3"))

    def put(self, body: bytes) -> None:
        self.q.put(body.decode())

    def reserve(self) -> Any:
        msg = self.q.pop()
        if msg is None:
            raise RuntimeError("litequeue: pop found nothing")
        return msg

    def delete(self, handle: Any) -> None:
        self.q.done(handle.message_id)

    def close(self) -> None:
        self.q.close()


class PersistAck(JobQueue[int]):
    """persist-queue ``SQLiteAckQueue(path, multithreading=True, auto_commit=True)``.
    put = ``put(body)`` (pickled), reserve = ``get(block=False, raw=True)`` (marks the row
    unack, returns its ``pqid``), delete = ``ack(id=pqid)`` (marks it acked; the row stays
    until ``clear_acked_data``).

    ``auto_commit=True``: every put, get and ack is its own committed transaction before the
    call returns (``SQLiteAckQueue`` forces it anyway: ``auto_commit=False`` only warns).
    persist-queue sets no ``synchronous`` pragma, so SQLite's default applies: FULL on this
    build (read at run time, see :func:`sqlite_default_synchronous`), an fsync of the WAL per
    commit: the durable setting, and the only one it offers. ``multithreading=True`` opens
    the connections with ``check_same_thread=False`` (a second one for puts), which threads
    other than the creator need; it does not change what a commit writes, and every case uses
    it so that the single-thread and 100-producer figures are of the same queue."""

    def __init__(self, path: Path) -> None:
        import persistqueue

        self.q = persistqueue.SQLiteAckQueue(str(path / "ackq"), multithreading=True,
                                             auto_commit=True)
        self.empty = persistqueue.Empty

    def put(self, body: bytes) -> None:
        self.q.put(body)

    def reserve(self) -> int:
        try:
            item = self.q.get(block=False, raw=True)
        except self.empty:
            raise RuntimeError("persist-queue: get found nothing") from None
        return int(item["pqid"])

    def delete(self, handle: int) -> None:
        self.q.ack(id=handle)

    def close(self) -> None:
        self.q.close()


class Huey(JobQueue[bytes]):
    """huey's ``SqliteStorage`` (the storage under ``SqliteHuey``), used directly with raw
    bodies: put = ``enqueue(body)``, reserve = ``dequeue()``.

    huey has no acknowledgement: ``dequeue`` reads the oldest task and deletes its row in the
    same transaction (a consumer killed after it loses the job). So delete maps to nothing
    (a no-op here), and huey's reserve + delete costs one commit where the peers that
    acknowledge pay two. ``fsync=None`` (huey's default) sets no ``synchronous`` pragma: SQLite's
    default applies (FULL on this build, an fsync per commit); ``fsync=False`` sets
    ``synchronous=OFF`` (os buffered). Thread-safe: one connection behind huey's own lock."""

    def __init__(self, path: Path, fsync: bool | None) -> None:
        storage = importlib.import_module("huey.storage")  # untyped package
        self.s = storage.SqliteStorage(name="bench", filename=str(path / "huey.db"),
                                       fsync=fsync)

    def put(self, body: bytes) -> None:
        self.s.enqueue(body)

    def reserve(self) -> bytes:
        data = self.s.dequeue()
        if data is None:
            raise RuntimeError("huey: dequeue found nothing")
        return bytes(data)

    def delete(self, handle: bytes) -> None:
        pass  # dequeue already deleted the row

    def close(self) -> None:
        self.s.close()


class BeanstalkError(RuntimeError):
    pass


class BeanstalkClient:
    """A plain-socket beanstalkd client: ``use``, ``put``, ``reserve-with-timeout``,
    ``delete``. One command at a time; each reply is read exactly: a line up to ``\\r\\n``
    and, after ``RESERVED <id> <bytes>``, exactly ``<bytes>`` + 2 bytes."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")

    def _line(self) -> bytes:
        line = self.rfile.readline(256)
        if not line.endswith(b"\r\n"):
            raise BeanstalkError(f"connection closed or bad reply: {line!r}")
        return line[:-2]

    def use(self, tube: str) -> None:
        self.sock.sendall(b"use %s\r\n" % tube.encode())
        reply = self._line()
        if reply != b"USING " + tube.encode():
            raise BeanstalkError(f"use: {reply!r}")

    def put(self, body: bytes, pri: int = 1024, delay: int = 0, ttr: int = 60) -> int:
        self.sock.sendall(b"put %d %d %d %d\r\n%b\r\n" % (pri, delay, ttr, len(body), body))
        reply = self._line()
        if not reply.startswith(b"INSERTED "):
            raise BeanstalkError(f"put: {reply!r}")
        return int(reply[9:])

    def reserve(self, timeout: int = 0) -> tuple[int, bytes] | None:
        self.sock.sendall(b"reserve-with-timeout %d\r\n" % timeout)
        reply = self._line()
        if reply == b"TIMED_OUT":
            return None
        parts = reply.split(b" ")
        if len(parts) != 3 or parts[0] != b"RESERVED":
            raise BeanstalkError(f"reserve: {reply!r}")
        size = int(parts[2])
        data = self.rfile.read(size + 2)
        if len(data) != size + 2 or not data.endswith(b"\r\n"):
            raise BeanstalkError(f"reserve: short or unterminated body ({len(data)} bytes)")
        return int(parts[1]), data[:-2]

    def delete(self, job_id: int) -> None:
        self.sock.sendall(b"delete %d\r\n" % job_id)
        reply = self._line()
        if reply != b"DELETED":
            raise BeanstalkError(f"delete {job_id}: {reply!r}")

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child process and reap it (SIGKILL after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class BeanstalkdServer:
    """``beanstalkd -l 127.0.0.1 -p PORT -b DIR [flags]`` as a child process, on a free port
    (the port is chosen first, so a lost race means another try); stopped by ``close``."""

    def __init__(self, binlog: Path, flags: tuple[str, ...]) -> None:
        binlog.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            self.port = _free_port()
            with open(binlog.parent / "beanstalkd.log", "ab") as log:
                self.proc = subprocess.Popen(
                    ["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port), "-b", str(binlog),
                     *flags], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            if self._wait_ready():
                return
            self.close()
        raise RuntimeError(f"beanstalkd did not start; see {binlog.parent / 'beanstalkd.log'}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # exited: most likely the port was taken meanwhile
            with suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
                return True
            time.sleep(0.01)
        return False

    def rss(self) -> int:
        """The server's resident set (bytes), from /proc/PID/status."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def close(self) -> None:
        stop(self.proc)


class Beanstalkd(JobQueue[int]):
    """beanstalkd with a binlog, through :class:`BeanstalkClient` on tube ``default``:
    put = ``put 1024 0 60 100``, reserve = ``reserve-with-timeout 0``, delete = ``delete``.
    beanstalkd writes the binlog record and, if the fsync interval has passed (``-f MS``;
    50 ms by default, every time with ``-f 0``), fsyncs before it replies."""

    def __init__(self, path: Path, flags: tuple[str, ...]) -> None:
        self.server = BeanstalkdServer(path / "binlog", flags)
        self.client = self._connect()

    def _connect(self) -> BeanstalkClient:
        client = BeanstalkClient(self.server.port)
        client.use(TUBE)
        return client

    def put(self, body: bytes) -> None:
        self.client.put(body)

    def reserve(self) -> int:
        got = self.client.reserve(0)
        if got is None:
            raise RuntimeError("beanstalkd: reserve-with-timeout 0 timed out")
        return got[0]

    def delete(self, handle: int) -> None:
        self.client.delete(handle)

    def producer(self) -> JobQueue[int]:
        return _BeanstalkConnection(self._connect())

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.server.close()


class _BeanstalkConnection(JobQueue[int]):
    """One more connection to the same server (a producer thread's own)."""

    def __init__(self, client: BeanstalkClient) -> None:
        self.client = client

    def put(self, body: bytes) -> None:
        self.client.put(body)

    def reserve(self) -> int:
        raise NotImplementedError

    def delete(self, handle: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.client.close()


def sqlite_default_synchronous() -> str:
    """The ``synchronous`` level a WAL connection gets from this SQLite build when nobody
    sets it (what persist-queue and huey's default use): FULL or NORMAL, and so on."""
    with tempfile.TemporaryDirectory() as d:
        db = sqlite3.connect(Path(d) / "probe.db")
        try:
            db.execute("PRAGMA journal_mode=WAL")
            level = db.execute("PRAGMA synchronous").fetchone()[0]
        finally:
            db.close()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))


@dataclass(frozen=True)
class Peer:
    name: str
    module: str  # import needed, for the skip note ("" = none)
    binary: str  # executable needed on the PATH, for the skip note ("" = none)
    make: Callable[[Path], JobQueue[Any]]
    durability: str  # OS_BUFFERED or FSYNC_PER_PUT
    setting: str
    maps: str
    producers: str = ""  # how 100 producers put ("" = no 100-producer case)


def peers() -> list[Peer]:
    sync = sqlite_default_synchronous()
    sync_class = FSYNC_PER_PUT if sync in ("FULL", "EXTRA") else OS_BUFFERED
    return [
        Peer("litequeue", "litequeue", "", Litequeue, OS_BUFFERED,
             "WAL, synchronous=NORMAL (hard-coded); text bodies",
             "put / pop / done (marks DONE)"),
        Peer("persist-queue SQLiteAckQueue", "persistqueue", "", PersistAck, sync_class,
             f"WAL, synchronous={sync} (SQLite default), auto_commit=True, "
             "multithreading=True; pickled bodies",
             "put / get(raw=True) / ack (marks acked)",
             producers="100 threads, one shared queue"),
        Peer("huey SqliteStorage", "huey", "", lambda p: Huey(p, None), sync_class,
             f"fsync=None (huey default): WAL, synchronous={sync} (SQLite default)",
             "enqueue / dequeue (deletes the row) / nothing (no ack)",
             producers="100 threads, one shared storage"),
        Peer("huey SqliteStorage fsync=False", "huey", "", lambda p: Huey(p, False),
             OS_BUFFERED, "fsync=False: WAL, synchronous=OFF",
             "enqueue / dequeue (deletes the row) / nothing (no ack)"),
        Peer("beanstalkd -b", "", "beanstalkd", lambda p: Beanstalkd(p, ()), OS_BUFFERED,
             "binlog, fsync at most every 50 ms (beanstalkd's default -f 50); plain socket",
             "put / reserve-with-timeout 0 / delete"),
        Peer("beanstalkd -b -f0", "", "beanstalkd", lambda p: Beanstalkd(p, ("-f", "0")),
             FSYNC_PER_PUT, "binlog, -f 0: fsync of every record before the reply; plain socket",
             "put / reserve-with-timeout 0 / delete",
             producers="100 threads, one connection each"),
    ]


# ------------------------------------------------------------------------ peer cases


def _cycle(put: Callable[[bytes], object], take: Callable[[], object], n: int,
           base: str) -> Samples:
    """Put ``n`` jobs, then ``take`` (reserve + delete) ``n``; the three records."""
    def put_all() -> None:
        for _ in range(n):
            put(BODY)

    def take_all() -> None:
        for _ in range(n):
            take()

    put_rate = rate(n, put_all)
    take_rate = rate(n, take_all)
    whole = n / (n / put_rate + n / take_rate)
    return {f"{base} put": ("jobs/s", put_rate),
            f"{base} reserve+delete": ("jobs/s", take_rate),
            f"{base} put+reserve+delete": ("jobs/s", whole)}


def _peer_params(peer: Peer, **extra: Any) -> dict[str, Any]:
    return {"body": len(BODY), **extra, "durability": peer.durability,
            "setting": peer.setting, "maps": peer.maps}


def _peer_cycle_case(peer: Peer, n: int) -> Case:
    base = f"jobs peer {peer.name}"

    def measure(d: Path) -> Samples:
        q = peer.make(d)
        try:
            reserve, delete = q.reserve, q.delete

            def take() -> None:
                delete(reserve())

            return _cycle(q.put, take, n, base)
        finally:
            q.close()

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(base, "peer", setup, _peer_params(peer, jobs=n))


def producers_rate(puts: list[Callable[[bytes], object]], per_thread: int) -> float:
    """Jobs per second of ``len(puts)`` threads each calling its ``put`` ``per_thread``
    times: the threads start first and wait on a barrier; the clock runs from their release
    to the last one's end."""
    barrier = threading.Barrier(len(puts) + 1)
    errors: list[BaseException] = []

    def work(put: Callable[[bytes], object]) -> None:
        try:
            barrier.wait()
            for _ in range(per_thread):
                put(BODY)
        except BaseException as e:  # reported by the caller
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in puts]
    for t in threads:
        t.start()
    with suppress(threading.BrokenBarrierError):  # a producer failed: reported below
        barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} producer(s) failed") from errors[0]
    return len(puts) * per_thread / elapsed


def _peer_producers_case(peer: Peer, n: int) -> Case:
    name = f"jobs peer {peer.name}, {PRODUCERS} producers"
    per = max(n // PRODUCERS, 1)

    def measure(d: Path) -> Samples:
        q = peer.make(d)
        sides: list[JobQueue[Any]] = []
        try:
            sides = [q.producer() for _ in range(PRODUCERS)]
            return {name: ("jobs/s", producers_rate([s.put for s in sides], per))}
        finally:
            for s in sides:
                if s is not q:
                    s.close()
            q.close()

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(name, "peer", setup,
                _peer_params(peer, jobs=per * PRODUCERS, producers=peer.producers))


def _beanstalkd_ram_case(n: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        # Once, here: a fresh server, one job put first (the tube and the first binlog file
        # exist), its RSS, n more jobs, its RSS. run() returns that one result.
        server = BeanstalkdServer(root / "ram" / "binlog", ())
        try:
            client = BeanstalkClient(server.port)
            try:
                client.use(TUBE)
                client.put(BODY)
                before = server.rss()
                put = client.put
                for _ in range(n):
                    put(BODY)
                after = server.rss()
            finally:
                client.close()
        finally:
            server.close()
        samples: Samples = {
            f"{BEANSTALKD_RAM} {RAM_BEYOND_BODY}": ("B/job", (after - before) / n - len(BODY)),
            f"{BEANSTALKD_RAM} (RSS growth)": ("MB", (after - before) / 1e6),
        }
        yield lambda: dict(samples)

    return Case(BEANSTALKD_RAM, "peer", setup,
                {"body": len(BODY), "jobs": n, "setting": "binlog, default -f 50",
                 "measure": "server VmRSS after - before, / jobs, - body", "runs": 1})


# ------------------------------------------------------------------------ k7 cases


def _k7_cycle_case(n: int) -> Case:
    def measure(path: Path) -> Samples:
        with jobs.JobStore(path, fsync="flush") as store:
            put = store.put  # puts to TUBE, its default (a partial with tube= would cost a
            # keyword dict per call, more than a user's store.put(body, tube=...) does)
            with store.owner() as me:
                reserve, delete, tubes = me.reserve, me.delete, (TUBE,)

                def take() -> None:
                    job = reserve(tubes=tubes, timeout=0)
                    if job is None:
                        raise RuntimeError("JobStore: reserve found nothing")
                    delete(job.id)

                return _cycle(put, take, n, K7_INPROC)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(K7_INPROC, "k7", setup,
                {"body": len(BODY), "jobs": n, "durability": OS_BUFFERED, "fsync": "flush",
                 "maps": "put / owner().reserve(timeout=0) / delete(job.id)"})


def _durable_puts_case(
    name: str, measure: Callable[[Path], Samples], per: int, producers: str
) -> Case:
    """A case of ``PRODUCERS`` producers putting ``per`` jobs each with ``"sync"``, each run
    on a new store directory."""

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    return Case(name, "k7", setup,
                {"body": len(BODY), "jobs": per * PRODUCERS, "durability": FSYNC_PER_PUT,
                 "fsync": "sync", "producers": producers})


def _k7_producers_case(n: int) -> Case:
    per = max(n // PRODUCERS, 1)

    def measure(path: Path) -> Samples:
        with jobs.JobStore(path, fsync="sync") as store:
            put = store.put  # to TUBE, its default
            return {K7_PRODUCERS: ("jobs/s", producers_rate([put] * PRODUCERS, per))}

    return _durable_puts_case(K7_PRODUCERS, measure, per, "100 threads, one shared store")


async def _tasks_put(store: Any, per: int) -> float:
    """Seconds for ``PRODUCERS`` tasks to await ``per`` puts each on a k7async job store."""

    async def producer() -> None:
        for _ in range(per):
            await store.put(BODY, tube=TUBE)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(PRODUCERS):
            tg.start_soon(producer)
    return time.perf_counter() - t0


def _k7_tasks_case(n: int) -> Case:
    """The same durable puts from 100 asyncio tasks through ``k7async.open_jobs``: one owner
    thread runs the pending puts of all tasks as one batch, one msync wait per batch."""
    per = max(n // PRODUCERS, 1)

    async def once(path: Path) -> float:
        import k7async

        async with k7async.open_jobs(path, fsync="sync") as store:
            return await _tasks_put(store, per)

    def measure(path: Path) -> Samples:
        return {K7_TASKS: ("jobs/s", per * PRODUCERS / anyio.run(once, path))}

    return _durable_puts_case(K7_TASKS, measure, per, "100 asyncio tasks, one k7async job store")


def _k7_reopen_case(live: int) -> Case:
    name = k7_reopen_name(live)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        path = root / "reopen"
        with jobs.JobStore(path, fsync="flush") as store:
            put = store.put
            for _ in range(live):
                put(BODY, tube=TUBE)

        def run() -> Samples:
            t0 = time.perf_counter()
            with jobs.JobStore(path, fsync="flush") as store:
                elapsed = time.perf_counter() - t0
                with store.owner() as me:  # it holds the jobs (the reservation ends here)
                    if me.reserve(tubes=(TUBE,), timeout=0) is None:
                        raise RuntimeError("reopened JobStore: reserve found nothing")
            return {name: ("s", elapsed)}

        yield run

    return Case(name, "k7", setup,
                {"body": len(BODY), "live_jobs": live, "fsync": "flush",
                 "measure": "JobStore(path) + __enter__, page cache warm"})


# The RAM child: a fresh process opens a store, puts one job (the tube and the log exist),
# reads its /proc/self/status, puts n jobs (one body object: no Python allocation per job)
# and reads it again. Prints one JSON line (bytes).
RAM_CHILD = r"""
import json, sys
from k7core import jobs
path, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
""" + PROC_STATUS + r"""
body = b"j" * size
with jobs.JobStore(path, fsync="flush") as store:
    put = store.put
    put(body, tube="default")
    before = status()
    for _ in range(n):
        put(body, tube="default")
    after = status()
print(json.dumps({"before": before, "after": after}))
"""


def _k7_ram_case(n: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        # Once, here, in a fresh process; run() returns that one result.
        path = root / "ram"
        try:
            with child_process(RAM_CHILD, str(path), str(n), str(len(BODY))) as child:
                assert child.stdout is not None
                out = child.stdout.read()
        finally:
            shutil.rmtree(path, ignore_errors=True)
        r = json.loads(out.decode().strip().splitlines()[-1])
        before, after = r["before"], r["after"]
        samples: Samples = {
            f"{K7_RAM} {RAM_BEYOND_BODY}":
                ("B/job", (after["VmRSS"] - before["VmRSS"]) / n - len(BODY)),
            f"{K7_RAM} (anonymous RSS)":
                ("B/job", (after["RssAnon"] - before["RssAnon"]) / n),
            f"{K7_RAM} (RSS growth)": ("MB", (after["VmRSS"] - before["VmRSS"]) / 1e6),
        }
        yield lambda: dict(samples)

    return Case(K7_RAM, "k7", setup,
                {"body": len(BODY), "jobs": n, "fsync": "flush",
                 "measure": "child VmRSS after - before, / jobs, - body (file-backed log "
                            "pages included); anonymous: RssAnon growth / jobs", "runs": 1})


# ------------------------------------------------------------------------------ cases


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    out: list[Case] = []
    skipped: list[Skipped] = []
    out += [_k7_cycle_case(s.k7_jobs), _k7_producers_case(s.k7_producers),
            _k7_tasks_case(s.k7_producers), _k7_reopen_case(s.reopen), _k7_ram_case(s.ram)]
    if not with_peers:
        return out, skipped
    for p in peers():
        missing = ""
        if p.module:
            try:
                importlib.import_module(p.module)
            except ImportError as e:
                missing = f"{p.module} not importable ({e}); pip install '.[bench]'"
        if p.binary and shutil.which(p.binary) is None:
            missing = f"{p.binary} not on the PATH (apt-get install {p.binary})"
        names = [f"jobs peer {p.name}"]
        if p.producers:
            names.append(f"jobs peer {p.name}, {PRODUCERS} producers")
        if missing:
            skipped += [Skipped(n, missing) for n in names]
            continue
        out.append(_peer_cycle_case(p, s.peer_jobs))
        if p.producers:
            out.append(_peer_producers_case(p, s.peer_producers))
    skipped.append(Skipped(f"jobs peer litequeue, {PRODUCERS} producers",
                           "not thread-safe (one connection for every thread, pop's BEGIN "
                           "IMMEDIATE without a lock) and not durable (synchronous=NORMAL)"))
    if shutil.which("beanstalkd") is None:
        skipped.append(Skipped(BEANSTALKD_RAM, "beanstalkd not on the PATH "
                                               "(apt-get install beanstalkd)"))
    else:
        out.append(_beanstalkd_ram_case(s.ram))
    return out, skipped

