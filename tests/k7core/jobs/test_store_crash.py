"""Crash tests of the job store: a real child process (``_storechild.py``) calls a JobStore
at random and reports each call before it starts and after it returned; the parent SIGKILLs
it and reopens the store, again and again on the same directory.

After each kill the reopened store must hold exactly what the returned calls made, where
the one call in flight at the kill may have happened or not:

- every job whose put returned is there, with its body, unless its delete returned; no job
  whose delete returned comes back; no other job appears (but the put in flight's);
- a job reserved at the kill is ready; a released one ready or delayed as released; a buried
  one buried, with every error text its releases and buries gave, in order;
- ids are never reused: every put that returns after a reopen gets an id above every id
  seen before;
- the store opens from a whole snapshot (none skipped) and the journal after it.

A SIGKILL keeps the page cache, so all three ``fsync`` strategies must keep every returned
call (docs/durability.md). ``snapshot_bytes`` is tiny, so the snapshotter runs all the time
and random kills land in snapshots too; then kills at chosen points of a snapshot (the
snapshot file half written, renamed but the old ones not deleted, the journal trim about
to delete segments, or done with it) by a child that blocks there.

``K7_JOBS_CRASH_KILLS`` sets the random kills per strategy (default 30) and
``K7_JOBS_CRASH_HOOK_KILLS`` the kills per snapshot point (default 4); ``K7_CRASH_SEED``
the seed. Each test prints its counts.
"""

from __future__ import annotations

import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from k7core.jobs import Job, JobState, JobStore
from tests._childproc import Child
from tests.k7core.jobs._storechild import DELAY, TUBE, body

PROGRAM = "tests.k7core.jobs._storechild"
SEED = int(os.environ.get("K7_CRASH_SEED", "7"))
KILLS = int(os.environ.get("K7_JOBS_CRASH_KILLS", "30"))
HOOK_KILLS = int(os.environ.get("K7_JOBS_CRASH_HOOK_KILLS", "4"))
READY, DELAYED, BURIED = JobState.READY, JobState.DELAYED, JobState.BURIED


@dataclass(frozen=True)
class Expect:
    """A job as it must be after a reopen."""

    body: bytes
    state: JobState
    errors: tuple[str, ...] = ()


@dataclass
class Ledger:
    """What the returned calls made, across the children of one directory."""

    jobs: dict[int, Expect] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    max_id: int = 0
    calls: int = 0
    kills: int = 0
    mid_snapshot: int = 0
    """Kills that left a snapshot's temporary file (the snapshot was being written)."""

    def apply(self, line: list[str], started: list[str], seed: int, size: int) -> None:
        """A result line, with the ``S`` line of its call."""
        kind = line[0]
        self.calls += 1
        if kind == "P":
            job_id = int(line[2])
            assert job_id > self.max_id, f"put got id {job_id}, not above {self.max_id}"
            self.max_id = job_id
            state = DELAYED if float(started[2]) else READY
            self.jobs[job_id] = Expect(body(seed, int(line[1]), size), state)
        elif kind in ("R", "N") or int(line[1]) == 0:
            pass  # a reservation is not stored (ready after a reopen); a snapshot changes none
        elif kind in ("D", "X"):
            del self.jobs[int(line[1])]
            self.deleted.add(int(line[1]))
        else:
            job_id = int(line[1])
            self.jobs[job_id] = after(self.jobs[job_id], started)

    def check(self, store: JobStore, in_flight: list[str] | None, seed: int,
              size: int) -> None:
        """The reopened store against the ledger, then the ledger from the store."""
        assert store.skipped_snapshots == [], store.skipped_snapshots
        assert not list(store.path.glob("*.tmp")), "open leaves a dead snapshot's temp file"
        live = {job.id: job for job in store._machine.jobs()}
        maybe: dict[int, Expect] = {}  # the call in flight, as if it had returned
        if in_flight is not None and in_flight[1] == "P":
            maybe[-1] = Expect(body(seed, int(in_flight[2]), size),
                               DELAYED if float(in_flight[3]) else READY)
        elif in_flight is not None and in_flight[1] in "DXLBK":
            job_id = int(in_flight[2])
            if in_flight[1] in "LBK":
                maybe[job_id] = after(self.jobs[job_id], in_flight[1:])
        for job_id, want in self.jobs.items():
            job = live.get(job_id)
            if job is None and in_flight is not None and in_flight[1] in "DX" and int(
                    in_flight[2]) == job_id:
                continue  # its delete was in flight, and happened
            assert job is not None, f"job {job_id} ({want}) is gone"
            assert as_expect(job) in (want, maybe.get(job_id)), (job_id, job, want)
        for job_id in self.deleted:
            assert job_id not in live, f"deleted job {job_id} came back"
        extra = sorted(set(live) - set(self.jobs))
        if extra:  # only the put in flight may have stored a job nobody was told of
            assert len(extra) == 1 and -1 in maybe, (extra, in_flight)
            assert as_expect(live[extra[0]]) == maybe[-1] and extra[0] > self.max_id
        self.jobs = {i: as_expect(job) for i, job in live.items()}
        self.max_id = max([self.max_id, *live])


def after(job: Expect, started: list[str]) -> Expect:
    """``job`` after the release, bury or kick-job of an ``S`` line (without the ``S``)."""
    kind = started[0]
    if kind == "L":
        state = DELAYED if float(started[2]) else READY
        return Expect(job.body, state, (*job.errors, started[3])[-16:])
    if kind == "B":
        return Expect(job.body, BURIED, (*job.errors, started[2])[-16:])
    assert kind == "K", started
    return Expect(job.body, READY, job.errors)


def as_expect(job: Job) -> Expect:
    assert job.tube == TUBE
    assert job.state is not JobState.RESERVED, f"job {job.id} is reserved after a reopen"
    if job.state is DELAYED:
        assert job.delay == DELAY
    return Expect(job.body, job.state, job.errors)


def run_child(path: Path, ledger: Ledger, fsync: str, snapshot_bytes: int, seed: int,
              size: int, rng: random.Random, hook: str = "none", k: int = 0) -> int:
    """One child, killed after a random number of lines (``hook``: after it blocked at
    its hook, plus a few lines if the calls go on there). Returns how many lines it wrote."""
    with Child(path.as_posix(), fsync, str(snapshot_bytes), str(seed), str(size), hook,
               str(k), program=PROGRAM) as child:
        assert child.line() == b"ready"
        lines: list[bytes] = []
        if hook == "none":
            for _ in range(rng.randint(1, 600)):
                lines.append(child.line())
        else:
            while not lines or not lines[-1].startswith(b"H "):
                assert len(lines) < 2_000_000, f"the child never reached {hook}"
                lines.append(child.line())
            assert lines[-1] == b"H " + hook.encode()
            if hook.startswith("snap-"):  # only the snapshotter is stopped
                for _ in range(rng.randint(0, 50)):
                    lines.append(child.line())
        lines += child.kill_and_drain()
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
    ledger.kills += 1
    started: list[str] | None = None
    for raw in lines:
        line = raw.decode().split()
        if line[0] == "S":
            assert started is None, f"two calls in flight: {started} {line}"
            started = line
        elif line[0] != "H":
            assert started is not None and started[1] == line[0], (started, line)
            ledger.apply(line, started[1:], seed, size)
            started = None
    ledger.mid_snapshot += bool(list(path.glob("snapshot-*.tmp")))
    with JobStore(path, fsync=fsync, snapshot_bytes=snapshot_bytes) as store:
        ledger.check(store, started, seed, size)
    return len(lines)


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_random_kills(tmp_path: Path, fsync: str) -> None:
    path = tmp_path / "store"
    rng = random.Random(f"{SEED}-{fsync}")
    ledger = Ledger()
    lines = 0
    for i in range(KILLS):
        lines += run_child(path, ledger, fsync, 2048, SEED * 1000 + i, 64, rng)
    snapshots = len(list(path.glob("snapshot-*.k7jobs")))
    print(f"\njobs crash [{fsync}]: {ledger.kills} kills ({ledger.mid_snapshot} while a "
          f"snapshot file was being written), {ledger.calls} returned calls checked, {lines} "
          f"lines, {len(ledger.jobs)} live jobs at the end, {snapshots} snapshots on disk")
    assert ledger.calls > KILLS * 20


@pytest.mark.parametrize("hook", ["snap-mid", "snap-renamed", "trim-before", "trim-after"])
def test_kills_inside_a_snapshot(tmp_path: Path, hook: str) -> None:
    """Killed at a chosen point of a snapshot, repeatedly on one directory. 8 KiB bodies
    fill journal segments (16 MiB) fast, so that trims delete segments."""
    path = tmp_path / "store"
    rng = random.Random(f"{SEED}-{hook}")
    ledger = Ledger()
    fsyncs = ["flush", "async", "sync"]
    trim = hook.startswith("trim")
    for i in range(HOOK_KILLS):
        k = rng.randint(1, 2) if trim else rng.randint(1, 8)
        run_child(path, ledger, fsyncs[i % 3], 16 << 10, SEED * 1000 + i, 8192, rng,
                  hook=hook, k=k)
    print(f"\njobs crash [{hook}]: {ledger.kills} kills, {ledger.calls} returned calls "
          f"checked")
    if hook == "snap-mid":
        assert ledger.mid_snapshot == ledger.kills
