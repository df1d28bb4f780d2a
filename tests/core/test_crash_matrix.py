"""The crash matrix: queue strategy x cursor strategy x where the SIGKILL lands.

One directory per combination. A ``mixed`` child (see ``tests/_children.py``) writes with
``retention="consumed"``, enqueues, polls and acks, closes and reopens, at random, printing
a phase marker before each step; the parent picks a phase (``enqueue``; ``roll``: an enqueue
that starts a new segment; ``retention``: a roll that deletes the consumed segments;
``ack``; ``close``) and a count ``k``, reads until the child's ``k``-th marker of that phase
and kills it there, mid-step. After each kill the parent reopens the queue as its writer
(recovery) and checks:

- the log is exactly ``payload(j) .. payload(n-1)`` from its earliest offset, frame after
  frame (no gap, duplicate, reorder or torn payload), and every enqueue the child reported
  as returned is in it at the offset it reported, or below the earliest offset (deleted by
  retention, which deletes only what the group consumed): a SIGKILL loses nothing that
  reached the page cache, under any strategy;
- the group's committed cursor is a frame boundary of the log, never past the frame after
  the last ``ack`` the child started, and at least the frame after the last ``ack`` it
  reported (every cursor strategy: the store is a write to the mapped file, which a SIGKILL
  does not lose); the next child resumes from it (its ``ready`` line).

``K7_CRASH_MATRIX_KILLS`` sets the kills per phase and combination (default 5: 225 kills in
all); ``K7_CRASH_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests._childproc import Child
from tests._queuehelp import check_log, frame_size, payload, read_cursor

STRATEGIES = ("flush", "async", "sync")
PHASES = ("enqueue", "roll", "retention", "ack", "close")
KILLS = int(os.environ.get("K7_CRASH_MATRIX_KILLS", "5"))
SEED = int(os.environ.get("K7_CRASH_SEED", "7"))
SEGMENT = 2048  # a roll every ~20 messages
KILLED = {"count": 0}


def _kill_once(
    qdir: Path, fsync: str, cursor: str, phase: str, k: int, seed: int, start: int
) -> tuple[int, int]:
    """One child (its next message is ``start``), killed at the ``k``-th marker of
    ``phase``; checks; returns the index of the first message retention left and the index
    after the last message (the next child's ``start``)."""
    ctx = f"[seed={SEED} {fsync}/{cursor} phase={phase} k={k}]"
    before = read_cursor(qdir, "g") if (qdir / "cursor-g.k7").exists() else 0
    with Child("mixed", str(qdir), fsync, cursor, str(SEGMENT), str(seed), str(start)) as child:
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
    found, offsets, end = check_log(qdir, fsync=fsync, segment_size=SEGMENT)
    earliest = offsets[0] if offsets else end
    reported = [int(ln.split()[1]) for ln in lines if ln.startswith(b"E ")]
    # an empty log: every message was reported, consumed and deleted (an unreported write
    # cannot have been consumed, so it would still be there)
    first = found if found is not None else max([start - 1, *reported]) + 1

    def offset_of(i: int) -> int | None:
        return offsets[i - first] if first <= i < first + len(offsets) else None

    started = acked = None  # (offset, end of its frame)
    for ln in lines:
        kind, *rest = ln.split()
        if kind == b"E":
            i, off = int(rest[0]), int(rest[1])
            if i < first:  # deleted by retention: only once consumed
                assert off < earliest, f"{ctx} enqueue {i} at {off} vanished above {earliest}"
            else:
                assert offset_of(i) == off, (
                    f"{ctx} enqueue {i} returned {off}; the recovered log has {offset_of(i)}"
                )
        elif kind == b"S":
            off, i = int(rest[0]), int(rest[1])
            assert i < first or offset_of(i) == off, f"{ctx} delivered {ln!r}"
            started = (off, off + frame_size(len(payload(i))))
        elif kind == b"A":
            assert started is not None and int(rest[0]) == started[0], f"{ctx} {ln!r}"
            acked = started
    committed = read_cursor(qdir, "g")
    boundaries = {earliest, end, *offsets}
    assert committed in boundaries, f"{ctx} cursor {committed} not a frame boundary of the log"
    if started is not None:
        assert committed <= started[1], (
            f"{ctx} cursor {committed} past the frame after the last ack started ({started})"
        )
    if acked is not None:
        assert committed >= acked[1], f"{ctx} cursor {committed} lost the reported ack {acked}"
    return first, first + len(offsets)


@pytest.mark.parametrize("cursor", STRATEGIES)
@pytest.mark.parametrize("fsync", STRATEGIES)
def test_crash_matrix(tmp_path: Path, fsync: str, cursor: str) -> None:
    rng = random.Random(f"{SEED}-matrix-{fsync}-{cursor}")
    qdir = tmp_path / "q"
    plan = [phase for phase in PHASES for _ in range(KILLS)]
    rng.shuffle(plan)
    first = start = 0
    for phase in plan:
        k = rng.randint(1, {"enqueue": 40, "roll": 3, "retention": 2, "ack": 12, "close": 2}[phase])
        first, start = _kill_once(qdir, fsync, cursor, phase, k, rng.randrange(1 << 30), start)
    assert KILLED["count"] >= len(plan)
    assert first > 0, "retention never deleted a segment: the retention phase was not tested"
