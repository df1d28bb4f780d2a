"""Child-process programs of the soak test (not a test module); see ``test_soak.py``.

Run as ``python -m tests.core._soak_children <mode> <args...>`` (``tests._childproc.Child``
with ``program=``). Messages are ``tests._queuehelp.payload(i)``
and the log starts at offset 0 with message 0, so message ``i`` sits at
:func:`offset_of` ``(i)`` (frames follow each other across segment ends): every process
checks the offset and the bytes of every message it reads. Each process writes a few lines
on stdout (``ready ...``, ``done ...``) and keeps its progress in a *slot file*: a few int64
stored with one ``os.pwrite`` at offset 0 (one syscall into the page cache, which a SIGKILL
does not lose), read by the parent after the process died or ended. A failed check raises:
the process exits with status 1 and the traceback on stderr. The parent stops a process by
writing one line on its stdin (``stop``, ``drain <n>``).

Modes:

``writer DIR FSYNC SEED SLOT``
    Open the queue as writer (``retention="consumed"``, ``SEGMENT``-byte segments); work out
    the next index from the log: after the last message, or, when retention left no message,
    from the end offset. Print ``ready <next> last|empty``. Then enqueue the next messages
    (runs of ``enqueue`` and ``enqueue_many`` batches, at random), storing in the slot the
    index after the last one whose call returned. Paced: at most ``RATE`` messages a second,
    and never more than ``LAG_CAP`` bytes ahead of the slowest group's committed cursor (the
    directory stays small). On ``stop``: close, print ``done <next>``.

``reader DIR GROUP CURSOR_FSYNC SEED SLOT``
    Open the queue ``readonly`` and the group; print ``ready <index at the committed
    cursor>``. Poll batches of random size, check them, store ``(first, next, committed)``
    in the slot (the indexes seen in this process are ``first .. next-1``) *before* acking
    them with ``ack_many``, ``ack`` in order, ``ack`` shuffled, or one batch later; then store
    the committed index. On ``drain <n>``: read up to message ``n-1``, ack, close, print
    ``done <committed offset>``.

``tail DIR SEED START SLOT``
    Open the queue ``readonly`` (no group: retention ignores it) and follow the log from
    message ``START`` with ``read_columnar``. When retention deleted the next message
    (``DataLossError``), jump to the earliest offset, counting the skipped messages. The
    slot holds ``(START, next, jumps, skipped)``. On ``drain <n>``: read up to message
    ``n-1`` and print ``done <next>``.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import select
import struct
import sys
import time

import k7core
from k7core._format import CURSOR_SIZE, decode_cursor
from tests._children import say
from tests._queuehelp import index_of, payload

SEGMENT = 64 << 10  # a roll (and a retention pass) every ~530 messages
RATE = 10_000  # messages per second, at most
LAG_CAP = 1 << 20  # bytes the writer may be ahead of the slowest group's cursor
PERIOD = 201  # len(payload(i)) depends on i % PERIOD only
_PREFIX = list(itertools.accumulate(
    (k7core.frame_size(len(payload(i))) for i in range(PERIOD)), initial=0
))
assert all(len(payload(i)) == len(payload(i + PERIOD)) for i in range(PERIOD))


def offset_of(i: int) -> int:
    """The offset of message ``i`` in a log that holds ``payload(0), payload(1), ...``."""
    q, r = divmod(i, PERIOD)
    return q * _PREFIX[-1] + _PREFIX[r]


def index_at(offset: int) -> int:
    """The index of the message at ``offset`` (a frame boundary of the log; the end of the
    log gives the next index)."""
    q, r = divmod(offset, _PREFIX[-1])
    k = bisect.bisect_left(_PREFIX, r)
    assert _PREFIX[k] == r, f"offset {offset} is not a frame boundary"
    return q * PERIOD + k


def read_slot(path: str, n: int) -> tuple[int, ...] | None:
    """The ``n`` int64 of a slot file; None if nothing was stored."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:  # killed before it opened the slot
        return None
    return struct.unpack(f"<{n}q", data) if len(data) == 8 * n else None


class _Slot:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def put(self, *values: int) -> None:
        os.pwrite(self.fd, struct.pack(f"<{len(values)}q", *values), 0)


def _asked() -> list[str] | None:
    """The parent's command line, if one is waiting on stdin (EOF: the parent is gone)."""
    if not select.select([0], [], [], 0)[0]:
        return None
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("stdin closed")
    return line.split()


def _check(offset: int, data: bytes | memoryview, i: int) -> None:
    assert offset == offset_of(i), f"message {i} at offset {offset}, expected {offset_of(i)}"
    got = bytes(data)
    assert got == payload(i), f"message {i} at {offset}: {got[:24]!r} != {payload(i)[:24]!r}"


def _next_index(q: k7core.Queue) -> tuple[int, str]:
    """The index after the last message of the log, and how it was found."""
    off, last = q.earliest(), None
    while len(batch := q.read_columnar(off)):
        k = len(batch) - 1
        last = (batch.offsets[k], bytes(batch.payload(k)))
        off = batch.next
    if last is None:  # retention deleted every message: the end offset says how many
        return index_at(q.end), "empty"
    i = index_of(last[1])
    _check(last[0], last[1], i)
    assert q.end == offset_of(i + 1), (q.end, i)
    return i + 1, "last"


def _writer(argv: list[str]) -> None:
    d, fsync, seed, slot_path = argv
    rng = random.Random(int(seed))
    slot = _Slot(slot_path)
    q = k7core.Queue(d, fsync=fsync, segment_size=SEGMENT, retention="consumed")
    i, how = _next_index(q)
    say(f"ready {i} {how}")
    cursors = [os.open(os.path.join(d, f), os.O_RDONLY)
               for f in sorted(os.listdir(d)) if f.startswith("cursor-")]
    assert cursors, "the parent creates the groups before the writer starts"
    start, t0 = i, time.monotonic()

    def turn() -> bool:
        """Wait while ahead of RATE or more than LAG_CAP ahead of a group; True on stop."""
        while True:
            if _asked() is not None:
                return True
            low = min(decode_cursor(os.pread(fd, CURSOR_SIZE, 0)) for fd in cursors)
            if i - start <= (time.monotonic() - t0) * RATE and offset_of(i) - low <= LAG_CAP:
                return False
            time.sleep(0.002)  # pacing: the readers move the cursors, the clock the rate

    while not turn():
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 32)):
                off = q.enqueue(payload(i))
                assert off == offset_of(i), (i, off)
                i += 1
                slot.put(i)
        else:
            n = rng.randint(2, 64)
            offs = q.enqueue_many([payload(j) for j in range(i, i + n)])
            assert offs == [offset_of(j) for j in range(i, i + n)], (i, offs[:3])
            i += n
            slot.put(i)
    q.close()
    say(f"done {i}")


def _reader(argv: list[str]) -> None:
    d, group, cursor_fsync, seed, slot_path = argv
    rng = random.Random(int(seed))
    slot = _Slot(slot_path)
    q = k7core.Queue(d, readonly=True)
    g = q.consumer_group(group, cursor_fsync=cursor_fsync)
    first = i = index_at(g.committed)
    say(f"ready {i}")
    target: int | None = None
    later: list[k7core.Message] = []  # acked after the next batch: out of order
    while target is None or i < target:
        msgs = g.poll(max_batch=rng.randint(1, 64), timeout=0.05)
        if not msgs:
            if target is None and (cmd := _asked()) is not None:
                target = int(cmd[1])
            continue
        for m in msgs:
            _check(m.offset, m.payload, i)
            i += 1
        slot.put(first, i, index_at(g.committed))  # seen, before any ack
        r = rng.random()
        if r < 0.35:
            assert g.ack_many(msgs) == len(msgs)
        elif r < 0.55:
            assert all([g.ack(m) for m in msgs])
        elif r < 0.8:
            rng.shuffle(msgs)
            assert all([g.ack(m) for m in msgs])
        else:
            msgs, later = later, msgs
            assert g.ack_many(msgs) == len(msgs)
        if r < 0.8 and later:
            assert g.ack_many(later) == len(later)
            later = []
        slot.put(first, i, index_at(g.committed))
    assert i == target, (i, target)
    assert g.ack_many(later) == len(later)
    slot.put(first, i, index_at(g.committed))
    committed = g.committed
    g.close()
    q.close()
    say(f"done {committed}")


def _tail(argv: list[str]) -> None:
    d, seed, start, slot_path = argv
    rng = random.Random(int(seed))
    slot = _Slot(slot_path)
    begin = i = int(start)
    jumps = skipped = 0
    q = k7core.Queue(d, readonly=True)
    say(f"ready {i}")
    target: int | None = None
    while target is None or i < target:
        try:
            batch = q.read_columnar(offset_of(i), rng.randint(1, 512))
        except k7core.DataLossError as exc:
            assert exc.earliest > offset_of(i), (exc, i)
            j = index_at(exc.earliest)
            jumps, skipped, i = jumps + 1, skipped + j - i, j
            slot.put(begin, i, jumps, skipped)
            continue
        if not len(batch):
            if target is None and (cmd := _asked()) is not None:
                target = int(cmd[1])
            else:
                q.wait(offset_of(i), 0.05)  # asleep until the writer publishes
            continue
        for k in range(len(batch)):
            _check(batch.offsets[k], batch.payload(k), i)
            i += 1
        slot.put(begin, i, jumps, skipped)
    assert i == target, (i, target)
    q.close()
    say(f"done {i}")


MODES = {"writer": _writer, "reader": _reader, "tail": _tail}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2:])
