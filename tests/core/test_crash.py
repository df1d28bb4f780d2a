"""Crash tests: real child processes killed with SIGKILL mid-stream (docs/reliability.md,
"Crashes").

A writer child enqueues self-identifying messages (``tests._queuehelp.payload``) and reports
each offset once ``enqueue`` returned; the parent kills it after a random number of report lines
(fixed seed per test, so a failure reproduces; override with ``K7_CRASH_SEED``), reopens the
queue as writer and reads the whole log with a consumer group. What must hold:

- the log is an exact prefix of the written sequence: payload ``i`` at position ``i``, each
  frame right after the previous one (no gap, no reorder, no duplicate, no torn payload);
- ``"sync"`` and ``"flush"``: every offset reported before the kill is there with its payload
  (a SIGKILL does not lose the page cache, so ``"flush"`` keeps what it wrote too);
  ``"async"``: only the prefix property (and whatever survived matches its reported offset);
- reopening works and a further ``enqueue`` lands at the end and reads back.

Each strategy is killed several times on the same directory, so recovery after a crash is
itself crashed again. A consumer-group child is killed the same way to check the cursor.
Parents synchronise on pipe reads only; children are always killed and reaped in ``finally``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

import k7core
from tests._childproc import Child
from tests._queuehelp import drain, frame_size, payload, read_cursor

STRATEGIES = ("flush", "async", "sync")
SEED = int(os.environ.get("K7_CRASH_SEED", "7"))


def rng_for(name: str) -> random.Random:
    return random.Random(f"{SEED}-{name}")


# --------------------------------------------------------------------------------------
# writer crashes
# --------------------------------------------------------------------------------------


def crash_writer(
    qdir: Path,
    fsync: str,
    seg: int,
    start: int,
    kill_after: int,
    lo: int,
    hi: int,
    batch: int = 1,
) -> dict[int, int]:
    """Run a writer child from message ``start``; SIGKILL it after ``kill_after`` report
    lines (0: right after it said it is opening the queue). Returns {index: offset}
    for every enqueue the child reported as returned."""
    reported: dict[int, int] = {}
    with Child(
        "write",
        str(qdir),
        fsync,
        str(seg),
        str(start),
        str(10**7),
        str(lo),
        str(hi),
        "1",
        str(batch),
    ) as child:
        lines = [child.line()]
        assert lines[0] == b"opening"
        for _ in range(kill_after):
            lines.append(child.line())
        lines += child.kill_and_drain()
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
        for ln in lines[1:]:
            if ln.startswith(b"ready"):
                assert ln.split()[2] == b"%d" % start
                continue
            i, off = map(int, ln.split())
            assert i == start + len(reported), f"child reported out of order: {ln!r}"
            reported[i] = off
    return reported


def verify_log(qdir: Path, fsync: str, seg: int, lo: int, hi: int) -> list[int]:
    """Reopen as writer; check the log is exactly payload(0..n-1) back to back; enqueue
    payload(n) and read it back. Returns the offsets of messages 0..n (n+1 entries)."""
    offsets: list[int] = []
    with (
        k7core.Queue(qdir, fsync=fsync, segment_size=seg) as q,
        q.consumer_group("verify", cursor_fsync="flush") as g,
    ):
        g.seek(0)
        expect = 0
        for m in drain(g, ack="batch", max_batch=4096):
            i = len(offsets)
            got = bytes(m.payload)
            want = payload(i, lo, hi)
            assert m.offset == expect, (
                f"message {i} at offset {m.offset}, expected {expect} (gap or reorder)"
            )
            assert got == want, f"message {i} at {m.offset}: {got[:24]!r} != {want[:24]!r}"
            offsets.append(m.offset)
            expect += frame_size(len(got))
        assert q.end == expect, f"visible end {q.end} != end of the last frame {expect}"
        n = len(offsets)
        # (c) the reopened queue takes a further write, at the end, and it reads back.
        off = q.enqueue(payload(n, lo, hi))
        assert off == expect
        batch = g.poll(max_batch=16, timeout=5.0)  # "async": visible once synced
        assert [(m.offset, bytes(m.payload)) for m in batch] == [(off, payload(n, lo, hi))]
        g.ack_many(batch)
        offsets.append(off)
    return offsets


def run_writer_crashes(
    tmp_path: Path,
    fsync: str,
    *,
    seg: int,
    lo: int,
    hi: int,
    kills: int,
    max_lines: int,
    name: str,
    batch: int = 1,
) -> None:
    rng = rng_for(name)
    qdir = tmp_path / "q"
    start = 0  # messages 0 .. start-1 are in the log (checked and closed cleanly)
    lost_total = 0
    for round_ in range(kills):
        kill_after = rng.randint(0, max_lines)
        ctx = f"[seed={SEED} {name} round={round_} kill_after={kill_after}]"
        reported = crash_writer(qdir, fsync, seg, start, kill_after, lo, hi, batch)
        offsets = verify_log(qdir, fsync, seg, lo, hi)
        n = len(offsets) - 1  # the messages that survived the crash (verify appended one)
        assert n >= start, f"{ctx} messages closed before this round were lost: {n} < {start}"
        for i, off in reported.items():
            if i < n:
                assert offsets[i] == off, f"{ctx} message {i}: reported {off}, in log {offsets[i]}"
        if reported:
            last = max(reported)
            if fsync in ("sync", "flush"):
                assert n > last, (
                    f"{ctx} {fsync}: message {last} was reported written but the log ends "
                    f"after {n} messages"
                )
            lost_total += max(0, last + 1 - n)
        start = n + 1
    assert start > kills, "no round wrote anything: the test did not exercise the writer"
    if fsync != "async":
        assert lost_total == 0


@pytest.mark.parametrize("fsync", STRATEGIES)
def test_writer_sigkill_keeps_exact_prefix(tmp_path: Path, fsync: str) -> None:
    """SIGKILL a writer 5 times at random points (64 KiB segments: rolls happen)."""
    max_lines = 600 if fsync == "sync" else 4000
    run_writer_crashes(
        tmp_path,
        fsync,
        seg=64 * 1024,
        lo=0,
        hi=200,
        kills=5,
        max_lines=max_lines,
        name=f"writer-{fsync}",
    )


@pytest.mark.parametrize("fsync", ["flush", "sync"])
def test_writer_sigkill_during_enqueue_many(tmp_path: Path, fsync: str) -> None:
    """Same, with ``enqueue_many`` batches of 1..64 (a batch is published at once; a kill in
    the middle of one must still leave an exact prefix)."""
    run_writer_crashes(
        tmp_path,
        fsync,
        seg=64 * 1024,
        lo=0,
        hi=200,
        kills=5,
        max_lines=4000,
        name=f"batch-{fsync}",
        batch=64,
    )


@pytest.mark.parametrize("fsync", STRATEGIES)
def test_writer_sigkill_near_segment_rolls(tmp_path: Path, fsync: str) -> None:
    """4 KiB segments with ~1 KiB messages: a roll every 3 messages, so most kills land in
    or next to a roll (new segment being created, preallocated, fsynced, mapped)."""
    max_lines = 300 if fsync == "flush" else 60
    run_writer_crashes(
        tmp_path,
        fsync,
        seg=4096,
        lo=1000,
        hi=1020,
        kills=6,
        max_lines=max_lines,
        name=f"roll-{fsync}",
    )


def test_zero_length_segment_left_by_a_crashed_roll(tmp_path: Path) -> None:
    """The state a kill between creating and preallocating the next segment leaves behind."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=4096) as q:
        offs = [q.enqueue(payload(i, 1000, 1020)) for i in range(3)]
        seal = offs[-1] + frame_size(len(payload(2, 1000, 1020)))
    assert sorted(os.listdir(qdir)).count(f"seg-{seal:020d}.k7") == 0
    (qdir / f"seg-{seal:020d}.k7").touch()  # empty file: the roll was cut short
    offsets = verify_log(qdir, "flush", 4096, 1000, 1020)
    assert offsets[:3] == offs
    assert offsets[3] == seal
    assert os.path.getsize(qdir / f"seg-{seal:020d}.k7") == 4096


@pytest.mark.parametrize("fsync", STRATEGIES)
def test_reader_in_another_process_follows_writer_crashes(tmp_path: Path, fsync: str) -> None:
    """A read-only reader here follows writer children that are SIGKILLed (after the reader
    got a random number of messages) and restarted on the same log, 4 times. The reader
    never sees a message that recovery later drops (every restarted writer finds at least
    what the reader got), and across all the crashes it receives payload ``i`` at position
    ``i`` back to back: no gap, duplicate, reorder or torn payload."""
    qdir = tmp_path / "q"
    seg = 64 * 1024
    per_child = 1000 if fsync == "sync" else 40_000
    max_kill = 300 if fsync == "sync" else 4000
    rng = rng_for(f"follow-{fsync}")
    k7core.Queue(qdir, fsync=fsync, segment_size=seg).close()
    received = 0
    expect_off = 0
    rounds = 5
    killed = 0  # writers killed while still writing
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("follower") as g:

        def poll_once() -> None:
            nonlocal received, expect_off
            for m in g.poll(max_batch=1024, timeout=0.05):
                p = bytes(m.payload)
                if m.offset != expect_off or p != payload(received):
                    raise AssertionError(
                        f"[seed={SEED} follow-{fsync}] message {received}: offset {m.offset} "
                        f"(expected {expect_off}), payload {p[:20]!r}"
                    )
                expect_off += frame_size(len(p))
                received += 1
                g.ack(m)

        for round_ in range(rounds):
            ctx = f"[seed={SEED} follow-{fsync} round={round_}]"
            args = ("write", str(qdir), fsync, str(seg), "auto", str(per_child), "0", "200")
            with Child(*args, "0", "1") as child:
                assert child.line() == b"opening"
                start = int(child.line().split()[2])
                assert start >= received, (
                    f"{ctx} the reader got {received} messages but only {start} survived"
                )
                deadline = time.monotonic() + 20.0
                if round_ < rounds - 1:
                    kill_at = received + rng.randint(1, max_kill)
                    while received < kill_at and child.proc.poll() is None:
                        assert time.monotonic() < deadline, f"{ctx} reader stuck at {received}"
                        poll_once()
                    child.proc.send_signal(signal.SIGKILL)
                    killed += child.proc.wait() == -signal.SIGKILL
                else:
                    end = int(child.line().split()[1])
                    assert child.proc.wait() == 0, child.stderr()
                    while expect_off < end:
                        assert time.monotonic() < deadline, f"{ctx} reader stuck at {received}"
                        poll_once()
                    assert expect_off == end
                    assert received == start + per_child
        assert g.poll(max_batch=16, timeout=0) == []
    assert killed > 0, "every writer had finished before its kill: nothing was tested"


# --------------------------------------------------------------------------------------
# consumer-group (cursor) crashes
# --------------------------------------------------------------------------------------

N_CURSOR_MESSAGES = 4000


@pytest.mark.parametrize("cursor_fsync", STRATEGIES)
def test_cursor_sigkill_never_ahead_of_acks(tmp_path: Path, cursor_fsync: str) -> None:
    """A child polls and acks in order, reporting ``S off`` before each ack and ``A off``
    after it; SIGKILL it at random points, 4 times on the same group. The committed cursor
    on disk is a frame boundary, never past the frontier of the last ack *started*, for
    "sync" and "flush" at least the frontier of the last ack *reported*, and the group
    resumes from it (the next child's first delivery is the committed offset)."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=16 * 1024) as q:
        offs = q.enqueue_many([payload(i) for i in range(N_CURSOR_MESSAGES)])
        end = q.end
    index = {o: i for i, o in enumerate(offs)}
    after = {o: o + frame_size(len(payload(i))) for i, o in enumerate(offs)}
    boundaries = set(offs) | {end}
    rng = rng_for(f"cursor-{cursor_fsync}")
    max_lines = 500 if cursor_fsync == "sync" else 2000
    committed = 0
    acked_total = 0
    for round_ in range(4):
        kill_after = rng.randint(0, max_lines)
        ctx = f"[seed={SEED} cursor-{cursor_fsync} round={round_} kill_after={kill_after}]"
        with Child("consume", str(qdir), cursor_fsync, "g", str(rng.randrange(1 << 30))) as child:
            ready = child.line()
            assert ready == b"ready %d" % committed, f"{ctx} group did not resume: {ready!r}"
            # The child runs ahead of what we read (the pipe buffers its lines), so a round
            # may reach the end of the log before ``kill_after`` lines: it then says "end"
            # and waits for us.
            lines: list[bytes] = []
            while len(lines) < kill_after and (not lines or lines[-1] != b"end"):
                lines.append(child.line())
            lines += child.kill_and_drain()
            assert child.proc.returncode == -signal.SIGKILL, child.stderr()
        started: list[int] = []
        acked: list[int] = []
        for ln in lines:
            if ln == b"end":
                continue
            kind, off_s, *rest = ln.split()
            off = int(off_s)
            assert off in index, f"{ctx} delivered an offset that is not a frame: {ln!r}"
            if kind == b"S":
                assert int(rest[0]) == len(payload(index[off])), f"{ctx} wrong length: {ln!r}"
                expect = after[started[-1]] if started else committed
                assert off == expect, f"{ctx} delivery {off} does not follow {expect}"
                started.append(off)
            else:
                assert kind == b"A" and started and off == started[-1], f"{ctx} {ln!r}"
                acked.append(off)
        on_disk = read_cursor(qdir, "g")
        assert on_disk in boundaries, f"{ctx} cursor {on_disk} is not a frame boundary"
        assert on_disk >= committed, f"{ctx} cursor went back from {committed} to {on_disk}"
        ceiling = after[started[-1]] if started else committed
        assert on_disk <= ceiling, (
            f"{ctx} cursor {on_disk} is ahead of the last ack started (frontier {ceiling})"
        )
        if acked and cursor_fsync in ("sync", "flush"):
            floor = after[acked[-1]]
            assert on_disk >= floor, (
                f"{ctx} cursor {on_disk} lost the reported ack of {acked[-1]} (frontier {floor})"
            )
        acked_total += len(acked)
        committed = on_disk
        # The group reopens on the committed cursor and delivers from there.
        with (
            k7core.Queue(qdir, fsync="flush") as q,
            q.consumer_group("g", cursor_fsync=cursor_fsync) as g,
        ):
            assert g.committed == committed
            batch = g.poll(max_batch=1, timeout=0)
            if committed < end:
                assert [m.offset for m in batch] == [committed], ctx
                assert bytes(batch[0].payload) == payload(index[committed])
            else:
                assert batch == []
        # (closing without an ack leaves the cursor where it was)
        assert read_cursor(qdir, "g") == committed
    assert acked_total > 0, "no ack happened: the test did not exercise the cursor"
