"""Kill tests of the relays (must 10 and 11): a child process relays an outbox into a job
store while this process commits rows (and rolls some back) from another thread; the child
is SIGKILLed again and again, at random moments and at chosen calls of the store (before
or after its n-th put, forget or mark: between claim, put, delete and commit, and between
commit and forget), and restarted. At the end a clean relay drains the outbox and every
committed row is in the store exactly once, no rolled-back row is, and nothing stays
remembered."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from k7core.jobs import JobStore
from k7core.outbox import Outbox
from tests._childproc import Child
from tests.k7core.outbox._outboxhelp import TUBE, App, relay_all, setup, take_all

CHILD = "tests.k7core.outbox._outboxchild"
ROUNDS = 24
ROUND_LIMIT = 90.0  # seconds a child that should die at a store call may run (< 1 s here)
KILLS = {  # the store's calls a child may die at, per database
    "sqlite": ["put-before", "put-after", "mark-before", "mark-after"],
    "pg": ["put-before", "put-after", "forget-before", "forget-after"],
}


class Writer(threading.Thread):
    """Commits rows of payload ``{"n": i}`` (every third with key ``k<i>``) in transactions
    of one to four rows, and rolls back about one transaction in five, or the part after a
    savepoint, until stopped; ``committed`` and ``rolled_back`` are the payloads' ``i``."""

    def __init__(self, kind: str, where: str, box: Outbox, seed: str) -> None:
        super().__init__(name="outbox-writer")
        self.kind, self.where, self.box, self.rng = kind, where, box, random.Random(seed)
        self.committed: list[int] = []
        self.rolled_back: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def put(self, i: int) -> None:
        self.box.put(self.app.conn, TUBE, {"n": i}, key=f"k{i}" if i % 3 == 0 else None)

    def run(self) -> None:
        self.app = App(self.kind, self.where)
        try:
            i = 0
            while not self.stop.is_set():
                rows = list(range(i, i + self.rng.randint(1, 4)))
                i = rows[-1] + 1
                kept = rows
                for n in rows:
                    self.put(n)
                choice = self.rng.random()
                if choice < 0.1:  # a rollback to a savepoint: the last row is not kept
                    self.app.execute("SAVEPOINT s")
                    self.put(i)
                    self.app.execute("ROLLBACK TO SAVEPOINT s")
                    self.rolled_back.append(i)
                    i += 1
                if choice > 0.8:
                    self.app.rollback()
                    self.rolled_back += rows
                else:
                    self.app.commit()
                    self.committed += kept
                self.stop.wait(self.rng.random() * 0.004)
        except BaseException as exc:  # the test fails with it
            self.error = exc
        finally:
            self.app.close()


def run_child(kind: str, where: str, store: Path, rng: random.Random, round_: int
              ) -> tuple[str, int]:
    """One life of a relay child: killed by this process after a random number of puts,
    or by its own store at a chosen call. Returns how it died and how many puts returned."""
    batch = rng.choice([1, 2, 3, 5, 8])
    relays = rng.choice([1, 2]) if kind == "pg" else 1
    if round_ % 2:
        call = rng.choice(KILLS[kind])
        n = rng.randint(1, 3 * batch) if call.startswith("put") else rng.randint(1, 5)
        kill = f"{call}:{n}"
    else:
        kill = "none"
    with Child("relay", kind, where, str(store), str(batch), str(relays), kill,
               program=CHILD) as child:
        assert child.line() == b"ready"
        if kill == "none":
            lines = [child.line() for _ in range(rng.randint(1, 4 * batch))]
            time.sleep(rng.random() * 0.002)  # a random moment in the next batch
            lines += child.kill_and_drain()
        else:
            lines = child.lines_until_exit(total=ROUND_LIMIT)
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
        assert "Traceback" not in child.stderr(), child.stderr()
    assert all(line.startswith(b"P ") for line in lines), lines
    return kill, len(lines)


def check_drained(kind: str, store: JobStore, writer: Writer) -> None:
    jobs = take_all(store)
    seen = Counter(json.loads(job.body)["n"] for job in jobs)
    twice = sorted(n for n, c in seen.items() if c > 1)
    assert not twice, f"rows relayed more than once: {twice[:20]}"
    missing = sorted(set(writer.committed) - set(seen))
    assert not missing, f"committed rows never relayed: {missing[:20]}"
    rolled = sorted(set(writer.rolled_back) & set(seen))
    assert not rolled, f"rolled-back rows relayed: {rolled[:20]}"
    assert set(seen) == set(writer.committed)
    for job in jobs:  # the row's key, or (PostgreSQL) the outbox's name and the row id
        n = json.loads(job.body)["n"]
        if n % 3 == 0:
            assert job.key == f"k{n}"
        else:
            assert job.key is None if kind == "sqlite" else (job.key or "").startswith(
                "outbox-"), job.key
    assert store.remembered(TUBE) == []
    assert len(store) == 0


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_a_relay_killed_anywhere_relays_each_committed_row_once(
        kind: str, db_path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    where = str(db_path) if kind == "sqlite" else request.getfixturevalue("dsn")
    app = App(kind, where)
    request.addfinalizer(app.close)  # closed if the test fails too
    if kind == "sqlite":
        app.execute("PRAGMA journal_mode = wal")
    box = setup(app)
    rng = random.Random(f"outbox-kill-{kind}")
    writer = Writer(kind, where, box, f"writer-{kind}")
    path = tmp_path / "jobs"
    deaths: Counter[str] = Counter()
    puts = 0
    writer.start()
    try:
        for round_ in range(ROUNDS):
            assert writer.error is None
            kill, n = run_child(kind, where, path, rng, round_)
            deaths[kill.partition(":")[0]] += 1
            puts += n
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None
    app.rollback()
    assert len(writer.committed) > 200 and writer.rolled_back
    assert puts > 50, "the children relayed"
    with JobStore(path, fsync="flush") as store:
        relay = app.relay(store, batch=50)
        with closing(relay):
            relay_all(relay)
        check_drained(kind, store, writer)
    if kind == "pg":
        with psycopg.connect(where) as conn:
            assert conn.execute("SELECT count(*) FROM k7_outbox_done").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM k7_outbox").fetchone() == (0,)
    else:
        with closing(sqlite3.connect(where)) as conn:
            assert conn.execute("SELECT count(*) FROM k7_outbox").fetchone() == (0,)
    assert set(deaths) == {"none", *KILLS[kind]}, deaths
