"""Child-process programs for the crash and multi-process tests (not a test module).

Run as ``python -m tests._children <mode> <args...>`` with the repository's root on the
path (``tests._childproc.Child`` does so). Messages are ``tests._queuehelp.payload(i)``, which
the tests import too. Every report line goes out with one
``os.write`` (one syscall, < PIPE_BUF bytes), so a SIGKILL never leaves half a line behind
that could be mistaken for a whole one, and nothing sits in a userspace buffer.

Modes:

``write DIR FSYNC SEGMENT_SIZE START COUNT LO HI REPORT BATCH``
    Print ``opening``, open the queue as its writer, print ``ready <end> <start>`` (``START``
    may be ``auto``: the number of messages already in the log), then enqueue
    ``payload(i, LO, HI)`` for ``i`` in ``START .. START+COUNT-1``. With ``REPORT`` = 1 it
    prints ``<i> <offset>`` after each ``enqueue`` returned. ``BATCH`` > 1 uses
    ``enqueue_many`` with batches of pseudo-random sizes up to ``BATCH`` (then the report
    lines follow the call). Closes the queue and prints ``done <end of the last frame>``.

``consume DIR CURSOR_FSYNC GROUP SEED``
    Open the queue read-only and the group; print ``ready <committed>``; poll batches of
    pseudo-random size and ack each message in order, printing ``S <offset> <len>`` before
    ``ack`` is called and ``A <offset>`` after it returned. At the end of the log print
    ``end`` and block on stdin until the parent closes it (or kills us).

``mixed DIR FSYNC CURSOR_FSYNC SEGMENT_SIZE SEED START``
    The crash matrix's program. Open the queue as writer (``retention="consumed"``) and
    group ``g``; print ``ready <n> <committed>`` (``n``: the index after the last message,
    ``START``: the parent's count, which the log must agree with unless it is empty).
    Then, forever, pick an action at random and print its phase marker *before* doing it:
    ``P enqueue`` (1-8 ``enqueue`` calls of the next messages, ``E <i> <offset>`` after each
    returned), ``P roll`` (the same, when the next message does not fit in the current
    segment), ``P retention`` (a roll when the group has consumed every sealed segment, so
    the roll deletes them), ``P ack`` (a ``poll`` of 1-16, then
    ``S <offset> <i>`` before and ``A <offset>`` after each ``ack``), ``P close`` (close group
    and queue, print ``closed``, reopen, print ``ready ...`` again).

``hold DIR GROUP``
    Open the queue as writer and the group, print ``ready``, block until stdin closes, close.

``try DIR GROUP``
    Try to open the queue as writer, then the group on a read-only queue; print one line
    each: the exception class name, or ``opened``.

``wake DIR FSYNC``
    Open the queue as writer, print ``ready``. For each line ``i`` read from stdin: wait
    (bounded) until a reader has registered as a waiter in the position file, enqueue
    ``payload(i)``, print ``<i> <offset> <saw_waiter 0|1> <time.monotonic() after enqueue>``.

``retain DIR SEGMENT_SIZE RETENTION_BYTES``
    Print ``opening``, open the queue as writer with ``retention="consumed"`` and
    ``retention_bytes`` (retention runs at open too), print ``ready <earliest> <start>``
    (``start``: the index after the last message in the log), then enqueue forever,
    printing ``<i> <offset>`` after each.

``lag-reader DIR GROUP``
    Open the queue read-only and the group; poll one message and print ``first <offset>``;
    wait for a line on stdin, then poll to the end of the log (``timeout=0``), checking
    every payload, and print ``read <count> <last index>``, or ``dataloss <offset>
    <earliest>`` if retention deleted what comes next.

``stats DIR``
    Open the queue read-only and print ``Queue.stats()`` as one JSON line.

``open-on-wait DIR FSYNC``
    Print ``ready``; wait (bounded) until a reader waits on the position file, *then* open
    the queue as writer and enqueue ``payload(0)``; print as ``wake`` does; block until
    stdin closes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time

import k7core
from tests._queuehelp import index_of, payload, poll_until, seg_bases, seg_name, waiters


def say(line: str) -> None:
    """One report line to stdout, in one ``os.write``."""
    os.write(1, line.encode() + b"\n")


def _waiter_seen(d: str, timeout: float = 5.0) -> int:
    """1 once a reader has registered as a waiter in the position file within ``timeout``
    seconds, else 0."""
    return int(poll_until(lambda: waiters(d) > 0, timeout))


def _write(argv: list[str]) -> None:
    d, fsync, seg, start, count, lo, hi, report, batch = argv
    seg_i, count_i, lo_i, hi_i = int(seg), int(count), int(lo), int(hi)
    report_b, batch_i = report == "1", int(batch)
    say("opening")
    q = k7core.Queue(d, fsync=fsync, segment_size=seg_i)
    start_i = _count_messages(q) if start == "auto" else int(start)
    say(f"ready {q.end} {start_i}")
    stop = start_i + count_i
    last: tuple[int, int] | None = None  # (offset, index) of the last message written
    if batch_i <= 1:
        enqueue = q.enqueue
        for i in range(start_i, stop):
            off = enqueue(payload(i, lo_i, hi_i))
            if report_b:
                os.write(1, b"%d %d\n" % (i, off))
            last = (off, i)
    else:
        rng = random.Random(start_i)
        i = start_i
        while i < stop:
            n = min(rng.randint(1, batch_i), stop - i)
            offs = q.enqueue_many([payload(j, lo_i, hi_i) for j in range(i, i + n)])
            if report_b:
                os.write(1, b"".join(b"%d %d\n" % (i + k, o) for k, o in enumerate(offs)))
            i += n
            last = (offs[-1], i - 1)
    # The end of the last frame written ("async": q.end may still lag until the final sync).
    end = q.end if last is None else last[0] + k7core.frame_size(len(payload(last[1], lo_i, hi_i)))
    q.close()
    say(f"done {end}")


def _count_messages(q: k7core.Queue, empty: int = 0) -> int:
    """The index after the last message of the log (each message names its index: check
    that they follow each other from the earliest one retention left); ``empty`` when the
    log holds no message."""
    off, n = q.earliest(), None
    while True:
        batch = q.read_columnar(off)
        if not len(batch):
            return empty if n is None else n
        for k in range(len(batch)):
            if n is None:
                n = index_of(batch.payload(k))
            assert index_of(batch.payload(k)) == n, (n, bytes(batch.payload(k)[:10]))
            n += 1
        off = batch.next


def _consume(argv: list[str]) -> None:
    d, cursor_fsync, group, seed = argv
    rng = random.Random(int(seed))
    q = k7core.Queue(d, readonly=True)
    g = q.consumer_group(group, cursor_fsync=cursor_fsync)
    say(f"ready {g.committed}")
    while True:
        msgs = g.poll(max_batch=rng.randint(1, 32), timeout=0)
        if not msgs:
            break
        for m in msgs:
            os.write(1, b"S %d %d\n" % (m.offset, len(m.payload)))
            if not g.ack(m):
                say(f"NOT-IN-FLIGHT {m.offset}")
            os.write(1, b"A %d\n" % m.offset)
    say("end")
    sys.stdin.read()
    g.close()
    q.close()


def _hold(argv: list[str]) -> None:
    d, group = argv
    q = k7core.Queue(d, fsync="flush", segment_size=1 << 20)
    g = q.consumer_group(group)
    say("ready")
    sys.stdin.read()
    g.close()
    q.close()


def _try(argv: list[str]) -> None:
    d, group = argv
    try:
        k7core.Queue(d, fsync="flush", segment_size=1 << 20).close()
        say("opened")
    except k7core.K7Error as exc:
        say(type(exc).__name__)
    with k7core.Queue(d, readonly=True) as q:
        try:
            q.consumer_group(group).close()
            say("opened")
        except k7core.K7Error as exc:
            say(type(exc).__name__)


def _wake(argv: list[str]) -> None:
    d, fsync = argv
    q = k7core.Queue(d, fsync=fsync, segment_size=1 << 20)
    say("ready")
    for line in sys.stdin:
        i = int(line)
        saw = _waiter_seen(d)
        off = q.enqueue(payload(i))
        say(f"{i} {off} {saw} {time.monotonic():.9f}")
    q.close()


def _open_on_wait(argv: list[str]) -> None:
    d, fsync = argv
    say("ready")
    saw = _waiter_seen(d)
    q = k7core.Queue(d, fsync=fsync, segment_size=1 << 20)
    off = q.enqueue(payload(0))
    say(f"0 {off} {saw} {time.monotonic():.9f}")
    sys.stdin.read()
    q.close()


def _mixed(argv: list[str]) -> None:
    d, fsync, cursor_fsync, seg, seed, start = argv
    seg_i = int(seg)
    rng = random.Random(int(seed))
    i = int(start)

    def open_all() -> tuple[k7core.Queue, k7core.ConsumerGroup, int]:
        q = k7core.Queue(d, fsync=fsync, segment_size=seg_i, retention="consumed")
        g = q.consumer_group("g", cursor_fsync=cursor_fsync)
        n = _count_messages(q, empty=i)  # retention may have left no message to count
        assert n == i, f"the log ends before message {n}, expected {i}"
        say(f"ready {n} {g.committed}")
        return q, g, n

    def segment(written: int) -> tuple[int, int]:
        """The base of the segment being written (the newest file's name) and the bytes
        left in it."""
        base = seg_bases(d)[-1]
        size = os.path.getsize(os.path.join(d, seg_name(base)))
        return base, base + size - written

    q, g, i = open_all()
    written = q.end  # end of the frames written ("async": q.end lags behind the msyncs)
    while True:
        action = rng.choices(("enqueue", "ack", "close"), weights=(10, 6, 1))[0]
        if action == "enqueue":
            for _ in range(rng.randint(1, 8)):
                data = payload(i)
                size = k7core.frame_size(len(data))
                base, room = segment(written)
                if size <= room:
                    say("P enqueue")
                else:  # a roll; it deletes the sealed segments the group has consumed
                    say("P retention" if g.committed >= base else "P roll")
                off = q.enqueue(data)
                os.write(1, b"E %d %d\n" % (i, off))
                written = off + size
                i += 1
        elif action == "ack":
            say("P ack")
            for m in g.poll(max_batch=rng.randint(1, 16), timeout=0):
                os.write(1, b"S %d %d\n" % (m.offset, index_of(m.payload)))
                g.ack(m)
                os.write(1, b"A %d\n" % m.offset)
        else:
            say("P close")
            g.close()
            q.close()
            say("closed")
            q, g, i = open_all()
            written = q.end


def _retain(argv: list[str]) -> None:
    d, seg, limit = argv
    say("opening")
    q = k7core.Queue(d, fsync="flush", segment_size=int(seg), retention="consumed",
                     retention_bytes=int(limit))
    start = _count_messages(q)  # the index after the last message: messages name themselves
    say(f"ready {q.earliest()} {start}")
    i = start
    while True:
        o = q.enqueue(payload(i))
        os.write(1, b"%d %d\n" % (i, o))
        i += 1


def _lag_reader(argv: list[str]) -> None:
    d, group = argv
    q = k7core.Queue(d, readonly=True)
    g = q.consumer_group(group, cursor_fsync="flush")
    first = g.poll(max_batch=1, timeout=5.0)
    assert first and bytes(first[0].payload) == payload(0), first
    g.ack(first[0])
    say(f"first {first[0].offset}")
    sys.stdin.readline()
    n, last = 1, 0
    try:
        while True:
            msgs = g.poll(max_batch=64, timeout=0)
            if not msgs:
                break
            for m in msgs:
                assert bytes(m.payload) == payload(n), (n, bytes(m.payload[:12]))
                last = n
                n += 1
            g.ack_many(msgs)
    except k7core.DataLossError as exc:
        say(f"dataloss {exc.offset} {exc.earliest}")
    else:
        say(f"read {n} {last}")
    g.close()
    q.close()


def _stats(argv: list[str]) -> None:

    with k7core.Queue(argv[0], readonly=True) as q:
        say(json.dumps(dataclasses.asdict(q.stats())))


MODES = {
    "retain": _retain,
    "lag-reader": _lag_reader,
    "stats": _stats,
    "write": _write,
    "consume": _consume,
    "mixed": _mixed,
    "hold": _hold,
    "try": _try,
    "wake": _wake,
    "open-on-wait": _open_on_wait,
}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2:])
