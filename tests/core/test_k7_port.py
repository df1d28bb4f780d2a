"""Port of k7's own test suite (mpenet/k7, ``test/com/s_exp/k7_test.clj``) to k7core.

Every k7 ``deftest`` has a counterpart here, named after it in the docstring. Where this
project deliberately differs from k7 (docs/format.md#differences-from-k7 and
docs/durability.md#delivery-semantics-of-consumer-groups), the test follows this project
and says so:

- ``nack`` redelivers only the nacked message, first, on a later poll (k7 rewinds the read
  head and so redelivers everything after it too);
- empty payloads are valid messages (k7 treats an empty frame as the end of the log);
- ``poll`` returns at once when messages are available (k7 waits to fill the batch);
- the corrupted-payload test corrupts a closed queue's segment file and reopens it (k7 flips
  a byte through the live mmap); the cut tail is reported as a WARNING on logger ``k7core``.

The second half tests the error API (docs/concurrency.md#errors): QueueLockedError,
GroupBusyError, InvalidNameError, TypeError on non-bytes, ClosedError, MessageTooLargeError,
CorruptFrameError.

Synchronisation never relies on sleeps: a reader waits with ``poll(timeout=...)``, which
returns as soon as data is visible.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

import k7core
from tests._queuehelp import (
    HEADER,
    crc32c,
    drain,
    file_contents,
    frame_size,
    run_python,
    segments,
    stored_cursor,
)

STRATEGIES = ("async", "flush", "sync")
SMALL_SEGMENT = 64 * 1024
# Generous upper bound for "wait until visible" polls; poll returns as soon as data arrives.
WAIT = 5.0


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def qdir(tmp_path: Path) -> str:
    return str(tmp_path / "q")


SEG = 1 << 20  # default segment size for these tests (k7's 256 MiB is kept in two tests)


def Q(path: str | os.PathLike[str], **kw: Any) -> k7core.Queue:
    """Open a queue with a 1 MiB segment size unless told otherwise."""
    if not kw.get("readonly"):
        kw.setdefault("segment_size", SEG)
    return k7core.Queue(path, **kw)


def poll_all(cg: k7core.ConsumerGroup, max_batch: int = 256, timeout: float = 0.02) -> list[bytes]:
    """k7's ``poll-all``: one poll with a short timeout, ack everything, return payloads."""
    batch = cg.poll(max_batch=max_batch, timeout=timeout)
    out = [bytes(m.payload) for m in batch]
    for m in batch:
        assert cg.ack(m) is True
    return out


def poll_n(
    cg: k7core.ConsumerGroup, n: int, *, ack: bool = True, wait: float = WAIT
) -> list[k7core.Message]:
    """Poll until n messages have been received (or the deadline passes); returns Messages."""
    got: list[k7core.Message] = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        batch = cg.poll(max_batch=n - len(got), timeout=0.1)
        if ack:
            for m in batch:
                assert cg.ack(m) is True
        got.extend(batch)
    return got


def poll_to_empty(cg: k7core.ConsumerGroup, *, ack: bool = True) -> list[k7core.Message]:
    """Poll (timeout 0.02) until an empty poll, acking each message (``ack`` is True);
    return every Message received."""
    return drain(cg, ack="each" if ack else None, timeout=0.02, max_polls=10_000)


# --------------------------------------------------------------------------------------
# basic enqueue / poll
# --------------------------------------------------------------------------------------


def test_basic_enqueue_poll(tmp_path: Path) -> None:
    """Port of k7 ``test-basic-enqueue-poll`` (k7's default 256 MiB segment size)."""
    with k7core.Queue(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        assert q.enqueue(b"hello") == 0
        assert q.enqueue(b"world") == frame_size(5)
        batch = cg.poll(max_batch=256, timeout=0.02)
        assert [m.offset for m in batch] == [0, 16]
        assert [bytes(m.payload) for m in batch] == [b"hello", b"world"]
        for m in batch:
            assert cg.ack(m) is True
        assert poll_all(cg) == []


def test_empty_poll_returns_empty(tmp_path: Path) -> None:
    """Port of k7 ``test-empty-poll-returns-empty``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        t0 = time.monotonic()
        assert cg.poll(max_batch=256, timeout=0.02) == []
        assert time.monotonic() - t0 < 2.0
        assert cg.poll(max_batch=256, timeout=0) == []
        assert cg.committed == 0
        assert cg.position == 0
        assert stored_cursor(qdir(tmp_path), "g") == 0
        assert os.path.getsize(os.path.join(qdir(tmp_path), "cursor-g.k7")) == 4096


def test_offsets_are_monotonic(tmp_path: Path) -> None:
    """Port of k7 ``test-offsets-are-monotonic``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        o1 = q.enqueue(b"a")
        o2 = q.enqueue(b"b")
        o3 = q.enqueue(b"c")
        assert o1 < o2 < o3
        assert (o1, o2, o3) == (0, 16, 32)
        assert all(o % 8 == 0 for o in (o1, o2, o3))
        batch = cg.poll(max_batch=10, timeout=0.02)
        assert [m.offset for m in batch] == [o1, o2, o3]
        for m in batch:
            assert cg.ack(m) is True


def test_offsets_are_monotonic_across_segments(tmp_path: Path) -> None:
    """Port of k7 ``test-offsets-are-monotonic``, with segments rolling (small segment_size).

    Offsets stay increasing and 8-aligned across rolls; each segment is named by its base
    offset, which is the offset of its first message; the base of a segment is the previous
    base plus the position at which the previous one was sealed.
    """
    d = qdir(tmp_path)
    payload = b"p" * 1000  # frame 1016 bytes: 4 per 4096-byte segment (4064 used)
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("g") as cg:
        offs = [q.enqueue(payload + str(i).encode()) for i in range(20)]
        assert offs == sorted(set(offs))
        assert all(o % 8 == 0 for o in offs)
        msgs = poll_to_empty(cg)
        assert [m.offset for m in msgs] == offs
        assert [bytes(m.payload) for m in msgs] == [payload + str(i).encode() for i in range(20)]
    segs = segments(d)
    assert len(segs) >= 5
    bases = [b for b, _ in segs]
    assert bases[0] == 0
    for b in bases:
        assert b in offs or b > offs[-1], f"segment base {b} is not the offset of a message"
    # base(n+1) == base(n) + sealed position: the sealed position is the end of the last frame
    for (b, _), (nb, _) in itertools.pairwise(segs):
        in_seg = [o for o in offs if b <= o < nb]
        assert in_seg, "empty sealed segment"
        last = in_seg[-1]
        assert nb == last + frame_size(len(payload) + len(str(offs.index(last))))


def test_large_payload(tmp_path: Path) -> None:
    """Port of k7 ``test-large-payload`` (64 KiB payload)."""
    data = b"\x42" * 65536
    with (
        Q(qdir(tmp_path), fsync="flush", segment_size=1 << 20) as q,
        q.consumer_group("g") as cg,
    ):
        off = q.enqueue(data)
        assert off == 0
        [m] = cg.poll(max_batch=1, timeout=0.02)
        assert m.offset == 0
        assert len(m.payload) == 65536
        assert m.payload.nbytes == 65536
        assert bytes(m.payload) == data
        assert cg.ack(m) is True
        assert cg.committed == frame_size(65536)


def test_many_messages(tmp_path: Path) -> None:
    """Port of k7 ``test-many-messages`` (1,000 messages, one poll of max_batch=1000)."""
    n = 1000
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        offs = [q.enqueue(str(i).encode()) for i in range(n)]
        batch = cg.poll(max_batch=n, timeout=0.05)
        assert len(batch) == n
        assert [m.offset for m in batch] == offs
        assert [bytes(m.payload) for m in batch] == [str(i).encode() for i in range(n)]
        for m in batch:
            assert cg.ack(m) is True
        assert cg.committed == offs[-1] + frame_size(len(str(n - 1)))
        assert cg.lag == 0


def test_many_messages_rolling_segments(tmp_path: Path) -> None:
    """Port of k7 ``test-many-messages`` with a small segment_size so segments roll."""
    n = 1000
    d = qdir(tmp_path)
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("g") as cg:
        offs = q.enqueue_many([str(i).encode() for i in range(n)])
        assert len(offs) == n
        assert offs == sorted(set(offs))
        msgs = poll_n(cg, n)
        assert [m.offset for m in msgs] == offs
        assert [bytes(m.payload) for m in msgs] == [str(i).encode() for i in range(n)]
        assert cg.poll(max_batch=10, timeout=0.02) == []
    assert len(segments(d)) >= 4  # 1000 frames of 16 bytes = 16000 bytes


def test_enqueue_many_matches_enqueue(tmp_path: Path) -> None:
    """enqueue_many returns the same offsets as one enqueue per item, and writes the same
    bytes."""
    items = [b"a", b"bb" * 10, b"", b"c" * 7]
    with Q(str(tmp_path / "one"), fsync="flush") as q1:
        singles = [q1.enqueue(x) for x in items]
    with Q(str(tmp_path / "many"), fsync="flush") as q2, q2.consumer_group("g") as cg:
        many = q2.enqueue_many(items)
        assert many == singles == [0, 16, 48, 64]
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == items
        assert q2.enqueue_many([]) == []
    assert (
        file_contents(str(tmp_path / "one"))["seg-00000000000000000000.k7"]
        == file_contents(str(tmp_path / "many"))["seg-00000000000000000000.k7"]
    )


# --------------------------------------------------------------------------------------
# payload zero-copy
# --------------------------------------------------------------------------------------


def test_payload_is_readonly_view(tmp_path: Path) -> None:
    """Port of k7 ``test-payload-is-readonly-view``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"readonly")
        [m] = cg.poll(max_batch=1, timeout=0.02)
        assert isinstance(m.payload, memoryview)
        assert m.payload.readonly
        with pytest.raises(TypeError):
            m.payload[0] = 0x41
        assert bytes(m.payload) == b"readonly"
        assert cg.ack(m) is True
        # the log itself was not modified through the view
        cg.seek(0)
        [again] = cg.poll(max_batch=1, timeout=0.02)
        assert bytes(again.payload) == b"readonly"
        cg.ack(again)


def test_empty_payload_is_a_valid_message(tmp_path: Path) -> None:
    """Deliberate difference from k7 (docs/format.md#differences-from-k7): an empty payload is
    a message, not EOF."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g") as cg:
        assert q.enqueue(b"") == 0
        assert q.enqueue(b"after") == frame_size(0)
        msgs = poll_to_empty(cg)
        assert [(m.offset, bytes(m.payload)) for m in msgs] == [(0, b""), (16, b"after")]
    with Q(d, fsync="flush") as q, q.consumer_group("g2") as cg:
        # recovery does not stop at the empty frame either
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [b"", b"after"]
        assert q.enqueue(b"x") == 32


# --------------------------------------------------------------------------------------
# ack / nack
# --------------------------------------------------------------------------------------


def test_ack_advances_cursor(tmp_path: Path) -> None:
    """Port of k7 ``test-ack-advances-cursor`` (cursor read from the cursor file)."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        q.enqueue(b"x")
        [m] = cg.poll(max_batch=1, timeout=0.02)
        assert stored_cursor(d, "g") == 0
        assert cg.committed == 0
        assert cg.position == 16
        assert cg.ack(m) is True
        assert stored_cursor(d, "g") == 16
        assert cg.committed == 16


def test_ack_by_offset(tmp_path: Path) -> None:
    """``ack`` takes a Message or its offset (k7 ``poll-all`` acks by ``(.offset m)``)."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        q.enqueue_many([b"a", b"b"])
        batch = cg.poll(max_batch=10, timeout=0.02)
        assert cg.ack(batch[0].offset) is True
        assert stored_cursor(d, "g") == 16
        assert cg.ack(batch[1].offset) is True
        assert stored_cursor(d, "g") == 32
        # not in flight any more
        assert cg.ack(batch[1].offset) is False
        assert cg.ack(batch[0]) is False
        assert cg.ack(12345 * 8) is False
        assert stored_cursor(d, "g") == 32


def test_nack_redelivers(tmp_path: Path) -> None:
    """Port of k7 ``test-nack-redelivers``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"retry-me")
        [m1] = cg.poll(max_batch=1, timeout=0.02)
        assert cg.nack(m1) is True
        [m2] = cg.poll(max_batch=1, timeout=0.02)
        assert m2.offset == m1.offset == 0
        assert bytes(m2.payload) == b"retry-me"
        assert cg.ack(m2) is True
        assert cg.committed == 24
        assert cg.poll(max_batch=1, timeout=0.02) == []


def test_nack_redelivers_only_that_message_first(tmp_path: Path) -> None:
    """Adapted k7 ``test-nack-redelivers``: here nack redelivers that message only,
    before newer ones, on a later poll; the messages after it are not redelivered, and the
    cursor never moves past an un-acked (nacked) message."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        oa, ob, oc = q.enqueue_many([b"a", b"b", b"c"])
        ma, mb, mc = cg.poll(max_batch=3, timeout=0.02)
        assert (ma.offset, mb.offset, mc.offset) == (oa, ob, oc)
        assert cg.nack(mb) is True
        assert cg.ack(ma) is True
        assert cg.ack(mc) is True
        # b is not acked: the frontier stops at it
        assert cg.committed == ob
        assert stored_cursor(d, "g") == ob
        od = q.enqueue(b"d")
        msgs = poll_to_empty(cg, ack=False)
        assert [m.offset for m in msgs] == [ob, od]  # b first, c not redelivered
        assert [bytes(m.payload) for m in msgs] == [b"b", b"d"]
        assert cg.ack(msgs[0]) is True
        assert cg.committed == od
        assert cg.ack(msgs[1]) is True
        assert cg.committed == od + 16
        assert stored_cursor(d, "g") == od + 16
        assert cg.poll(max_batch=10, timeout=0.02) == []


def test_ack_after_nack(tmp_path: Path) -> None:
    """Adapted k7 ``test-nack-redelivers``: a nacked message acked before its redelivery is
    done. Whatever poll delivers afterwards must be in flight (ackable): a delivery the
    consumer cannot acknowledge breaks the at-least-once contract."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue_many([b"a", b"b"])
        ma, mb = cg.poll(max_batch=2, timeout=0.02)
        assert cg.nack(mb) is True
        assert cg.ack(mb) is True  # still un-acked, so in flight: the ack counts
        assert cg.ack(ma) is True
        assert cg.committed == 32
        for m in poll_to_empty(cg, ack=False):
            assert cg.ack(m) is True, f"{m!r} was delivered but is not in flight"
        assert cg.committed == 32


def test_nack_not_in_flight_returns_false(tmp_path: Path) -> None:
    """``nack`` of an offset not in flight is ignored and returns False
    (docs/durability.md#delivery-semantics-of-consumer-groups)."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"a")
        assert cg.nack(0) is False  # not delivered yet
        [m] = cg.poll(max_batch=1, timeout=0.02)
        assert cg.ack(m) is True
        assert cg.nack(m) is False  # already acked
        assert cg.poll(max_batch=1, timeout=0.02) == []  # ... and not redelivered


def test_partial_ack_cursor(tmp_path: Path) -> None:
    """Port of k7 ``test-partial-ack-cursor``: out-of-order acks advance the cursor only to
    the contiguous frontier."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        q.enqueue(b"a")
        q.enqueue(b"b")
        q.enqueue(b"c")
        m1, m2, m3 = cg.poll(max_batch=3, timeout=0.02)
        assert cg.ack(m2) is True
        assert stored_cursor(d, "g") == m1.offset == 0
        assert cg.committed == m1.offset
        assert cg.ack(m1) is True
        assert stored_cursor(d, "g") == m3.offset == 32
        assert cg.committed == m3.offset
        assert cg.ack(m3) is True
        assert stored_cursor(d, "g") == 48
        assert cg.committed == 48


def test_partial_ack_frontier_many(tmp_path: Path) -> None:
    """Port of k7 ``test-partial-ack-cursor``, longer: ack in reverse order; the cursor
    stays at the first message until it is acked, then jumps to the read position."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        offs = q.enqueue_many([bytes([65 + i]) for i in range(8)])
        msgs = cg.poll(max_batch=8, timeout=0.02)
        assert [m.offset for m in msgs] == offs
        for m in reversed(msgs[1:]):
            assert cg.ack(m) is True
            assert stored_cursor(d, "g") == 0
        # now the first one: the cursor jumps to the read position
        assert cg.ack(msgs[0]) is True
        assert stored_cursor(d, "g") == offs[-1] + 16 == cg.position
        # interleaved: in flight 0..3, ack 1 and 3, then 0 -> frontier is 2
        more = q.enqueue_many([b"w", b"x", b"y", b"z"])
        batch = cg.poll(max_batch=4, timeout=0.02)
        assert [m.offset for m in batch] == more
        cg.ack(batch[1])
        cg.ack(batch[3])
        assert stored_cursor(d, "g") == more[0]
        cg.ack(batch[0])
        assert stored_cursor(d, "g") == more[2]
        cg.ack(batch[2])
        assert stored_cursor(d, "g") == more[3] + 16


# --------------------------------------------------------------------------------------
# seek
# --------------------------------------------------------------------------------------


def test_seek_to_beginning(tmp_path: Path) -> None:
    """Port of k7 ``test-seek-to-beginning``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"a")
        q.enqueue(b"b")
        assert poll_all(cg) == [b"a", b"b"]
        assert cg.committed == 32
        cg.seek(0)
        assert cg.committed == 0
        assert cg.position == 0
        assert poll_all(cg) == [b"a", b"b"]


def test_seek_to_mid(tmp_path: Path) -> None:
    """Port of k7 ``test-seek-to-mid``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"a")
        o2 = q.enqueue(b"b")
        q.enqueue(b"c")
        assert poll_all(cg) == [b"a", b"b", b"c"]
        cg.seek(o2)
        assert cg.position == o2
        batch = cg.poll(max_batch=10, timeout=0.02)
        assert [m.offset for m in batch] == [o2, o2 + 16]
        assert [bytes(m.payload) for m in batch] == [b"b", b"c"]


def test_seek_clears_in_flight(tmp_path: Path) -> None:
    """k7 ``seek!`` clears the pending set: messages in flight before a seek can no longer
    be acked, and the cursor is the seek target."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        q.enqueue_many([b"a", b"b", b"c"])
        batch = cg.poll(max_batch=3, timeout=0.02)
        cg.seek(16)
        assert stored_cursor(d, "g") == 16
        assert cg.ack(batch[2]) is False
        assert stored_cursor(d, "g") == 16
        assert poll_all(cg) == [b"b", b"c"]


def test_seek_persists_cursor(tmp_path: Path) -> None:
    """Port of k7 ``test-seek-persists-cursor``: reopen the group, it resumes at the seek."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        o1 = q.enqueue(b"a")
        q.enqueue(b"b")
        with q.consumer_group("g", cursor_fsync="sync") as cg:
            assert poll_all(cg) == [b"a", b"b"]
            assert stored_cursor(d, "g") == 32
            cg.seek(o1)
            assert stored_cursor(d, "g") == o1 == 0  # seek persists at once
        assert stored_cursor(d, "g") == 0
        with q.consumer_group("g") as cg2:
            assert cg2.committed == 0
            assert poll_all(cg2) == [b"a", b"b"]


def test_seek_persists_across_queue_reopen(tmp_path: Path) -> None:
    """Port of k7 ``test-seek-persists-cursor``, across a reopen of the whole queue."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue_many([b"a", b"b", b"c"])
        assert poll_all(cg) == [b"a", b"b", b"c"]
        cg.seek(16)
    assert stored_cursor(d, "g") == 16
    with Q(d, fsync="flush") as q, q.consumer_group("g") as cg:
        assert cg.committed == 16
        assert cg.position == 16
        assert poll_all(cg) == [b"b", b"c"]


# --------------------------------------------------------------------------------------
# crash recovery
# --------------------------------------------------------------------------------------


def test_recover_after_close(tmp_path: Path) -> None:
    """Port of k7 ``test-recover-after-close`` (k7's default 256 MiB segment size)."""
    d = qdir(tmp_path)
    with k7core.Queue(d, fsync="flush") as q:
        assert q.enqueue(b"persist-me") == 0
    assert os.path.getsize(os.path.join(d, "seg-00000000000000000000.k7")) == 256 << 20
    with k7core.Queue(d, fsync="flush") as q2, q2.consumer_group("g") as cg:
        batch = cg.poll(max_batch=256, timeout=0.02)
        assert [(m.offset, bytes(m.payload)) for m in batch] == [(0, b"persist-me")]
        cg.ack(batch[0])
        # the write position was recovered: the next frame follows the old one
        assert q2.enqueue(b"next") == frame_size(10)
        assert poll_all(cg) == [b"next"]


def test_recover_after_close_multi_segment(tmp_path: Path) -> None:
    """Port of k7 ``test-recover-after-close`` across rolled segments."""
    d = qdir(tmp_path)
    payloads = [bytes([i]) * 900 for i in range(12)]  # frame 912: 4 per 4096
    with Q(d, fsync="flush", segment_size=4096) as q:
        offs = q.enqueue_many(payloads)
    before = [b for b, _ in segments(d)]
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("g") as cg:
        msgs = poll_to_empty(cg)
        assert [m.offset for m in msgs] == offs
        assert [bytes(m.payload) for m in msgs] == payloads
        nxt = q.enqueue(b"tail")
        assert nxt > offs[-1]
        assert poll_all(cg) == [b"tail"]
    assert [b for b, _ in segments(d)][: len(before)] == before


def test_cursor_survives_restart(tmp_path: Path) -> None:
    """Port of k7 ``test-cursor-survives-restart``."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
        with q.consumer_group("g", cursor_fsync="sync") as cg:
            [m] = cg.poll(max_batch=1, timeout=0.02)
            assert bytes(m.payload) == b"a"
            assert cg.ack(m) is True
    assert stored_cursor(d, "g") == 16
    with Q(d, fsync="flush") as q2, q2.consumer_group("g", cursor_fsync="sync") as cg2:
        assert cg2.committed == 16
        assert poll_all(cg2) == [b"b"]
        assert stored_cursor(d, "g") == 32


# --------------------------------------------------------------------------------------
# multiple consumer groups
# --------------------------------------------------------------------------------------


def test_independent_consumer_groups(tmp_path: Path) -> None:
    """Port of k7 ``test-independent-consumer-groups``."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        with q.consumer_group("g1") as cg1, q.consumer_group("g2") as cg2:
            q.enqueue(b"shared")
            assert poll_all(cg1) == [b"shared"]
            assert cg1.committed == 16
            assert cg2.committed == 0
            assert poll_all(cg2) == [b"shared"]
            q.enqueue(b"more")
            assert poll_all(cg1) == [b"more"]
            assert cg2.lag == 16
            assert cg2.committed == 16
        # both groups closed: their cursors are on disk
        assert stored_cursor(d, "g1") == 32
        assert stored_cursor(d, "g2") == 16
        with q.consumer_group("g2") as cg2:
            assert poll_all(cg2) == [b"more"]
        with q.consumer_group("g3") as cg3:  # a new group starts at the beginning
            assert poll_all(cg3) == [b"shared", b"more"]


# --------------------------------------------------------------------------------------
# fsync strategies
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cursor_fsync", STRATEGIES)
@pytest.mark.parametrize("fsync", STRATEGIES)
def test_fsync_strategies(tmp_path: Path, fsync: str, cursor_fsync: str) -> None:
    """Port of k7 ``test-fsync-strategies`` (queue fsync x cursor_fsync, all combinations).

    Under "async" the message becomes visible once the background fsync ran; the poll waits
    for it (instead of k7's ``wait-committed`` spin)."""
    d = qdir(tmp_path)
    with Q(d, fsync=fsync) as q:
        with q.consumer_group("g", cursor_fsync=cursor_fsync) as cg:
            assert q.enqueue(b"x") == 0
            msgs = poll_n(cg, 1)
            assert [(m.offset, bytes(m.payload)) for m in msgs] == [(0, b"x")]
            assert cg.committed == 16
            assert q.enqueue_many([b"y", b"z"]) == [16, 32]
            msgs = poll_n(cg, 2)
            assert [bytes(m.payload) for m in msgs] == [b"y", b"z"]
            assert cg.committed == 48
            if cursor_fsync != "async":
                assert stored_cursor(d, "g") == 48
        # close does a final flush of the cursor, whatever the strategy
        assert stored_cursor(d, "g") == 48
    with Q(d, fsync=fsync) as q, q.consumer_group("g", cursor_fsync=cursor_fsync) as cg:
        assert cg.committed == 48
        assert cg.poll(max_batch=10, timeout=0.02) == []
        cg.seek(0)
        assert [bytes(m.payload) for m in poll_n(cg, 3)] == [b"x", b"y", b"z"]


def test_fsync_strategy_rejects_unknown(tmp_path: Path) -> None:
    """The strategies are exactly "async" | "flush" | "sync"; anything else is refused."""
    with pytest.raises(ValueError):
        Q(qdir(tmp_path), fsync="always")
    with Q(qdir(tmp_path), fsync="flush") as q, pytest.raises(ValueError):
        q.consumer_group("g", cursor_fsync="never")


# --------------------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------------------


def test_batch_respects_max(tmp_path: Path) -> None:
    """Port of k7 ``test-batch-respects-max``."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        offs = [q.enqueue(b"x") for _ in range(20)]
        batch = cg.poll(max_batch=5, timeout=0.02)
        assert len(batch) == 5
        assert [m.offset for m in batch] == offs[:5]
        for m in batch:
            cg.ack(m)
        rest = poll_to_empty(cg)
        assert [m.offset for m in rest] == offs[5:]


def test_poll_returns_partial_on_timeout(tmp_path: Path) -> None:
    """Port of k7 ``test-poll-returns-partial-on-timeout``.

    Here poll returns at once when messages are available (k7 waited for the timeout to
    fill the batch), so a generous timeout must not be spent."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        q.enqueue(b"only-one")
        t0 = time.monotonic()
        batch = cg.poll(max_batch=100, timeout=3.0)
        elapsed = time.monotonic() - t0
        assert [bytes(m.payload) for m in batch] == [b"only-one"]
        assert elapsed < 1.5
        cg.ack(batch[0])


# --------------------------------------------------------------------------------------
# frame integrity
# --------------------------------------------------------------------------------------


def _write_and_corrupt_tail(d: str) -> tuple[list[int], int]:
    """Write two intact messages and one more, close, flip a payload byte of the last."""
    with Q(d, fsync="sync") as q:
        offs = [q.enqueue(b"intact-1"), q.enqueue(b"intact-2"), q.enqueue(b"corrupt-me")]
    assert offs == [0, 24, 48]
    [(base, seg)] = segments(d)
    assert base == 0
    with open(seg, "r+b") as f:
        f.seek(offs[2] + HEADER)
        b = f.read(1)
        assert b == b"c"
        f.seek(offs[2] + HEADER)
        f.write(bytes([b[0] ^ 0xFF]))
    return offs, offs[2]


def test_crc_validation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Port of k7 ``test-crc-validation``: a corrupted payload is never delivered.

    The corrupt frame is the tail of the last segment, so recovery cuts it and logs a WARNING
    on logger "k7core"; the intact messages before it are delivered."""
    d = qdir(tmp_path)
    _offs, bad = _write_and_corrupt_tail(d)
    caplog.set_level(logging.WARNING, logger="k7core")
    with Q(d, fsync="flush") as q, q.consumer_group("g") as cg:
        warnings = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and (r.name == "k7core" or r.name.startswith("k7core."))
        ]
        assert warnings, f"no WARNING on logger k7core: {caplog.records!r}"
        batch = cg.poll(max_batch=10, timeout=0.02)
        assert [(m.offset, bytes(m.payload)) for m in batch] == [
            (0, b"intact-1"),
            (24, b"intact-2"),
        ]
        for m in batch:
            cg.ack(m)
        assert cg.poll(max_batch=10, timeout=0.02) == []
        assert cg.committed == bad
        # the write position is the end of the last valid frame: the cut tail is overwritten
        assert q.enqueue(b"fresh") == bad
        msgs = poll_to_empty(cg)
        assert [(m.offset, bytes(m.payload)) for m in msgs] == [(bad, b"fresh")]
        assert all(b"corrupt" not in bytes(m.payload) for m in msgs)


def test_crc_validation_readonly_open(tmp_path: Path) -> None:
    """Port of k7 ``test-crc-validation`` through a read-only open (no writer to cut the
    tail): the intact messages are delivered, the corrupt frame is not (the reader may stop
    there or raise CorruptFrameError at its offset)."""
    d = qdir(tmp_path)
    _write_and_corrupt_tail(d)
    with Q(d, readonly=True) as q, q.consumer_group("g") as cg:
        got: list[k7core.Message] = []
        for _ in range(5):
            try:
                batch = cg.poll(max_batch=256, timeout=0.02)
            except k7core.CorruptFrameError as e:
                # no writer cut the tail: reporting the corruption is fine, delivering it not
                assert e.offset == 48
                break
            if not batch:
                break
            for m in batch:
                cg.ack(m)
            got.extend(batch)
        assert [(m.offset, bytes(m.payload)) for m in got] == [
            (0, b"intact-1"),
            (24, b"intact-2"),
        ]


def test_cut_tail_is_kept_and_zeroed(tmp_path: Path) -> None:
    """Recovery (docs/format.md#recovery; extends k7 ``test-crc-validation``): the cut tail is
    kept in a side file and zeroed before new writes, so the stale frame can never
    reappear."""
    d = qdir(tmp_path)
    _offs, bad = _write_and_corrupt_tail(d)
    [(_, seg)] = segments(d)
    with open(seg, "rb") as f:
        f.seek(bad)
        corrupt_frame = f.read(HEADER + len(b"corrupt-me"))  # without the zero pad
    with Q(d, fsync="sync") as q:
        assert q.enqueue(b"n") == bad  # 16-byte frame over the old 24-byte one
    side = {
        name: content
        for name, content in file_contents(d).items()
        if not (name.startswith("seg-") or name.startswith("cursor-"))
    }
    assert any(corrupt_frame in content for content in side.values()), sorted(side)
    with open(seg, "rb") as f:
        f.seek(bad + 16)
        assert f.read(64) == bytes(64)
    # and a later reopen sees exactly the three good messages
    with Q(d, fsync="flush") as q, q.consumer_group("g") as cg:
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [b"intact-1", b"intact-2", b"n"]


def test_on_disk_frame_format(tmp_path: Path) -> None:
    """The frame and file layout k7 reads (docs/format.md): magic 0x4B, flags 0x01, BE u32 length,
    BE u32 CRC32C of the payload, payload, zero padding to 8; preallocated segment file named
    seg-%020d.k7; 4096-byte cursor file with the BE int64 committed offset at byte 0."""
    d = qdir(tmp_path)
    with Q(d, fsync="sync", segment_size=SMALL_SEGMENT) as q:
        q.enqueue(b"hello")
        q.enqueue(b"0123456789abcdef")
        with q.consumer_group("workers", cursor_fsync="sync") as cg:
            [m] = cg.poll(max_batch=1, timeout=0.02)
            cg.ack(m)
    files = file_contents(d)
    seg = files["seg-00000000000000000000.k7"]
    assert len(seg) == SMALL_SEGMENT
    assert seg[0:16] == (b"\x4b\x01" + struct.pack(">II", 5, crc32c(b"hello")) + b"hello" + b"\x00")
    p2 = b"0123456789abcdef"
    assert seg[16 : 16 + 32] == (
        b"\x4b\x01" + struct.pack(">II", 16, crc32c(p2)) + p2 + b"\x00" * 6
    )
    assert seg[48:] == bytes(SMALL_SEGMENT - 48)
    cur = files["cursor-workers.k7"]
    assert len(cur) == 4096
    assert struct.unpack(">q", cur[:8])[0] == 16
    assert [n for n in files if n.endswith(".k7")] == [
        "cursor-workers.k7",
        "seg-00000000000000000000.k7",
    ]


# --------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------


def test_committed_position_lag(tmp_path: Path) -> None:
    """``committed`` (the cursor on disk), ``position`` (next offset to read) and ``lag``
    (bytes: end of visible log minus committed)."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g", cursor_fsync="sync") as cg:
        assert (cg.committed, cg.position, cg.lag) == (0, 0, 0)
        q.enqueue_many([b"a", b"b", b"c"])
        assert (cg.committed, cg.position, cg.lag) == (0, 0, 48)
        batch = cg.poll(max_batch=2, timeout=0.02)
        assert (cg.committed, cg.position, cg.lag) == (0, 32, 48)
        cg.ack(batch[0])
        assert (cg.committed, cg.position, cg.lag) == (16, 32, 32)
        assert stored_cursor(d, "g") == cg.committed
        cg.ack(batch[1])
        assert (cg.committed, cg.position, cg.lag) == (32, 32, 16)
        poll_all(cg)
        assert (cg.committed, cg.position, cg.lag) == (48, 48, 0)


# --------------------------------------------------------------------------------------
# error API
# --------------------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    """One base class with specific subclasses; InvalidNameError is also a ValueError."""
    for name in (
        "QueueLockedError",
        "GroupBusyError",
        "ClosedError",
        "CorruptFrameError",
        "MessageTooLargeError",
        "InvalidNameError",
    ):
        cls = getattr(k7core, name)
        assert issubclass(cls, k7core.K7Error), name
        assert issubclass(cls, Exception)
    assert issubclass(k7core.InvalidNameError, ValueError)
    assert issubclass(k7core.K7Error, Exception)


def test_second_writer_same_process_is_locked(tmp_path: Path) -> None:
    """A second writer on the same directory gets QueueLockedError at open."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        q.enqueue(b"a")
        before = file_contents(d)
        with pytest.raises(k7core.QueueLockedError) as ei:
            Q(d, fsync="flush")
        assert isinstance(ei.value, k7core.K7Error)
        assert file_contents(d) == before
        assert q.enqueue(b"b") == 16  # the first writer is unaffected
    with Q(d, fsync="flush") as q2, q2.consumer_group("g") as cg:  # lock released
        assert poll_all(cg) == [b"a", b"b"]


def test_second_writer_other_process_is_locked(tmp_path: Path) -> None:
    """A writer in another process gets QueueLockedError while this one holds the queue."""
    d = qdir(tmp_path)
    code = (
        "import sys, k7core\n"
        "try:\n"
        "    k7core.Queue(sys.argv[1], segment_size=1 << 20)\n"
        "except k7core.QueueLockedError:\n"
        "    print('locked')\n"
        "else:\n"
        "    print('opened')\n"
    )
    with Q(d, fsync="flush") as q:
        q.enqueue(b"a")
        assert run_python(code, d, timeout=60).strip() == "locked"
        assert q.enqueue(b"b") == 16
    assert run_python(code, d, timeout=60).strip() == "opened"


def test_readonly_open_beside_writer(tmp_path: Path) -> None:
    """``readonly=True`` takes no writer lock; it reads, and its enqueue raises."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        q.enqueue_many([b"a", b"b"])
        with Q(d, readonly=True) as r, r.consumer_group("reader") as cg:
            assert poll_all(cg) == [b"a", b"b"]
            with pytest.raises(k7core.K7Error):
                r.enqueue(b"nope")
            q.enqueue(b"c")
            msgs = poll_n(cg, 1)
            assert [bytes(m.payload) for m in msgs] == [b"c"]
        assert stored_cursor(d, "reader") == 48


def test_group_busy(tmp_path: Path) -> None:
    """The same group opened twice gets GroupBusyError; free again once closed."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        q.enqueue(b"a")
        cg = q.consumer_group("g")
        with pytest.raises(k7core.GroupBusyError) as ei:
            q.consumer_group("g")
        assert isinstance(ei.value, k7core.K7Error)
        # the owner still works
        assert poll_all(cg) == [b"a"]
        with q.consumer_group("other") as other:  # other groups are not affected
            assert poll_all(other) == [b"a"]
        cg.close()
        with q.consumer_group("g") as again:
            assert again.committed == 16


def test_group_busy_across_readonly_open(tmp_path: Path) -> None:
    """Group ownership is a lock, also between a writer's group and a read-only open's."""
    d = qdir(tmp_path)
    with (
        Q(d, fsync="flush") as q,
        q.consumer_group("g"),
        Q(d, readonly=True) as r,
        pytest.raises(k7core.GroupBusyError),
    ):
        r.consumer_group("g")


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "a\\b", "..", "x\x00y", "g" * 201, "\u00e9" * 101],
    ids=["empty", "slash", "backslash", "dotdot", "nul", "201-bytes", "202-utf8-bytes"],
)
def test_invalid_group_names(tmp_path: Path, name: str) -> None:
    """Unsafe or unreasonable group names raise InvalidNameError, a K7Error and a ValueError,
    and create nothing."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q:
        before = sorted(os.listdir(tmp_path)), sorted(os.listdir(d))
        with pytest.raises(k7core.InvalidNameError) as ei:
            q.consumer_group(name)
        assert isinstance(ei.value, ValueError)
        assert isinstance(ei.value, k7core.K7Error)
        with pytest.raises(ValueError):
            q.consumer_group(name)
        assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(d))) == before


def test_group_name_of_200_bytes_is_valid(tmp_path: Path) -> None:
    """200 bytes is the longest accepted group name."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush") as q, q.consumer_group("g" * 200) as cg:
        q.enqueue(b"a")
        assert poll_all(cg) == [b"a"]
    assert stored_cursor(d, "g" * 200) == 16


@pytest.mark.parametrize("bad", ["text", 42, None, 3.5])
def test_enqueue_non_bytes_is_type_error(tmp_path: Path, bad: object) -> None:
    """enqueue of a str, int, ... raises TypeError and writes nothing."""
    with Q(qdir(tmp_path), fsync="flush") as q, q.consumer_group("g") as cg:
        with pytest.raises(TypeError):
            q.enqueue(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            q.enqueue_many([bad])  # type: ignore[list-item]
        assert cg.poll(max_batch=10, timeout=0.02) == []
        assert q.enqueue(b"ok") == 0
        assert poll_all(cg) == [b"ok"]


def test_use_after_close(tmp_path: Path) -> None:
    """Use after close raises ClosedError; close() is idempotent; closing the queue closes
    its groups first."""
    d = qdir(tmp_path)
    q = Q(d, fsync="flush")
    q.enqueue(b"a")
    cg = q.consumer_group("g")
    own = q.consumer_group("own")
    own.close()
    own.close()  # idempotent
    with pytest.raises(k7core.ClosedError):
        own.poll(max_batch=1, timeout=0)
    q.close()
    q.close()  # idempotent
    for call in (
        lambda: q.enqueue(b"x"),
        lambda: q.enqueue_many([b"x"]),
        lambda: q.consumer_group("h"),
        lambda: cg.poll(max_batch=1, timeout=0),
        lambda: cg.seek(0),
        lambda: cg.ack(0),
        lambda: cg.nack(0),
    ):
        with pytest.raises(k7core.ClosedError) as ei:
            call()
        assert isinstance(ei.value, k7core.K7Error)
    cg.close()  # still idempotent after the queue closed it
    with Q(d, fsync="flush") as q2, q2.consumer_group("h") as h:
        assert poll_all(h) == [b"a"]


def test_close_while_payload_view_held(tmp_path: Path) -> None:
    """close() never raises because a caller still holds a payload view."""
    d = qdir(tmp_path)
    q = Q(d, fsync="flush")
    q.enqueue(b"held")
    cg = q.consumer_group("g")
    [m] = cg.poll(max_batch=1, timeout=0.02)
    view = m.payload
    assert bytes(view) == b"held"
    cg.close()
    q.close()
    q.close()
    del view, m


def test_message_too_large(tmp_path: Path) -> None:
    """A message larger than an empty segment raises MessageTooLargeError and leaves the
    queue unchanged (same files, same sizes, same bytes); the next enqueue works."""
    d = qdir(tmp_path)
    with (
        Q(d, fsync="flush", segment_size=SMALL_SEGMENT) as q,
        q.consumer_group("g", cursor_fsync="sync") as cg,
    ):
        offs = q.enqueue_many([b"a" * 1000, b"b" * 2000])
        before = file_contents(d)
        for size in (SMALL_SEGMENT, SMALL_SEGMENT + 1, SMALL_SEGMENT - HEADER + 1, 1 << 20):
            with pytest.raises(k7core.MessageTooLargeError) as ei:
                q.enqueue(b"z" * size)
            assert isinstance(ei.value, k7core.K7Error)
            assert file_contents(d) == before
        with pytest.raises(k7core.MessageTooLargeError):
            q.enqueue_many([b"z" * (SMALL_SEGMENT + 8)])
        assert file_contents(d) == before
        nxt = q.enqueue(b"ok")
        assert nxt == offs[1] + frame_size(2000)
        msgs = poll_to_empty(cg)
        assert [bytes(m.payload) for m in msgs] == [b"a" * 1000, b"b" * 2000, b"ok"]
        assert [m.offset for m in msgs] == [*offs, nxt]
    assert [b for b, _ in segments(d)] == [0]
    with Q(d, fsync="flush", segment_size=SMALL_SEGMENT) as q, q.consumer_group("h") as cg:
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [b"a" * 1000, b"b" * 2000, b"ok"]


def test_message_too_large_in_batch(tmp_path: Path) -> None:
    """enqueue_many with one message larger than an empty segment raises
    MessageTooLargeError and leaves the queue unchanged: none of the batch is written (the
    caller gets no offsets, so a partial write could only be duplicated by a retry)."""
    d = qdir(tmp_path)
    with (
        Q(d, fsync="flush", segment_size=4096) as q,
        q.consumer_group("g") as cg,
    ):
        first = q.enqueue(b"first")
        before = file_contents(d)
        with pytest.raises(k7core.MessageTooLargeError):
            q.enqueue_many([b"ok", b"x" * 5000, b"after"])
        assert file_contents(d) == before
        assert q.enqueue(b"next") == first + 16
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [b"first", b"next"]


def test_message_that_fits_only_an_empty_segment_rolls(tmp_path: Path) -> None:
    """A message that does not fit the rest of the current segment rolls to a new segment
    named by the sealed position (global offset) — no error, no duplicate file."""
    d = qdir(tmp_path)
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("g") as cg:
        o1 = q.enqueue(b"a" * 3000)
        o2 = q.enqueue(b"b" * 3000)
        assert o1 == 0
        assert o2 == frame_size(3000)
        assert [b for b, _ in segments(d)] == [0, o2]
        msgs = poll_to_empty(cg)
        assert [(m.offset, len(m.payload)) for m in msgs] == [(0, 3000), (o2, 3000)]
        assert bytes(msgs[1].payload) == b"b" * 3000


def test_frame_exactly_segment_size(tmp_path: Path) -> None:
    """A frame exactly the size of an empty segment (a k7 bug: rolls onto the same file)
    either fits a fresh segment or is refused cleanly; either way the log stays readable and
    no segment file is mapped twice."""
    d = qdir(tmp_path)
    exact = b"e" * (4096 - HEADER)  # frame_size == 4096
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("g") as cg:
        o1 = q.enqueue(b"a")
        before = file_contents(d)
        try:
            o2 = q.enqueue(exact)
        except k7core.MessageTooLargeError:
            assert file_contents(d) == before
            expected = [b"a"]
        else:
            assert o2 == 16
            assert [b for b, _ in segments(d)] == [0, 16]
            expected = [b"a", exact]
        o3 = q.enqueue(b"z")
        assert o3 > o1
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [*expected, b"z"]
    with Q(d, fsync="flush", segment_size=4096) as q, q.consumer_group("h") as cg:
        assert [bytes(m.payload) for m in poll_to_empty(cg)] == [*expected, b"z"]


def test_corrupt_frame_in_sealed_segment(tmp_path: Path) -> None:
    """docs/format.md#recovery: corruption inside a sealed (not last) segment is not cut; a
    reader gets the valid messages before it, then CorruptFrameError with the offset; seek
    past it (to the next segment's base) continues."""
    d = qdir(tmp_path)
    payloads = [bytes([i]) * 100 for i in range(50)]  # frame 112: 36 per 4096-byte segment
    with Q(d, fsync="sync", segment_size=4096) as q:
        offs = q.enqueue_many(payloads)
    segs = segments(d)
    assert len(segs) == 2
    base1 = segs[1][0]
    assert base1 in offs
    bad_index = 10
    bad = offs[bad_index]
    assert bad < base1
    with open(segs[0][1], "r+b") as f:
        f.seek(bad + HEADER + 5)
        f.write(b"\xff")
    corrupted_seg0 = file_contents(d)[segs[0][1].name]
    with (
        Q(d, fsync="flush", segment_size=4096) as q,
        q.consumer_group("g", cursor_fsync="sync") as cg,
    ):
        got: list[k7core.Message] = []
        err = None
        for _ in range(5):
            try:
                batch = cg.poll(max_batch=256, timeout=0.01)
            except k7core.CorruptFrameError as e:
                err = e
                break
            for m in batch:
                cg.ack(m)
            got.extend(batch)
        assert err is not None, "CorruptFrameError was never raised"
        assert isinstance(err, k7core.K7Error)
        assert err.offset == bad
        assert [m.offset for m in got] == offs[:bad_index]
        assert [bytes(m.payload) for m in got] == payloads[:bad_index]
        assert cg.committed == bad
        cg.seek(base1)
        assert stored_cursor(d, "g") == base1
        rest = poll_to_empty(cg)
        assert [m.offset for m in rest] == [o for o in offs if o >= base1]
        assert [bytes(m.payload) for m in rest] == payloads[offs.index(base1) :]
        # the writer appends after the intact last segment
        nxt = q.enqueue(b"after")
        assert nxt == offs[-1] + frame_size(100)
        assert poll_all(cg) == [b"after"]
    # nothing in the sealed segment was truncated or rewritten
    assert file_contents(d)[segs[0][1].name] == corrupted_seg0


def test_accepts_pathlike(tmp_path: Path) -> None:
    """Queue accepts an os.PathLike directory and creates it."""
    p = tmp_path / "nested" / "q"
    with Q(p, fsync="flush") as q, q.consumer_group("g") as cg:
        assert q.enqueue(b"a") == 0
        assert poll_all(cg) == [b"a"]
    assert (p / "seg-00000000000000000000.k7").exists()
