"""Child-process programs of the shared-writers tests (not a test module); see
``test_shared_writers.py``.

Run as ``python -m tests.k7core._shared_children <mode> <args...>`` (``tests._childproc.Child``
with ``program=``). Every message is :func:`shared_payload` ``(wid, seq)``: it names the writer
(``wid``, unique per child process the test starts) and its sequence number in that writer, and
its length and filler depend on both, so any torn or mixed-up byte shows. Report lines go out
with one ``os.write`` each (``tests._children.say``), so a SIGKILL never leaves half a line that
could be taken for a whole one.

Modes:

``write DIR FSYNC SEGMENT_SIZE WID SEED COUNT``
    Open the queue with ``writers="shared"``, print ``ready``, then append messages
    ``(WID, 0) .. (WID, COUNT-1)`` in runs of ``enqueue`` and ``enqueue_many`` calls (at random,
    batches of 2-8), and after each call returned print ``O <seq> <offset> ...``: the first
    sequence number of the call and the offsets it returned. Close, print ``done``.

``gated DIR FSYNC SEGMENT_SIZE WID SEED COUNT``
    As ``write``, but after ``ready`` it prints ``pid <its pid as it sees itself>`` and waits
    for a line on stdin before it appends (so that writers start together).

``members DIR SEGMENT_SIZE``
    A fleet of writer processes, forked from this one (fast: k7core is imported once). On
    ``spawn N`` (stdin) it forks N members: each opens the queue with ``writers="shared"``
    and ``fsync="flush"``, waits until its spare segment is on disk, prints ``ready <pid>
    <spare file name>`` and sleeps until SIGKILLed (or this process ends). On ``reap N`` it
    waits for N members to end and prints ``dead <pid>`` for each.

``holdlock DIR WID``
    Open the queue with ``writers="shared"`` and ``fsync="flush"``, enqueue ``(WID, 0)`` (an
    ``O`` line), take the shared lock through the kernel and print ``held``; on a line on
    stdin release it, enqueue ``(WID, 1)`` (an ``O`` line), close and print ``done``.

``syncloop DIR WID COUNT``
    Open the queue with ``writers="shared"`` and ``fsync="sync"``, print ``ready``, wait for a
    line on stdin, then ``enqueue`` messages ``(WID, 0) .. (WID, COUNT-1)`` one call each (a
    loop of durable appends, as a producer process that waits for each). Print ``syncs <n>``:
    the msyncs of the log this process made. Close, print ``done``.

``holdsync DIR WID``
    Open the queue with ``writers="shared"`` and ``fsync="sync"``, enqueue ``(WID, 0)`` (an
    ``O`` line), then take the msync lock through the kernel, as a writer in the middle of an
    msync holds it. Print ``held`` and sleep until SIGKILLed.

``hold DIR FSYNC SEGMENT_SIZE WID COUNT``
    Open the queue with ``writers="shared"``, enqueue ``(WID, 0) .. (WID, COUNT-1)`` (an ``O``
    line after each), then take the shared lock through the kernel and, past the shared end,
    write a valid-looking frame of message ``(WID, COUNT)`` followed by garbage (bytes that
    were never returned to anyone: what a writer killed mid-append leaves). Print
    ``held <position in the segment> <bytes written>`` and sleep until SIGKILLed.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
import time

import k7core
from k7core._kernel import ffi, lib
from tests._children import say
from tests._queuehelp import encode_frame

_FILL = (b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 8)[:400]


def shared_payload(wid: int, seq: int) -> bytes:
    """Message ``seq`` of writer ``wid``: ``w<wid>.<seq>:`` and a filler of 0..199 bytes."""
    n = (seq * 7919 + wid * 104729) % 200
    k = (seq + wid) % 64
    return b"w%d.%d:" % (wid, seq) + _FILL[k : k + n]


def parse_payload(data: bytes) -> tuple[int, int]:
    """The ``(wid, seq)`` a :func:`shared_payload` names."""
    head, sep, _ = data.partition(b":")
    assert sep and head[:1] == b"w", data[:24]
    wid, seq = head[1:].split(b".")
    return int(wid), int(seq)


def _write(argv: list[str], *, gated: bool = False) -> None:
    d, fsync, seg, wid_s, seed, count_s = argv
    wid, count = int(wid_s), int(count_s)
    rng = random.Random(int(seed))
    q = k7core.Queue(d, writers="shared", fsync=fsync, segment_size=int(seg))
    say("ready")
    if gated:
        w = q._writer
        if w is not None and w._spare is not None:
            w._spare._join()  # its spare is on disk
        say(f"pid {os.getpid()}")
        sys.stdin.readline()
    seq = 0
    while seq < count:
        if rng.random() < 0.5:
            off = q.enqueue(shared_payload(wid, seq))
            say(f"O {seq} {off}")
            seq += 1
        else:
            n = min(rng.randint(2, 8), count - seq)
            offs = q.enqueue_many([shared_payload(wid, s) for s in range(seq, seq + n)])
            say(f"O {seq} " + " ".join(map(str, offs)))
            seq += n
    q.close()
    say("done")


def _members(argv: list[str]) -> None:
    d, seg = argv
    for line in sys.stdin:
        word, n = line.split()
        for _ in range(int(n)):
            if word == "reap":
                pid, _status = os.wait()
                say(f"dead {pid}")
            elif os.fork() == 0:
                _member(d, int(seg))


def _member(d: str, seg: int) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it ends with the fleet
    q = k7core.Queue(d, writers="shared", fsync="flush", segment_size=seg)
    w = q._writer
    assert w is not None and w._spare is not None
    w._spare._join()  # the spare is on disk
    say(f"ready {os.getpid()} {w._spare_name}")
    while True:
        time.sleep(60)


def _holdlock(argv: list[str]) -> None:
    d, wid_s = argv
    wid = int(wid_s)
    q = k7core.Queue(d, writers="shared", fsync="flush")
    say(f"O 0 {q.enqueue(shared_payload(wid, 0))}")
    w = q._writer
    assert w is not None
    assert lib.k7_shared_lock(w.c) == 0, "the shared lock was not granted"
    say("held")
    sys.stdin.readline()
    lib.k7_shared_release(w.c)
    say(f"O 1 {q.enqueue(shared_payload(wid, 1))}")
    q.close()
    say("done")


def _syncloop(argv: list[str]) -> None:
    d, wid_s, count_s = argv
    wid, count = int(wid_s), int(count_s)
    q = k7core.Queue(d, writers="shared", fsync="sync")
    say("ready")
    sys.stdin.readline()
    for seq in range(count):
        q.enqueue(shared_payload(wid, seq))
    say(f"syncs {q.stats().log_syncs}")
    q.close()
    say("done")


def _holdsync(argv: list[str]) -> None:
    d, wid_s = argv
    wid = int(wid_s)
    q = k7core.Queue(d, writers="shared", fsync="sync")
    say(f"O 0 {q.enqueue(shared_payload(wid, 0))}")
    w = q._writer
    assert w is not None
    assert lib.k7_shared_sync_hold(w.c) == 0, "the msync lock was not granted"
    say("held")
    while True:
        time.sleep(60)


def _hold(argv: list[str]) -> None:
    d, fsync, seg, wid_s, count_s = argv
    wid, count = int(wid_s), int(count_s)
    q = k7core.Queue(d, writers="shared", fsync=fsync, segment_size=int(seg))
    for seq in range(count):
        say(f"O {seq} {q.enqueue(shared_payload(wid, seq))}")
    w = q._writer
    assert w is not None
    assert lib.k7_shared_lock(w.c) == 0, "the shared lock was not granted"
    assert w._shared is not None
    pos = w._shared.state().pos
    junk = encode_frame(shared_payload(wid, count)) + bytes(range(1, 200))
    m = w._seg_map
    assert pos + len(junk) <= m.size, (pos, m.size)
    ffi.memmove(m.ptr + pos, junk, len(junk))
    say(f"held {pos} {len(junk)}")
    while True:
        time.sleep(60)


def main() -> None:
    mode, *argv = sys.argv[1:]
    if mode == "gated":
        _write(argv, gated=True)
        return
    {"write": _write, "syncloop": _syncloop, "holdsync": _holdsync, "hold": _hold,
     "members": _members, "holdlock": _holdlock}[mode](argv)


if __name__ == "__main__":
    main()
