"""Peers: other embedded persistent queues for Python, same payloads, same two phases.

Each run opens a fresh queue, times ``enqueue N`` (one message per call, each call durable as
far as the peer's design goes), then ``dequeue + ack N`` (one at a time), and closes it. A peer
whose package is not importable is skipped with a note (``pip install '.[bench]'``).
"""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._harness import PAYLOAD, Case, Run, Samples, Skipped, in_fresh_dirs, rate


class Adapter:
    def put(self, data: bytes) -> None:
        raise NotImplementedError

    def get_ack(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqliteWal(Adapter):
    """A plain table queue: INSERT per message; SELECT the oldest + DELETE it as the ack."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.db = sqlite3.connect(path / "q.db", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, data BLOB)")

    def put(self, data: bytes) -> None:
        self.db.execute("INSERT INTO q (data) VALUES (?)", (data,))

    def get_ack(self) -> None:
        row = self.db.execute("SELECT id, data FROM q ORDER BY id LIMIT 1").fetchone()
        self.db.execute("DELETE FROM q WHERE id = ?", (row[0],))

    def close(self) -> None:
        self.db.close()


class PersistSqliteAck(Adapter):
    def __init__(self, path: Path) -> None:
        import persistqueue

        self.q = persistqueue.SQLiteAckQueue(str(path / "ackq"), auto_commit=True)

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def get_ack(self) -> None:
        self.q.ack(self.q.get(block=False))

    def close(self) -> None:
        self.q.close()


class PersistFile(Adapter):
    def __init__(self, path: Path) -> None:
        import persistqueue

        self.q = persistqueue.Queue(str(path / "fq"), tempdir=str(path))

    def put(self, data: bytes) -> None:
        self.q.put(data)

    def get_ack(self) -> None:
        self.q.get(block=False)
        self.q.task_done()


class Queuelib(Adapter):
    def __init__(self, path: Path, kind: str) -> None:
        from queuelib import queue

        self.q = getattr(queue, kind)(str(path / "ql"))

    def put(self, data: bytes) -> None:
        self.q.push(data)

    def get_ack(self) -> None:
        self.q.pop()

    def close(self) -> None:
        self.q.close()


class DiskcacheDeque(Adapter):
    def __init__(self, path: Path, synchronous: int = 1) -> None:
        diskcache = importlib.import_module("diskcache")  # untyped package

        # sqlite_synchronous: 1 = NORMAL (diskcache's default), 2 = FULL (fsync per commit);
        # the cache is the one Deque(directory=...) makes, with that one setting changed.
        cache = diskcache.Cache(str(path / "dc"), eviction_policy="none",
                                sqlite_synchronous=synchronous)
        self.q = diskcache.Deque.fromcache(cache)

    def put(self, data: bytes) -> None:
        self.q.append(data)

    def get_ack(self) -> None:
        self.q.popleft()


class Litequeue(Adapter):
    def __init__(self, path: Path) -> None:
        litequeue = importlib.import_module("litequeue")  # untyped package

        self.q = litequeue.LiteQueue(str(path / "lq.sqlite3"))
        self.text = PAYLOAD.decode()

    def put(self, data: bytes) -> None:
        self.q.put(self.text)  # litequeue stores str

    def get_ack(self) -> None:
        self.q.done(self.q.pop().message_id)

    def close(self) -> None:
        self.q.close()


@dataclass(frozen=True)
class Peer:
    name: str
    module: str  # import needed, for the skip note
    make: Callable[[Path], Adapter]
    slow: bool  # one fsync per message: fewer messages
    note: str = ""


PEERS = [
    Peer("sqlite3 WAL sync=NORMAL", "sqlite3", lambda p: SqliteWal(p, "NORMAL"), False,
         "stdlib; commit per message, no fsync per commit"),
    Peer("sqlite3 WAL sync=FULL", "sqlite3", lambda p: SqliteWal(p, "FULL"), True,
         "stdlib; fsync per commit"),
    Peer("persist-queue SQLiteAckQueue", "persistqueue", PersistSqliteAck, False,
         "durable (its only mode: synchronous FULL); auto_commit; pickled items"),
    Peer("persist-queue Queue (file)", "persistqueue", PersistFile, False,
         "its only mode; get + task_done; pickled items"),
    Peer("queuelib FifoSQLiteQueue", "queuelib", lambda p: Queuelib(p, "FifoSQLiteQueue"),
         False, "durable (its only mode: rollback journal, FULL); pop deletes: no ack"),
    Peer("queuelib FifoDiskQueue (not crash-safe)", "queuelib",
         lambda p: Queuelib(p, "FifoDiskQueue"), False,
         "not crash-safe (state saved on close); pop = no ack"),
    Peer("diskcache Deque", "diskcache", DiskcacheDeque, False,
         "default sqlite_synchronous=NORMAL; popleft: no ack"),
    Peer("diskcache Deque sync=FULL", "diskcache", lambda p: DiskcacheDeque(p, 2), True,
         "sqlite_synchronous=FULL (durable); popleft: no ack"),
    Peer("litequeue", "litequeue", Litequeue, False,
         "its only mode (synchronous NORMAL); str payloads; pop + done"),
]


def _case(peer: Peer, n: int) -> Case:
    def measure(d: Path) -> Samples:
        q = peer.make(d)
        try:
            put, get_ack = q.put, q.get_ack

            def enq() -> None:
                for _ in range(n):
                    put(PAYLOAD)

            def deq() -> None:
                for _ in range(n):
                    get_ack()

            return {f"peer {peer.name} enqueue": ("msg/s", rate(n, enq)),
                    f"peer {peer.name} dequeue+ack": ("msg/s", rate(n, deq))}
        finally:
            q.close()

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield in_fresh_dirs(root, measure)

    params: dict[str, Any] = {"payload": 32, "messages": n}
    if peer.note:
        params["note"] = peer.note
    return Case(f"peer {peer.name}", "peer", setup, params)


def cases(n: int, n_slow: int) -> tuple[list[Case], list[Skipped]]:
    out, skipped = [], []
    for p in PEERS:
        try:
            importlib.import_module(p.module)
        except ImportError as e:
            skipped.append(Skipped(f"peer {p.name}",
                                   f"{p.module} not importable ({e}); pip install '.[bench]'"))
            continue
        out.append(_case(p, n_slow if p.slow else n))
    return out, skipped
