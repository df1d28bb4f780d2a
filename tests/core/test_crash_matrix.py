"""The crash matrix: queue strategy x cursor strategy x where the SIGKILL lands.

One directory per combination. A ``mixed`` child (see ``_children.py``) enqueues, polls and
acks, closes and reopens, at random, printing a phase marker before each step; the parent
picks a phase (``enqueue``, ``roll``: an enqueue that starts a new segment, ``ack``,
``close``) and a count ``k``, reads until the child's ``k``-th marker of that phase and kills
it there, mid-step. After each kill the parent reopens the queue as its writer (recovery)
and checks:

- the log is exactly ``payload(0) .. payload(n-1)``, frame after frame (no gap, duplicate,
  reorder or torn payload), and every enqueue the child reported as returned is in it at
  the offset it reported: a SIGKILL loses nothing that reached the page cache, under any
  strategy;
- the group's committed cursor is a frame boundary within the log, never past the frame
  after the last ``ack`` the child started, and (cursor ``"sync"`` and ``"flush"``, and
  ``"async"`` too since the store is a plain write to the mapped file) at least the frame
  after the last ``ack`` it reported; the next child resumes from it (its ``ready`` line).

``K7_CRASH_MATRIX_KILLS`` sets the kills per phase and combination (default 6: 216 kills in
all); ``K7_CRASH_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
import signal
import struct
from pathlib import Path

import pytest
from _childproc import Child, frame_size, payload

import k7core

STRATEGIES = ("flush", "async", "sync")
PHASES = ("enqueue", "roll", "ack", "close")
KILLS = int(os.environ.get("K7_CRASH_MATRIX_KILLS", "6"))
SEED = int(os.environ.get("K7_CRASH_SEED", "7"))
SEGMENT = 2048  # a roll every ~20 messages
KILLED = {"count": 0}


def _check_log(qdir: Path, fsync: str) -> tuple[list[int], int]:
    """Recover as the writer would; the offsets of payload(0..n-1) and the end of the log."""
    offsets: list[int] = []
    with k7core.Queue(qdir, fsync=fsync, segment_size=SEGMENT) as q:
        off = 0
        while True:
            batch = q.read_columnar(off)
            if not len(batch):
                break
            for k in range(len(batch)):
                i = len(offsets)
                got = bytes(batch.payload(k))
                assert got == payload(i), f"message {i}: {got[:24]!r} != {payload(i)[:24]!r}"
                offsets.append(int(batch.offsets[k]))
            off = batch.next
        expect = 0
        for i, o in enumerate(offsets):
            # one contiguous logical log: a segment is sealed where the next frame did not
            # fit, and the next segment's base is that position
            assert o == expect, f"message {i} at {o}, expected {expect} (gap or overlap)"
            expect = o + frame_size(len(payload(i)))
        return offsets, q.end


def _read_cursor(qdir: Path) -> int:
    with open(qdir / "cursor-g.k7", "rb") as f:
        return int(struct.unpack(">q", f.read(8))[0])


def _kill_once(qdir: Path, fsync: str, cursor: str, phase: str, k: int, seed: int) -> None:
    ctx = f"[seed={SEED} {fsync}/{cursor} phase={phase} k={k}]"
    before = _read_cursor(qdir) if (qdir / "cursor-g.k7").exists() else 0
    with Child("mixed", str(qdir), fsync, cursor, str(SEGMENT), str(seed)) as child:
        ready = child.line().split()
        assert ready[0] == b"ready" and int(ready[2]) == before, f"{ctx} resumed at {ready}"
        seen = 0
        lines: list[bytes] = []
        while seen < k:
            assert len(lines) < 100_000, f"{ctx} the child never reached phase {phase}"
            ln = child.line()
            lines.append(ln)
            seen += ln == b"P " + phase.encode()
        lines += child.kill_and_drain()
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
    KILLED["count"] += 1
    offsets, end = _check_log(qdir, fsync)
    index = {o: i for i, o in enumerate(offsets)}
    after = {o: o + frame_size(len(payload(i))) for i, o in enumerate(offsets)}
    started = acked = None
    for ln in lines:
        kind, *rest = ln.split()
        if kind == b"E":
            i, off = int(rest[0]), int(rest[1])
            assert i < len(offsets) and offsets[i] == off, (
                f"{ctx} enqueue {i} returned {off} but the recovered log has "
                f"{offsets[i] if i < len(offsets) else 'no such message'}"
            )
        elif kind == b"S":
            started = int(rest[0])
            assert started in index, f"{ctx} delivered {started}, not a frame"
        elif kind == b"A":
            acked = int(rest[0])
        elif kind == b"ready":  # a reopen inside this child: its cursor is where it resumed
            assert int(rest[1]) in after.values() or int(rest[1]) == 0, f"{ctx} {ln!r}"
    committed = _read_cursor(qdir)
    boundaries = {0, end, *offsets, *after.values()}
    assert committed in boundaries and committed <= end, f"{ctx} cursor {committed} (end {end})"
    if started is not None:
        assert committed <= after[started], (
            f"{ctx} cursor {committed} past the frame after the last ack started ({started})"
        )
    if acked is not None:
        assert committed >= after[acked], (
            f"{ctx} cursor {committed} lost the reported ack of {acked}"
        )


@pytest.mark.parametrize("cursor", STRATEGIES)
@pytest.mark.parametrize("fsync", STRATEGIES)
def test_crash_matrix(tmp_path: Path, fsync: str, cursor: str) -> None:
    rng = random.Random(f"{SEED}-matrix-{fsync}-{cursor}")
    qdir = tmp_path / "q"
    plan = [phase for phase in PHASES for _ in range(KILLS)]
    rng.shuffle(plan)
    for phase in plan:
        k = rng.randint(1, {"enqueue": 40, "roll": 3, "ack": 12, "close": 2}[phase])
        _kill_once(qdir, fsync, cursor, phase, k, rng.randrange(1 << 30))
    assert KILLED["count"] >= len(plan)
