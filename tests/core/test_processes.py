"""Multi-process tests (the rules are in docs/concurrency.md): a reader in this process
follows a writer in a child process; writer and group locks hold across processes and are
freed when the holder exits or is SIGKILLed; a read-only reader blocked in ``poll`` wakes
promptly and sleeps (no spin).

Synchronisation is by reading the child's stdout (``ready`` lines), never by sleeping.
Children run with ``sys.executable`` and are killed and reaped in ``finally`` blocks.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

import k7core
from tests._childproc import Child
from tests._queuehelp import frame_size, payload, waiters

# --------------------------------------------------------------------------------------
# (a) a reader in this process follows a writer in another
# --------------------------------------------------------------------------------------

LO, HI = 22, 90  # payloads of 32..100 bytes


@pytest.mark.parametrize(
    ("fsync", "count", "batch"),
    [("flush", 200_000, 1), ("async", 50_000, 64), ("sync", 2_000, 1)],
)
def test_readonly_reader_follows_writer_process(
    tmp_path: Path, fsync: str, count: int, batch: int
) -> None:
    qdir = tmp_path / "q"
    seg = 1 << 20 if fsync != "sync" else 64 * 1024  # several rolls in every variant
    with Child(
        "write", str(qdir), fsync, str(seg), "0", str(count), str(LO), str(HI), "0", str(batch)
    ) as child:
        assert child.line() == b"opening"
        assert child.line() == b"ready 0 0"
        with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("reader") as g:
            received = 0
            expect_off = 0
            deadline = time.monotonic() + 40.0
            while received < count:
                assert time.monotonic() < deadline, (
                    f"only {received} of {count} messages arrived; writer rc={child.proc.poll()}"
                )
                batch_ = g.poll(max_batch=4096, timeout=1.0)
                for m in batch_:
                    p = bytes(m.payload)
                    if m.offset != expect_off or p != payload(received, LO, HI):
                        raise AssertionError(
                            f"message {received}: offset {m.offset} (expected {expect_off}), "
                            f"payload {p[:20]!r} (expected {payload(received, LO, HI)[:20]!r})"
                        )
                    expect_off += frame_size(len(p))
                    received += 1
                if batch_:
                    assert g.ack_many(batch_) == len(batch_)
            done = child.line()
            assert done == b"done %d" % expect_off, done
            assert child.wait() == 0, child.stderr()
            # Nothing more: no duplicate, no stray frame after the writer closed.
            assert g.poll(max_batch=16, timeout=0.05) == []
            assert q.end == expect_off
            assert g.committed == expect_off
    segments = sorted(p.name for p in qdir.glob("seg-*.k7"))
    assert len(segments) >= 3, f"the writer should have rolled a few times: {segments}"


# --------------------------------------------------------------------------------------
# (b) locks across processes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_locks_held_by_another_process(tmp_path: Path, ending: str) -> None:
    qdir = tmp_path / "q"
    with Child("hold", str(qdir), "g") as child:
        assert child.line() == b"ready"
        with pytest.raises(k7core.QueueLockedError):
            k7core.Queue(qdir, fsync="flush")
        with k7core.Queue(qdir, readonly=True) as ro:
            with pytest.raises(k7core.GroupBusyError):
                ro.consumer_group("g")
            ro.consumer_group("other").close()  # other groups are free
            if ending == "exit":
                child.inp.close()
                assert child.wait() == 0, child.stderr()
            else:
                child.proc.send_signal(signal.SIGKILL)
                assert child.wait() == -signal.SIGKILL
            # The locks died with the holder: both are free again.
            with ro.consumer_group("g") as g:
                assert g.committed == 0
        with k7core.Queue(qdir, fsync="flush") as q, q.consumer_group("g"):
            assert q.enqueue(b"after") == 0


def test_second_writer_and_owner_in_another_process_are_refused(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=1 << 20) as q:
        q.enqueue(b"x")
        with q.consumer_group("g"), Child("try", str(qdir), "g") as child:
            assert [child.line(), child.line()] == [b"QueueLockedError", b"GroupBusyError"]
            assert child.wait() == 0, child.stderr()
    with Child("try", str(qdir), "g") as child:
        assert [child.line(), child.line()] == [b"opened", b"opened"]
        assert child.wait() == 0, child.stderr()


# --------------------------------------------------------------------------------------
# (c) wake-up across processes, and sleeping (not spinning) while idle
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_readonly_poll_wakes_on_enqueue_and_sleeps_when_idle(tmp_path: Path, fsync: str) -> None:
    qdir = tmp_path / "q"
    with Child("wake", str(qdir), fsync) as child:
        assert child.line() == b"ready"
        with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("r") as g:
            # Idle: a 0.5 s poll on a queue nobody writes sleeps the whole time.
            cpu0, t0 = time.process_time(), time.monotonic()
            assert g.poll(max_batch=16, timeout=0.5) == []
            cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
            assert wall >= 0.45, f"poll(timeout=0.5) returned after {wall:.3f} s"
            assert cpu < 0.2, f"idle poll burnt {cpu:.3f} s of CPU in {wall:.3f} s: it spins"
            # Wake-up: the child enqueues once it sees this reader registered as a waiter.
            for i in range(3):
                child.send(str(i))
                t0 = time.monotonic()
                msgs = g.poll(max_batch=16, timeout=5.0)
                t1 = time.monotonic()
                n, off, saw, t_enq = child.line().split()
                assert int(n) == i
                assert [(m.offset, bytes(m.payload)) for m in msgs] == [(int(off), payload(i))], (
                    f"round {i}: poll returned {msgs} after {t1 - t0:.3f} s"
                )
                assert t1 - t0 < 2.0, f"round {i}: woke after {t1 - t0:.3f} s"
                assert saw == b"1", "the reader never registered as a waiter on the position"
                assert t1 - float(t_enq) < 1.0, f"round {i}: {t1 - float(t_enq):.3f} s late"
                assert g.ack_many(msgs) == 1
                assert waiters(qdir) == 0, "the waiter count is off after the wait ended"
        child.inp.close()
        assert child.wait() == 0, child.stderr()


def test_poll_wakes_when_a_writer_opens_while_it_waits(tmp_path: Path) -> None:
    """A read-only reader is already blocked in poll when a writer process opens the queue
    (a consumer started before its producer, or a writer restarted after a crash) and
    enqueues: the reader must wake promptly, and the waiter count must end at 0.

    Regression test: the writer's open used to zero the shared waiter count
    (``k7_pos_reset_waiters``) under a waiting reader, so the publish did not wake it (it
    slept its full timeout) and its decrement wrapped the count to 2**32-1, after which
    every lone waiting reader missed its wake-ups while that writer stayed open."""
    qdir = tmp_path / "q"
    k7core.Queue(qdir, fsync="flush", segment_size=1 << 20).close()
    with (
        k7core.Queue(qdir, readonly=True) as q,
        q.consumer_group("r") as g,
        Child("open-on-wait", str(qdir), "flush") as child,
    ):
        assert child.line() == b"ready"
        t0 = time.monotonic()
        msgs = g.poll(max_batch=16, timeout=3.0)
        t1 = time.monotonic()
        _, off, saw, _t = child.line().split()
        assert [(m.offset, bytes(m.payload)) for m in msgs] == [(int(off), payload(0))]
        assert saw == b"1", "the reader never registered as a waiter on the position"
        count = waiters(qdir)
        assert t1 - t0 < 2.0, f"woke after {t1 - t0:.3f} s (waiter count now {count})"
        assert count == 0, f"waiter count {count} after the only waiter returned"
        child.inp.close()
        assert child.wait() == 0, child.stderr()
