"""Many writer processes on one queue (issue 17): ``k7core.Queue(path, writers="shared")``
against one exclusive writer, and against the Python queues that let several processes
write (persist-queue and litequeue, both on SQLite WAL), side by side in the same run.

Every case names itself ``shared ...`` (``python -m benchmarks --only shared``). 32-byte
payloads, as the suite's other throughput cases. Each writer is a child process
(``sys.executable -c``, :data:`CHILD`): it opens the queue, prints ``ready``, waits for
``go`` on stdin, writes its messages, prints its own count and seconds. The parent waits for
every ``ready``, writes ``go`` to all of them, and times from the first ``go`` to the last
child's report: aggregate msg/s = the messages of all children / that time. Each run starts
from a fresh directory, created (and closed) by the parent before the children start; after
the children, the parent counts what the log (or table) holds and fails the run if a
message is missing or extra.

k7 (``group`` k7):

- ``shared k7 [flush] enqueue, 1 writer process, exclusive vs shared``: one writer process
  with ``writers="shared"``, one with the default (exclusive), one after the other in the
  same run (which goes first alternates from run to run), and their ratio (issue 17's
  target: shared >= 0.8 x exclusive);
- ``shared k7 [flush] enqueue, N writer processes`` and ``... enqueue_many(1000), N ...``
  for N = 1, 2, 4 (``writers="shared"``): aggregate msg/s (targets >= 2M and >= 10M at 2 and
  4 processes), and the median of the children's own rates;
- ``shared k7 [sync] enqueue, 8 writer processes vs 1``: ``fsync="sync"``, each process a
  loop of single ``enqueue`` calls; 8 shared writers, 1 shared writer and 1 exclusive
  writer, one after the other in the same run (which goes first turns from run to run),
  and the ratio of the 8 to the faster single process (target >= 5 x: one msync serves
  every process waiting at that moment), and the 8 processes' messages per msync (their
  ``stats().log_syncs`` summed).

Until ``k7core.Queue`` takes ``writers=`` (:data:`SHARED_WRITERS`), the k7 cases are
skipped with that reason.

Peers (``pip install '.[bench]'``; each missing one is skipped with a note; ``--no-peers``
skips them all), one ``put`` per message, N = 1, 2, 4 processes (and 8 for persist-queue,
the durable one, against k7's 8 ``"sync"`` processes):

- persist-queue ``SQLiteQueue(path)``: WAL (always), no ``synchronous`` pragma, so SQLite's
  default applies (FULL on this build: an fsync of the WAL per commit, its only setting:
  durable); ``auto_commit=True`` (each put its own transaction); ``multithreading=False``
  (the default: each process is one thread; ``True`` only adds a second connection for
  other threads); busy timeout 10 s (its default); pickled items.
- litequeue ``LiteQueue(path)``: WAL, ``synchronous=NORMAL`` hard-coded (os buffered; it has
  no durable setting); text items; busy timeout 5 s (``sqlite3.connect``'s default).

Neither peer has a batch put, so ``enqueue_many(1000)`` has no peer figure.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import shutil
import sqlite3
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import k7core

from ._harness import Case, Run, Samples, Skipped
from ._jobs import FSYNC_PER_PUT, OS_BUFFERED, sqlite_default_synchronous
from ._scenarios import child_process

SEGMENT = 256 << 20  # as _k7's; 4 x 1M messages of 48 bytes fit: no roll within a run
BATCH = 1000
_runs = itertools.count()  # fresh directory names

SHARED_WRITERS = "writers" in inspect.signature(k7core.Queue).parameters
"""Whether ``k7core.Queue`` takes ``writers=`` (issue 17's engine): without it the k7 cases
are skipped."""
NO_SHARED_WRITERS = ("k7core.Queue takes no writers= parameter yet (issue 17's shared "
                     "writers are not in this build)")


@dataclass(frozen=True)
class Sizes:
    enqueue: int  # messages per writer process per run, enqueue [flush]
    many: int  # messages per writer process per run, enqueue_many(1000) [flush]
    sync: int  # messages per writer process per run, enqueue [sync]
    peer: int  # messages per writer process per run, litequeue
    peer_durable: int  # messages per writer process per run, persist-queue (fsync per put)


QUICK = Sizes(enqueue=200_000, many=500_000, sync=300, peer=500, peer_durable=100)
FULL = Sizes(enqueue=1_000_000, many=1_000_000, sync=2_000, peer=5_000, peer_durable=500)

K7_PROCS = (1, 2, 4)
SYNC_PROCS = 8
PEER_PROCS = {"persist-queue SQLiteQueue": (1, 2, 4, 8), "litequeue": (1, 2, 4)}


# ---------------------------------------------------------------------- record names


def _procs(n: int) -> str:
    return f"{n} writer process{'es' if n > 1 else ''}"


ONE_WRITER = "shared k7 [flush] enqueue, 1 writer process, exclusive vs shared"
SYNC_CASE = f"shared k7 [sync] enqueue, {SYNC_PROCS} writer processes vs 1"
AGGREGATE = "aggregate"
PER_PROCESS = "per process (median)"


def shared_name(kind: str, procs: int) -> str:
    """The case of ``procs`` shared writers, ``kind`` ``"enqueue"`` or
    ``"enqueue_many(1000)"``; its records add `` aggregate`` and `` per process (median)``."""
    return f"shared k7 [flush] {kind}, {_procs(procs)}"


def peer_name(peer: str, procs: int) -> str:
    """The case of ``procs`` writer processes of a peer (``"litequeue"``,
    ``"persist-queue SQLiteQueue"``), one ``put`` per message."""
    return f"shared peer {peer} put, {_procs(procs)}"


# ---------------------------------------------------------------------- the writers

# One writer process: argv = kind, path, n, fsync, segment_size. kind: "k7-exclusive",
# "k7-shared" (then a loop of enqueue), "k7-shared-many" (enqueue_many of 1000),
# "persistqueue", "litequeue". Opens, prints "ready", waits for "go", writes n messages,
# prints {"count": ..., "seconds": ..., "syncs": ...} (syncs: k7's msyncs of the log, else null).
CHILD = r"""
import json, sys, time
kind, path, n, fsync, seg = (sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4],
                             int(sys.argv[5]))
payload = b"x" * 32
close = None
syncs = lambda: None
if kind.startswith("k7"):
    import k7core
    kw = {"writers": "shared"} if kind.startswith("k7-shared") else {}
    q = k7core.Queue(path, fsync=fsync, segment_size=seg, **kw)
    close = q.close
    syncs = lambda: q.stats().log_syncs
    if kind.endswith("-many"):
        batch, enqueue_many = [payload] * 1000, q.enqueue_many
        n = n // 1000 * 1000
        def loop():
            for _ in range(n // 1000):
                enqueue_many(batch)
    else:
        enqueue = q.enqueue
        def loop():
            for _ in range(n):
                enqueue(payload)
elif kind == "persistqueue":
    import persistqueue
    q = persistqueue.SQLiteQueue(path, auto_commit=True)
    close, put = q.close, q.put
    def loop():
        for _ in range(n):
            put(payload)
elif kind == "litequeue":
    import litequeue
    q = litequeue.LiteQueue(path + "/lq.sqlite3")
    close, put, text = q.close, q.put, payload.decode()
    def loop():
        for _ in range(n):
            put(text)
else:
    sys.exit(f"unknown writer kind {kind}")
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("no go")
t0 = time.perf_counter()
loop()
seconds = time.perf_counter() - t0
print(json.dumps({"count": n, "seconds": seconds, "syncs": syncs()}), flush=True)
close()
"""


@dataclass(frozen=True)
class Writers:
    count: int  # messages written by all the processes
    wall: float  # seconds from the first "go" to the last child's report
    rates: list[float]  # each child's own count / seconds
    syncs: int | None  # k7: the msyncs of the log by all the processes

    @property
    def aggregate(self) -> float:
        return self.count / self.wall


def run_writers(kind: str, path: Path, procs: int, n: int, fsync: str = "flush") -> Writers:
    """``procs`` writer processes of ``kind`` (see :data:`CHILD`) on ``path``, ``n``
    messages each, started together: each opens the queue and prints ``ready``; then all get
    ``go``; the clock runs from the first ``go`` to the last child's report."""
    with ExitStack() as stack:
        children = [stack.enter_context(child_process(CHILD, kind, str(path), str(n), fsync,
                                                      str(SEGMENT)))
                    for _ in range(procs)]
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a {kind} writer process did not start")
        t0 = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"a {kind} writer process exited without its report")
            reports.append(json.loads(line))
        wall = time.perf_counter() - t0
    syncs = [r["syncs"] for r in reports]
    return Writers(sum(int(r["count"]) for r in reports), wall,
                   [r["count"] / r["seconds"] for r in reports],
                   None if None in syncs else sum(int(k) for k in syncs))


def _create(kind: str, path: Path) -> None:
    """Create the queue (or database) in ``path`` and close it, before the writers start:
    the children all open an existing one."""
    if kind.startswith("k7"):
        k7core.Queue(path, fsync="flush", segment_size=SEGMENT).close()
    elif kind == "persistqueue":
        import persistqueue

        persistqueue.SQLiteQueue(str(path), auto_commit=True).close()
    else:
        litequeue = importlib.import_module("litequeue")  # untyped package
        litequeue.LiteQueue(str(path / "lq.sqlite3")).close()


def _stored(kind: str, path: Path) -> int:
    """How many messages the queue in ``path`` holds (a CRC-checked scan of k7's log; a
    ``count(*)`` of the peer's table)."""
    if kind.startswith("k7"):
        with k7core.Queue(path, readonly=True) as q:
            stored = q.count_messages(q.earliest(), q.end)
            if stored is None:
                raise RuntimeError(f"{path}: the log is unreadable")
            return stored
    db, table = ((path / "data.db", "`queue_default`") if kind == "persistqueue"
                 else (path / "lq.sqlite3", "[Queue]"))
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def measure_writers(kind: str, root: Path, procs: int, n: int,
                    fsync: str = "flush") -> Writers:
    """One run in a fresh directory under ``root`` (removed after): create the queue, run the
    writers, check that the queue holds every message they counted."""
    path = root / f"{kind}-{procs}-{next(_runs)}"
    path.mkdir()
    try:
        _create(kind, path)
        w = run_writers(kind, path, procs, n, fsync)
        stored = _stored(kind, path)
        if stored != w.count:
            raise RuntimeError(f"{kind}, {procs} writers: the queue holds {stored} messages, "
                               f"the writers wrote {w.count}")
        return w
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _samples(name: str, w: Writers) -> Samples:
    return {f"{name} {AGGREGATE}": ("msg/s", w.aggregate),
            f"{name} {PER_PROCESS}": ("msg/s", statistics.median(w.rates))}


def _params(durability: str, setting: str, procs: int, per_process: int,
            **extra: Any) -> dict[str, Any]:
    return {"payload": 32, "processes": procs, "messages_per_process": per_process,
            **extra, "durability": durability, "setting": setting}


# ---------------------------------------------------------------------- k7 cases


def _one_writer_case(n: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        turns = itertools.count()

        def run() -> Samples:
            # Each run swaps which writer goes first (the disk's writeback of one run's
            # pages meets the next one's).
            legs = ["k7-exclusive", "k7-shared"][::1 if next(turns) % 2 else -1]
            got = {kind: measure_writers(kind, root, 1, n).aggregate for kind in legs}
            exclusive, shared = got["k7-exclusive"], got["k7-shared"]
            return {f"{ONE_WRITER} writers=exclusive": ("msg/s", exclusive),
                    f"{ONE_WRITER} writers=shared": ("msg/s", shared),
                    f"{ONE_WRITER} shared/exclusive": ("x", shared / exclusive)}

        yield run

    return Case(ONE_WRITER, "k7", setup, _params(
        OS_BUFFERED, 'Queue(fsync="flush") vs Queue(fsync="flush", writers="shared"), '
        "one enqueue per message; one writer process each, in turn", 1, n,
        segment_MiB=SEGMENT >> 20))


def _k7_case(kind: str, procs: int, n: int) -> Case:
    name = shared_name(kind, procs)
    child = "k7-shared-many" if kind.startswith("enqueue_many") else "k7-shared"
    per = n // BATCH * BATCH if child.endswith("many") else n

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield lambda: _samples(name, measure_writers(child, root, procs, per))

    return Case(name, "k7", setup, _params(
        OS_BUFFERED, f'Queue(fsync="flush", writers="shared"), {kind} per call', procs, per,
        segment_MiB=SEGMENT >> 20))


def _sync_case(n: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        turns = itertools.count()
        legs = [("k7-shared", SYNC_PROCS), ("k7-shared", 1), ("k7-exclusive", 1)]

        def run() -> Samples:
            turn = next(turns) % len(legs)  # which leg goes first turns from run to run
            runs = {leg: measure_writers(leg[0], root, leg[1], n, "sync")
                    for leg in legs[turn:] + legs[:turn]}
            got = {leg: w.aggregate for leg, w in runs.items()}
            many = got[legs[0]]
            one = max(got[legs[1]], got[legs[2]])
            syncs = runs[legs[0]].syncs
            assert syncs, "the sync writers made no msync"
            return {f"{SYNC_CASE} {SYNC_PROCS} processes": ("msg/s", many),
                    f"{SYNC_CASE} {SYNC_PROCS} processes, messages per msync": (
                        "msg/msync", runs[legs[0]].count / syncs),
                    f"{SYNC_CASE} 1 process writers=shared": ("msg/s", got[legs[1]]),
                    f"{SYNC_CASE} 1 process writers=exclusive": ("msg/s", got[legs[2]]),
                    f"{SYNC_CASE} {SYNC_PROCS}/1": ("x", many / one)}

        yield run

    return Case(SYNC_CASE, "k7", setup, _params(
        FSYNC_PER_PUT, f'Queue(fsync="sync", writers="shared"), one enqueue per message: '
        f"{SYNC_PROCS} writer processes, 1 (and 1 exclusive writer), in turn; {SYNC_PROCS}/1 "
        "is against the faster single process", SYNC_PROCS, n, segment_MiB=SEGMENT >> 20))


# ---------------------------------------------------------------------- peer cases


def _peer_case(peer: str, kind: str, procs: int, n: int, durability: str,
               setting: str) -> Case:
    name = peer_name(peer, procs)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield lambda: _samples(name, measure_writers(kind, root, procs, n))

    return Case(name, "peer", setup, _params(durability, setting, procs, n))


def _peer_cases(s: Sizes) -> list[tuple[str, list[Case]]]:
    """(the module a peer needs, its cases)."""
    sync = sqlite_default_synchronous()
    pq = "persist-queue SQLiteQueue"
    return [
        ("persistqueue", [
            _peer_case(pq, "persistqueue", p, s.peer_durable,
                       FSYNC_PER_PUT if sync in ("FULL", "EXTRA") else OS_BUFFERED,
                       f"SQLiteQueue(path, auto_commit=True): WAL, synchronous={sync} (SQLite "
                       "default), a commit per put; pickled items; one queue object a process")
            for p in PEER_PROCS[pq]]),
        ("litequeue", [
            _peer_case("litequeue", "litequeue", p, s.peer, OS_BUFFERED,
                       "LiteQueue(path): WAL, synchronous=NORMAL (hard-coded), a commit per "
                       "put; text items; one queue object a process")
            for p in PEER_PROCS["litequeue"]]),
    ]


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    out: list[Case] = []
    skipped: list[Skipped] = []
    k7_names = [ONE_WRITER, *[shared_name(kind, p) for kind in ("enqueue", "enqueue_many(1000)")
                              for p in K7_PROCS], SYNC_CASE]
    if SHARED_WRITERS:
        out.append(_one_writer_case(s.enqueue))
        out += [_k7_case("enqueue", p, s.enqueue) for p in K7_PROCS]
        out += [_k7_case(f"enqueue_many({BATCH})", p, s.many) for p in K7_PROCS]
        out.append(_sync_case(s.sync))
    else:
        skipped += [Skipped(name, NO_SHARED_WRITERS) for name in k7_names]
    if not with_peers:
        return out, skipped
    for module, peer_cases in _peer_cases(s):
        if importlib.util.find_spec(module) is None:
            skipped += [Skipped(c.name, f"{module} not installed; pip install '.[bench]'")
                        for c in peer_cases]
        else:
            out += peer_cases
    return out, skipped
