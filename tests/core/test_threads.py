"""Thread misuse is detected: a consumer group or a queue's writer used by a second thread
while a first one is inside a call on it raises ConcurrentUseError, and nothing breaks.

The first thread is held inside its call by something the test controls (a poll asleep on
an empty queue; a ``sync`` waiting for the flusher's lock, which the test holds), and the
test learns it is there from the state it waits on, not from a sleep.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import read_records, wait_until, waiters

DEADLINE = 30.0


def test_group_used_while_another_thread_polls(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        g = q.consumer_group("g")
        got: list[list[k7core.Message]] = []
        t = threading.Thread(target=lambda: got.append(g.poll(max_batch=8, timeout=DEADLINE)))
        t.start()
        # the poller is asleep in the kernel once it registered as a waiter
        wait_until(lambda: waiters(q.path) > 0, DEADLINE, "the poller to wait")
        for call in (lambda: g.poll(max_batch=1, timeout=0), lambda: g.ack(0),
                     lambda: g.nack(0), lambda: g.seek(0), g.close, q.close):
            with pytest.raises(k7core.ConcurrentUseError, match="another thread"):
                call()
        assert not q.closed and not g.closed
        off = q.enqueue(b"wake up")
        t.join(DEADLINE)
        assert not t.is_alive()
        assert [(m.offset, bytes(m.payload)) for m in got[0]] == [(off, b"wake up")]
        assert g.ack(got[0][0]) and g.committed == q.end  # the owner thread has left
        g.close()


def test_writer_used_while_another_thread_is_inside_sync(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="async") as q:
        first = q.enqueue(b"before")
        lock = q._log.flush_slot().lock  # the test holds the lock that sync() needs
        inside = threading.Event()
        done = threading.Event()

        def syncer() -> None:
            inside.set()
            q.sync()
            done.set()

        t = threading.Thread(target=syncer)
        with lock:
            t.start()
            assert inside.wait(DEADLINE)
            refused: list[Exception] = []

            def refused_once() -> bool:
                try:  # succeeds until the syncer owns the writer, then refuses
                    q.enqueue(b"racing")
                except k7core.ConcurrentUseError as exc:
                    refused.append(exc)
                return bool(refused)

            wait_until(refused_once, DEADLINE, "the syncer to own the writer")
            with pytest.raises(k7core.ConcurrentUseError):
                q.enqueue_many([b"a", b"b"])
            with pytest.raises(k7core.ConcurrentUseError):
                q.close()
            assert not done.is_set()
        t.join(DEADLINE)
        assert done.is_set()
        last = q.enqueue(b"after")  # the writer is free again and the log is intact
        q.sync()
        batch = q.read_columnar(first)
        payloads = [bytes(batch.payload(i)) for i in range(len(batch))]
        assert payloads[0] == b"before" and payloads[-1] == b"after"
        assert set(payloads[1:-1]) <= {b"racing"} and batch.offsets[-1] == last


def test_read_columnar_from_several_threads(tmp_path: Path) -> None:
    """Each call reads with a reader of its own: four threads reading the whole log (across
    many segments) at once get exactly the right payloads, every time."""
    qdir = tmp_path / "q"
    payloads = [b"%05d:" % i + bytes([97 + i % 26]) * (i % 200) for i in range(5000)]
    with k7core.Queue(qdir, segment_size=4096, fsync="flush") as q:
        expected = list(zip(q.enqueue_many(payloads), payloads, strict=True))
        errors: list[str] = []
        start = threading.Barrier(4)

        def scan(seed: int) -> None:
            start.wait()
            for round_ in range(15):
                size = 1 + (seed * 7 + round_ * 13) % 300
                if read_records(q, 0, size) != expected:
                    errors.append(f"thread {seed} round {round_}: wrong read")
                    return

        threads = [threading.Thread(target=scan, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
