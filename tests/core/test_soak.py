"""The soak (issue 7): five processes on one queue, killed with SIGKILL at random and
restarted, with retention on.

One writer (``retention="consumed"``, 64 KiB segments, a random ``fsync`` strategy per
lifetime), three readers in the groups ``g-flush``, ``g-async`` and ``g-sync`` (named after
their ``cursor_fsync``) and one ``readonly`` tail without a group, each a child process
(``_soak_children.py``). Every process lives a random time, is killed with SIGKILL, stays
down a random time and is started again, until ``K7_SOAK_SECONDS`` have passed. Then every
process is started once more, the writer is stopped cleanly, the readers and the tail read
to the end, and the parent checks:

- the log verifies: reopened as writer it is the exact run of messages from its earliest
  offset, frame after frame, up to message ``n - 1`` at the offset it must have; ``k7
  verify`` exits 0; every group's committed cursor is at the end;
- the writer: each lifetime resumed at or after the index after the last enqueue call the
  previous ones saw return (a SIGKILL loses nothing that reached the page cache), and at
  most one call beyond it;
- every group saw every message at least once, in order: each reader checked the offset
  and bytes of each message it polled, in sequence; each lifetime began at or after the
  committed index its predecessors stored and at or before the first message not yet seen
  (redelivery allowed, skipping not); together they reach message ``n - 1``;
- the tail read only correct messages, in order (checked in the tail), jumped to the
  earliest offset only when retention had deleted its next message, and reached the end;
- the queue directory never held more than ``DIR_LIMIT`` bytes (the writer stays at most
  ``LAG_CAP`` bytes ahead of the slowest group);
- the run did something: thousands of messages, every process killed, segments deleted.

The counts (messages, kills, restarts, writer strategies, redeliveries, tail jumps, largest
directory, duration) are printed (``pytest -s``) and written as JSON to ``K7_SOAK_REPORT``.

Environment: ``K7_SOAK_SECONDS`` how long processes are killed (default 60; the long soak
is ``K7_SOAK_SECONDS=7200``; at most 10,000, as the writer's ``RATE`` and the 8-digit
message index allow; below 30 the minimums are not asserted); ``K7_SOAK_SEED`` the
seed of the schedule, the strategies and the children's choices (default 7);
``K7_SOAK_REPORT`` a path for the JSON counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import k7core
from tests._childproc import DEADLINE, Child
from tests._queuehelp import check_log
from tests.core._soak_children import LAG_CAP, RATE, SEGMENT, offset_of, read_slot

SECONDS = float(os.environ.get("K7_SOAK_SECONDS", "60"))
SEED = int(os.environ.get("K7_SOAK_SEED", "7"))
PROGRAM = "tests.core._soak_children"
GROUPS = {"g-flush": "flush", "g-async": "async", "g-sync": "sync"}
LIFE = (0.2, 6.0)  # seconds a process runs before its kill (uniform)
DOWN = (0.0, 1.0)  # seconds it stays down before its restart (uniform)
TICK = 0.02  # the schedule's clock
DIR_LIMIT = 4 << 20
MAX_BATCH = 64  # the writer's largest enqueue_many


@dataclass
class Life:
    """One run of a process: its arguments, slot file and stdout lines."""

    args: list[str]
    slot: str
    lines: list[bytes] = field(default_factory=list)

    def ready(self) -> list[bytes] | None:
        """The fields of the ``ready`` line, if the process got that far."""
        return next((ln.split()[1:] for ln in self.lines if ln.startswith(b"ready")), None)


@dataclass
class Proc:
    """One of the five processes, through its lifetimes."""

    name: str
    rec: Path
    qdir: Path
    rng: random.Random
    lives: list[Life] = field(default_factory=list)
    child: Child | None = None
    due: float = 0.0  # its next kill while it runs, its next start while it is down
    kills: int = 0

    def start(self, now: float, final: bool = False) -> None:
        slot = str(self.rec / f"{self.name}-{len(self.lives):05d}.slot")
        seed = str(self.rng.randrange(1 << 30))
        if self.name == "writer":
            args = ["writer", str(self.qdir), self.rng.choice(("flush", "async", "sync")), seed]
        elif self.name == "tail":
            args = ["tail", str(self.qdir), seed, str(self.tail_next())]
        else:
            args = ["reader", str(self.qdir), self.name, GROUPS[self.name], seed]
        self.lives.append(Life(args, slot))
        self.child = Child(*args, slot, program=PROGRAM)
        self.due = float("inf") if final else now + self.rng.uniform(*LIFE)

    def tail_next(self) -> int:
        """The message the tail goes on from: where its last lifetime stopped."""
        if not self.lives:
            return 0
        got = read_slot(self.lives[-1].slot, 4)
        return got[1] if got is not None else int(self.lives[-1].args[3])

    def kill(self, now: float) -> None:
        child = self.child
        assert child is not None
        self.lives[-1].lines += child.kill_and_drain()
        assert child.proc.returncode == -signal.SIGKILL, f"{self.name}: {child.stderr()}"
        child.__exit__()
        self.child = None
        self.kills += 1
        self.due = now + self.rng.uniform(*DOWN)

    def check_alive(self) -> None:
        if self.child is not None and self.child.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} (lifetime {len(self.lives)}, {self.lives[-1].args}) exited "
                f"with {self.child.proc.returncode}; stderr:\n{self.child.stderr()}"
            )

    def send(self, command: str) -> None:
        assert self.child is not None
        self.child.send(command)

    def finish(self) -> bytes:
        """The ``done`` line, after a command; checks the clean exit."""
        child = self.child
        assert child is not None
        line = child.line()
        self.lives[-1].lines.append(line)
        assert line.startswith(b"done") and child.wait() == 0, (line, child.stderr())
        child.__exit__()
        self.child = None
        return line


@dataclass
class Disk:
    """What the parent saw of the queue directory while the soak ran."""

    max_bytes: int = 0
    bases: set[int] = field(default_factory=set)

    def sample(self, qdir: Path) -> None:
        total = 0
        for entry in os.scandir(qdir):
            with contextlib.suppress(FileNotFoundError):  # retention deleted it just now
                total += entry.stat().st_blocks * 512
            if entry.name.startswith("seg-"):
                self.bases.add(int(entry.name[4:24]))
        self.max_bytes = max(self.max_bytes, total)


def _check_writer(p: Proc, n: int) -> dict[str, int]:
    """Each lifetime resumed after everything its predecessors saw returned, and at most
    one call (``MAX_BATCH`` messages) beyond it. Returns the lifetimes per strategy."""
    returned = 0  # the index after the last message whose enqueue call returned
    per: dict[str, int] = {}
    for k, life in enumerate(p.lives):
        per[life.args[2]] = per.get(life.args[2], 0) + 1
        ready = life.ready()
        if ready is not None:
            start = int(ready[0])
            assert returned <= start <= returned + MAX_BATCH, (
                f"writer lifetime {k} resumed at {start}; earlier ones returned {returned}"
            )
            returned = start
        got = read_slot(life.slot, 1)
        if got is not None:
            assert got[0] >= returned, (k, got, returned)
            returned = got[0]
    assert returned == n, (returned, n)
    return per


def _check_group(p: Proc, n: int) -> int:
    """Every message seen at least once, in order; returns how many were seen again."""
    seen = 0  # messages 0 .. seen-1 were seen by some lifetime
    floor = 0  # the committed index some lifetime stored: the cursor never goes back
    again = 0
    for k, life in enumerate(p.lives):
        ready = life.ready()
        got = read_slot(life.slot, 3)
        ctx = f"{p.name} lifetime {k} (ready {ready}, slot {got}, seen {seen}, floor {floor})"
        if ready is not None:
            assert floor <= int(ready[0]) <= seen, f"{ctx}: resumed out of range"
        if got is None:
            continue
        first, nxt, committed = got
        assert ready is not None and first == int(ready[0]) < nxt, ctx
        assert first <= committed <= nxt, ctx
        again += seen - first
        seen, floor = max(seen, nxt), max(floor, committed)
    assert seen == n and floor == n, f"{p.name}: saw up to {seen}, committed {floor}, n={n}"
    return again


def _check_tail(p: Proc, n: int) -> dict[str, int]:
    """The tail reached the end; returns what it read and skipped."""
    read = jumps = skipped = 0
    nxt = 0
    for k, life in enumerate(p.lives):
        assert int(life.args[3]) == nxt, (k, life.args, nxt)
        got = read_slot(life.slot, 4)
        if got is None:
            continue
        begin, nxt, j, s = got
        assert begin == int(life.args[3]) and nxt - begin - s >= 0, (k, got)
        read, jumps, skipped = read + nxt - begin - s, jumps + j, skipped + s
    assert nxt == n, (nxt, n)
    return {"read": read, "jumps": jumps, "skipped": skipped}


def _run(procs: list[Proc], qdir: Path, disk: Disk) -> None:
    """Start, kill and restart the processes for ``SECONDS``."""
    t0 = time.monotonic()
    for p in procs:
        p.start(t0)
    while (now := time.monotonic()) < t0 + SECONDS:
        for p in procs:
            p.check_alive()
            if now < p.due:
                continue
            if p.child is not None:
                p.kill(now)
            else:
                p.start(now)
        disk.sample(qdir)
        time.sleep(TICK)  # the schedule's pace, not a synchronisation


@pytest.mark.timeout(int(SECONDS) + 300)
def test_soak(tmp_path: Path) -> None:
    assert RATE * SECONDS < 10**8, "payload(i) names i in 8 digits: K7_SOAK_SECONDS too long"
    t0 = time.monotonic()
    qdir, rec = tmp_path / "q", tmp_path / "rec"
    rec.mkdir()
    # The groups exist before anything is written: "consumed" retention waits for them all.
    with k7core.Queue(qdir, fsync="flush", segment_size=SEGMENT, retention="consumed") as q:
        for name, mode in GROUPS.items():
            q.consumer_group(name, cursor_fsync=mode).close()
    procs = [Proc(name, rec, qdir, random.Random(f"{SEED}-soak-{name}"))
             for name in ("writer", *GROUPS, "tail")]
    writer, *readers, tail = procs
    disk = Disk()
    try:
        _run(procs, qdir, disk)
        now = time.monotonic()
        for p in procs:  # the last lifetimes run to the end
            if p.child is None:
                p.start(now, final=True)
            p.due = float("inf")
        for p in procs:
            assert p.child is not None
            p.lives[-1].lines.append(p.child.line())
            assert p.lives[-1].lines[-1].startswith(b"ready"), p.lives[-1].lines
        writer.send("stop")
        n = int(writer.finish().split()[1])
        for p in (*readers, tail):
            p.send(f"drain {n}")
        done = {p.name: p.finish() for p in (*readers, tail)}
    finally:
        for p in procs:
            if p.child is not None:
                p.child.__exit__()
    disk.sample(qdir)
    end = offset_of(n)

    first, offsets, log_end = check_log(qdir, fsync="flush", segment_size=SEGMENT)
    assert log_end == end, (log_end, end, n)
    if offsets:
        assert first is not None and first + len(offsets) == n and offsets[0] == offset_of(first)
    verify = subprocess.run([sys.executable, "-m", "k7core", "verify", str(qdir)],
                            capture_output=True, text=True, timeout=DEADLINE)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with k7core.Queue(qdir, readonly=True) as q:
        st = q.stats()
    assert {g.name: g.committed for g in st.groups} == dict.fromkeys(GROUPS, end)
    for name in GROUPS:
        assert done[name] == b"done %d" % end, done
    assert done["tail"] == b"done %d" % n, done

    per_fsync = _check_writer(writer, n)
    again = {p.name: _check_group(p, n) for p in readers}
    tail_counts = _check_tail(tail, n)
    deleted = len({b for b in disk.bases if b < st.earliest_offset})
    report = {
        "seed": SEED,
        "seconds": SECONDS,
        "duration_s": round(time.monotonic() - t0, 1),
        "messages": n,
        "log_bytes": end,
        "segments": len(disk.bases),
        "segments_deleted": deleted,
        "earliest_offset_at_end": st.earliest_offset,
        "max_dir_bytes": disk.max_bytes,
        "kills": {p.name: p.kills for p in procs},
        "starts": {p.name: len(p.lives) for p in procs},
        "writer_lifetimes_by_fsync": per_fsync,
        "writer_resumed_on_empty_log": sum(
            (r := life.ready()) is not None and r[1] == b"empty" for life in writer.lives
        ),
        "redelivered": again,
        "tail": tail_counts,
    }
    print("\nsoak report:", json.dumps(report))
    if path := os.environ.get("K7_SOAK_REPORT"):
        Path(path).write_text(json.dumps(report, indent=2) + "\n")

    assert disk.max_bytes <= DIR_LIMIT, f"the directory grew to {disk.max_bytes} bytes"
    assert DIR_LIMIT > 2 * LAG_CAP
    if SECONDS >= 30:  # the soak did what it is for
        assert n >= 100 * SECONDS, report
        assert all(p.kills >= 1 for p in procs), report
        assert deleted >= 1 and st.earliest_offset > 0, report
        assert tail_counts["read"] > 0, report
