"""Child-process programs for the crash and multi-process tests (not a test module).

Run as ``python _children.py <mode> <args...>``; the tests import ``payload`` from here so
parent and child agree on the bytes of message ``i``. Every report line goes out with one
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

import mmap
import os
import random
import sys
import time

_FILL = (b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 40)[:2200]


def payload(i: int, lo: int = 0, hi: int = 200) -> bytes:
    """Message ``i``: ``m<i:08d>-`` then a filler whose length (``lo..hi``) and content
    depend on ``i``; so every message identifies itself and any torn or mixed-up byte shows."""
    n = lo + (i * 7919) % (hi - lo + 1)
    k = i % 64
    return b"m%08d-" % i + _FILL[k : k + n]


def _out(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def _write(argv: list[str]) -> None:
    import k7core

    d, fsync, seg, start, count, lo, hi, report, batch = argv
    seg_i, count_i, lo_i, hi_i = int(seg), int(count), int(lo), int(hi)
    report_b, batch_i = report == "1", int(batch)
    _out("opening")
    q = k7core.Queue(d, fsync=fsync, segment_size=seg_i)
    start_i = _count_messages(q) if start == "auto" else int(start)
    _out(f"ready {q.end} {start_i}")
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
    _out(f"done {end}")


def _count_messages(q: object, empty: int = 0) -> int:
    """The index after the last message of the log (each message names its index: check
    that they follow each other from the earliest one retention left); ``empty`` when the
    log holds no message."""
    off, n = q.earliest(), None  # type: ignore[attr-defined]
    while True:
        batch = q.read_columnar(off)  # type: ignore[attr-defined]
        if not len(batch):
            return empty if n is None else n
        for k in range(len(batch)):
            head = bytes(batch.payload(k)[:10])
            if n is None:
                n = int(head[1:9])
            assert head == b"m%08d-" % n, (n, head)
            n += 1
        off = batch.next


def _consume(argv: list[str]) -> None:
    import k7core

    d, cursor_fsync, group, seed = argv
    rng = random.Random(int(seed))
    q = k7core.Queue(d, readonly=True)
    g = q.consumer_group(group, cursor_fsync=cursor_fsync)
    _out(f"ready {g.committed}")
    while True:
        msgs = g.poll(max_batch=rng.randint(1, 32), timeout=0)
        if not msgs:
            break
        for m in msgs:
            os.write(1, b"S %d %d\n" % (m.offset, len(m.payload)))
            if not g.ack(m):
                _out(f"NOT-IN-FLIGHT {m.offset}")
            os.write(1, b"A %d\n" % m.offset)
    _out("end")
    sys.stdin.read()
    g.close()
    q.close()


def _hold(argv: list[str]) -> None:
    import k7core

    d, group = argv
    q = k7core.Queue(d, fsync="flush", segment_size=1 << 20)
    g = q.consumer_group(group)
    _out("ready")
    sys.stdin.read()
    g.close()
    q.close()


def _try(argv: list[str]) -> None:
    import k7core

    d, group = argv
    try:
        k7core.Queue(d, fsync="flush", segment_size=1 << 20).close()
        _out("opened")
    except k7core.K7Error as exc:
        _out(type(exc).__name__)
    with k7core.Queue(d, readonly=True) as q:
        try:
            q.consumer_group(group).close()
            _out("opened")
        except k7core.K7Error as exc:
            _out(type(exc).__name__)


def _position(d: str) -> mmap.mmap:
    """The queue's position file (a k7_pos, k7.h), mapped read-only."""
    from k7core._format import POSITION_FILE, POSITION_FILE_SIZE

    fd = os.open(os.path.join(d, POSITION_FILE), os.O_RDONLY)
    try:
        return mmap.mmap(fd, POSITION_FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)


def _waiters(pos: mmap.mmap) -> int:
    """Readers blocked in a wait on the mapped position file ``pos``."""
    from k7core._kernel import ffi

    return int(ffi.from_buffer("k7_pos *", pos).waiters)


def _wake(argv: list[str]) -> None:
    import k7core

    d, fsync = argv
    q = k7core.Queue(d, fsync=fsync, segment_size=1 << 20)
    pos = _position(d)
    _out("ready")
    for line in sys.stdin:
        i = int(line)
        deadline = time.monotonic() + 5.0
        saw = 0
        while time.monotonic() < deadline:  # condition polling, bounded: not a sync sleep
            if _waiters(pos) > 0:
                saw = 1
                break
            time.sleep(0.0005)
        off = q.enqueue(payload(i))
        _out(f"{i} {off} {saw} {time.monotonic():.9f}")
    pos.close()
    q.close()


def _open_on_wait(argv: list[str]) -> None:
    import k7core

    d, fsync = argv
    pos = _position(d)
    _out("ready")
    deadline = time.monotonic() + 5.0
    saw = 0
    while time.monotonic() < deadline:  # condition polling, bounded: not a sync sleep
        if _waiters(pos) > 0:
            saw = 1
            break
        time.sleep(0.0005)
    q = k7core.Queue(d, fsync=fsync, segment_size=1 << 20)
    off = q.enqueue(payload(0))
    _out(f"0 {off} {saw} {time.monotonic():.9f}")
    sys.stdin.read()
    pos.close()
    q.close()


def _mixed(argv: list[str]) -> None:
    import k7core

    d, fsync, cursor_fsync, seg, seed, start = argv
    seg_i = int(seg)
    rng = random.Random(int(seed))
    i = int(start)

    def open_all() -> tuple[k7core.Queue, k7core.ConsumerGroup, int]:
        q = k7core.Queue(d, fsync=fsync, segment_size=seg_i, retention="consumed")
        g = q.consumer_group("g", cursor_fsync=cursor_fsync)
        n = _count_messages(q, empty=i)  # retention may have left no message to count
        assert n == i, f"the log ends before message {n}, expected {i}"
        _out(f"ready {n} {g.committed}")
        return q, g, n

    def segment(written: int) -> tuple[int, int]:
        """The base of the segment being written (the newest file's name) and the bytes
        left in it."""
        base = max(int(f[4:-3]) for f in os.listdir(d) if f.startswith("seg-"))
        size = os.path.getsize(os.path.join(d, f"seg-{base:020d}.k7"))
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
                    _out("P enqueue")
                else:  # a roll; it deletes the sealed segments the group has consumed
                    _out("P retention" if g.committed >= base else "P roll")
                off = q.enqueue(data)
                os.write(1, b"E %d %d\n" % (i, off))
                written = off + size
                i += 1
        elif action == "ack":
            _out("P ack")
            for m in g.poll(max_batch=rng.randint(1, 16), timeout=0):
                os.write(1, b"S %d %d\n" % (m.offset, int(bytes(m.payload[1:9]))))
                g.ack(m)
                os.write(1, b"A %d\n" % m.offset)
        else:
            _out("P close")
            g.close()
            q.close()
            _out("closed")
            q, g, i = open_all()
            written = q.end


def _retain(argv: list[str]) -> None:
    import k7core

    d, seg, limit = argv
    _out("opening")
    q = k7core.Queue(d, fsync="flush", segment_size=int(seg), retention="consumed",
                     retention_bytes=int(limit))
    start, off = 0, q.earliest()
    while True:  # the index after the last message: messages name themselves
        batch = q.read_columnar(off)
        if not len(batch):
            break
        start = int(bytes(batch.payload(len(batch) - 1)[1:9])) + 1
        off = batch.next
    _out(f"ready {q.earliest()} {start}")
    i = start
    while True:
        o = q.enqueue(payload(i))
        os.write(1, b"%d %d\n" % (i, o))
        i += 1


def _lag_reader(argv: list[str]) -> None:
    import k7core

    d, group = argv
    q = k7core.Queue(d, readonly=True)
    g = q.consumer_group(group, cursor_fsync="flush")
    first = g.poll(max_batch=1, timeout=5.0)
    assert first and bytes(first[0].payload) == payload(0), first
    g.ack(first[0])
    _out(f"first {first[0].offset}")
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
        _out(f"dataloss {exc.offset} {exc.earliest}")
    else:
        _out(f"read {n} {last}")
    g.close()
    q.close()


def _stats(argv: list[str]) -> None:
    import dataclasses
    import json

    import k7core

    with k7core.Queue(argv[0], readonly=True) as q:
        _out(json.dumps(dataclasses.asdict(q.stats())))


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
