"""Lifetimes of what k7core maps (docs/concurrency.md, "Lifetimes"): an object backed by a
queue's native memory either keeps that memory alive or, once its queue is closed, raises
ClosedError; it never touches freed memory.

The cases that crashed (SIGSEGV, glibc aborts) run in a child process, so that a crash fails
the test with its exit status instead of ending the run. The stress test of the same rules,
under AddressSanitizer, is test_lifetime_stress.py.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import k7core
from k7core._flusher import FLUSHERS
from tests._queuehelp import run_python, wait_until, waiters

DEADLINE = 30.0
SMALL = 1 << 20  # segment size: the tests write little


def _flusher_slots(interval: float) -> int:
    """How many slots the flusher of ``interval`` serves (0: no such flusher)."""
    fl = FLUSHERS._flushers.get(round(interval * 1e9))
    return fl.slots if fl is not None else 0


def test_first_async_groups_opened_at_once_share_the_queues_flusher_slot(
    tmp_path: Path,
) -> None:
    # fsync="sync": the queue takes no flusher slot at open; its first async groups do. Two
    # slots for one queue were the bug: the one dropped was freed while still attached.
    interval = 321e-6  # a flusher of its own in this process
    for r in range(20):
        with k7core.Queue(tmp_path / f"q{r}", fsync="sync", segment_size=SMALL,
                          commit_interval=interval) as q:
            q.enqueue_many([b"m"] * 10)
            start = threading.Barrier(4)
            groups: list[k7core.ConsumerGroup] = []

            def open_group(i: int, q: k7core.Queue = q, start: threading.Barrier = start,
                           groups: list[k7core.ConsumerGroup] = groups) -> None:
                start.wait(DEADLINE)
                groups.append(q.consumer_group(f"g{i}", cursor_fsync="async"))

            threads = [threading.Thread(target=open_group, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(DEADLINE)
            assert len(groups) == 4
            assert _flusher_slots(interval) == 1, f"round {r}: one slot per queue"
        assert _flusher_slots(interval) == 0  # left with the queue: the flusher stopped


def test_a_dropped_flush_slot_leaves_its_flusher() -> None:
    interval = 322e-6
    slot = FLUSHERS.attach(interval)
    assert _flusher_slots(interval) == 1
    del slot
    gc.collect()
    assert _flusher_slots(interval) == 0  # detached before its memory was freed


def test_two_threads_open_their_first_async_groups_at_once_100_times() -> None:
    # the reproduction from the issue: aborts in tpp.c, SIGSEGV or a hang before the fix
    run_python("""
import sys, tempfile, threading, k7core
with tempfile.TemporaryDirectory() as d:
    for r in range(100):
        q = k7core.Queue(f"{d}/q{r}", fsync="sync", segment_size=1 << 20)
        q.enqueue_many([b"m"] * 50)
        start = threading.Barrier(2)
        def work(i):
            start.wait(60)
            g = q.consumer_group(f"g{i}")
            while g.poll(64, 0):
                pass
            g.close()
        ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        q.close()
""", timeout=300)


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writer"])
def test_a_group_keeps_its_dropped_queue_open(tmp_path: Path, readonly: bool) -> None:
    run_python("""
import gc, sys, k7core
d, readonly = sys.argv[1], sys.argv[2] == "1"
with k7core.Queue(d, segment_size=1 << 20) as q:
    q.enqueue_many([b"a", b"b"])
g = k7core.Queue(d, readonly=readonly).consumer_group("g")
gc.collect()
msgs = g.poll(10, 0)
assert [bytes(m.payload) for m in msgs] == [b"a", b"b"], msgs
assert g.ack_many(msgs) == 2
if not readonly:  # the dropped writer is still open: its lock is held
    try:
        k7core.Queue(d)
    except k7core.QueueLockedError:
        pass
    else:
        raise AssertionError("the writer lock was released under an open group")
g.close()
del g
gc.collect()
with k7core.Queue(d) as q, q.consumer_group("g") as again:
    assert again.committed == q.end and again.poll(10, 0) == []
""", str(tmp_path / "q"), "1" if readonly else "0")


def test_a_group_of_a_dropped_topic_keeps_reading(tmp_path: Path) -> None:
    run_python("""
import gc, sys
from k7core.topics import Topic
d = sys.argv[1]
with Topic(d, 2, segment_size=1 << 20) as t:
    t.send_many([b"x%d" % i for i in range(6)])
c = Topic(d, 2, readonly=True).consumer("g")
gc.collect()
recs = c.poll(10, 0)
assert sorted(r.value for r in recs) == [b"x%d" % i for i in range(6)], recs
c.ack_many(recs)
c.close()
""", str(tmp_path / "t"))


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writer"])
def test_a_group_raises_closed_after_its_queue_is_closed_by_another_thread(
    tmp_path: Path, readonly: bool,
) -> None:
    with k7core.Queue(tmp_path / "q", segment_size=SMALL) as w:
        w.enqueue_many([b"a", b"b"])
    q = k7core.Queue(tmp_path / "q", readonly=readonly)
    g = q.consumer_group("g")
    (msg, _) = g.poll(10, 0)
    closer = threading.Thread(target=q.close)
    closer.start()
    closer.join(DEADLINE)
    assert q.closed and g.closed
    for call in (lambda: g.poll(1, 0), lambda: g.ack(msg), lambda: g.nack(msg),
                 lambda: g.seek(0), g.stats, lambda: g.lag, lambda: q.read_columnar(0),
                 lambda: q.count_messages(0, 1), lambda: q.wait(0, 0),
                 lambda: q.consumer_group("h")):
        with pytest.raises(k7core.ClosedError):
            call()
    assert bytes(msg.payload) == b"a"  # a payload view keeps its segment mapped


def test_close_refuses_while_a_group_polls_in_another_thread(tmp_path: Path) -> None:
    q = k7core.Queue(tmp_path / "q", fsync="flush", segment_size=SMALL)
    g = q.consumer_group("g")
    got: list[list[k7core.Message]] = []
    t = threading.Thread(target=lambda: got.append(g.poll(8, DEADLINE)))
    t.start()
    wait_until(lambda: waiters(q.path) > 0, DEADLINE, "the poller to wait")
    with pytest.raises(k7core.ConcurrentUseError):
        q.close()  # nothing released under the poller
    q.enqueue(b"wake")
    t.join(DEADLINE)
    assert [bytes(m.payload) for m in got[0]] == [b"wake"]
    q.close()
    assert g.closed


def test_a_wait_in_another_thread_outlives_the_close() -> None:
    # Queue.wait sleeps on the position map; the close used to unmap it under the sleeper
    run_python("""
import sys, tempfile, threading, k7core
from tests._queuehelp import wait_until, waiters
with tempfile.TemporaryDirectory() as d:
    q = k7core.Queue(d + "/q", readonly=False, segment_size=1 << 20)
    errors = []
    def wait():
        try:
            q.wait(q.end, 0.5)
        except k7core.ClosedError as exc:
            errors.append(exc)
    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: waiters(d + "/q") > 0, 60, "the waiter")
    q.close()
    t.join(60)
    assert len(errors) == 1, errors
""")


@pytest.mark.parametrize("how", ["close", "collect"])
def test_payloads_and_batches_outlive_their_queue(tmp_path: Path, how: str) -> None:
    q = k7core.Queue(tmp_path / "q", segment_size=SMALL)
    q.enqueue_many([b"one", b"two"])
    g = q.consumer_group("g")
    msgs = g.poll(10, 0)
    batch = q.read_columnar(0)
    if how == "close":
        q.close()
    else:
        g.close()
        del q, g
        gc.collect()
    assert [bytes(m.payload) for m in msgs] == [b"one", b"two"]
    assert bytes(batch.payload(1)) == b"two"
    assert batch.gather()[0] == b"onetwo"


def test_a_queue_collected_while_its_thread_holds_another_slot_lock_does_not_deadlock() -> None:
    # The cyclic GC collects queue b while this thread holds queue a's slot lock, with a's
    # flusher rung. A flusher pass that waited for a's lock while holding its slot list made
    # b's leave a deadlock (seen before the flusher's passes try-locked each slot instead of
    # waiting); a leave is still put off until this thread lets go of a's lock, and nothing
    # may hang either way.
    run_python("""
import gc, tempfile, threading, k7core
from tests.k7core.test_lifetimes import _flusher_slots
interval = 323e-6
with tempfile.TemporaryDirectory() as d:
    a = k7core.Queue(d + "/a", commit_interval=interval, segment_size=1 << 20)
    b = k7core.Queue(d + "/b", commit_interval=interval, segment_size=1 << 20)
    b.cycle = b  # collected by the cyclic GC only
    del b
    gc.disable()
    assert [t for t in threading.enumerate() if t.name.startswith("k7-flusher-323")]
    slot = a._log.flush_slot()

    with slot.lock:
        a.enqueue(b"x")  # rings the flusher: its passes find a's slot taken
        gc.collect()  # b's finalizer
        assert _flusher_slots(interval) == 2  # b's slot is still listed: it leaves later
    assert _flusher_slots(interval) == 1  # ...when this thread let go of the lock
    a.close()
    assert _flusher_slots(interval) == 0
""", timeout=120)


def test_a_topic_consumer_raises_closed_after_its_topic_is_closed(tmp_path: Path) -> None:
    from k7core.topics import Topic

    t = Topic(tmp_path / "t", 2, segment_size=SMALL)
    t.send_many([b"x%d" % i for i in range(4)])
    c = t.consumer("g")
    recs = c.poll(10, 0)
    closer = threading.Thread(target=t.close)
    closer.start()
    closer.join(DEADLINE)
    with pytest.raises(k7core.ClosedError):
        c.poll(10, 0)
    with pytest.raises(k7core.ClosedError):
        c.ack_many(recs)  # closed with its topic: the acks cannot be recorded
    assert sorted(bytes(r.value) for r in recs) == [b"x%d" % i for i in range(4)]


def test_a_close_from_another_thread_while_a_poll_builds_its_messages_is_refused() -> None:
    # Building a batch's messages allocates, which may run the cyclic GC, whose callbacks
    # and finalizers run Python code, during which another thread may run: here a GC
    # callback has one close the queue. The close used to succeed (the fast path did not
    # own the group), freeing the reader's arrays and clearing the view the poll was still
    # reading (a use after free under ASan; SIGSEGV without): now it is refused.
    run_python("""
import gc, tempfile, threading, k7core
with tempfile.TemporaryDirectory() as d:
    q = k7core.Queue(d + "/q", fsync="flush", segment_size=1 << 20)
    q.enqueue_many([b"m%d" % i for i in range(64)])
    g = q.consumer_group("g")
    assert len(g.poll(1, 0)) == 1  # maps the segment: the next poll takes the fast path
    seen = []
    def close():
        try:
            q.close()
            seen.append("closed")
        except k7core.ConcurrentUseError:
            seen.append("refused")
    def close_elsewhere(phase, info):
        if phase == "start" and not seen:
            t = threading.Thread(target=close)
            t.start()
            t.join(60)
    gc.collect()
    gc.callbacks.append(close_elsewhere)
    gc.set_threshold(1)  # the first allocations in the poll collect
    msgs = g.poll(63, 0)
    gc.set_threshold(700)
    gc.callbacks.remove(close_elsewhere)
    assert seen == ["refused"], seen
    assert [bytes(m.payload) for m in msgs] == [b"m%d" % i for i in range(1, 64)]
    q.close()
    assert g.closed
""")


def test_calls_on_a_group_while_its_queue_closes_raise_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Queue.close() owns every group for the whole close; a call from another thread
    # meanwhile used to raise ConcurrentUseError (a k7async stream then failed with it)
    q = k7core.Queue(tmp_path / "q", fsync="flush", segment_size=SMALL)
    q.enqueue_many([b"a", b"b"])
    g = q.consumer_group("g")
    (msg,) = g.poll(1, 0)
    calls: dict[str, Callable[[], object]] = {
        "poll": lambda: g.poll(1, 0), "ack": lambda: g.ack(msg),
        "ack_many": lambda: g.ack_many([msg]), "nack": lambda: g.nack(msg),
        "seek": lambda: g.seek(0),
    }
    got: dict[tuple[str, str], type[BaseException] | None] = {}

    def call_all(when: str) -> None:
        for name, call in calls.items():
            try:
                call()
                got[when, name] = None
            except Exception as exc:
                got[when, name] = type(exc)

    real = q._groups.close_all

    def close_all() -> k7core.K7Error | None:
        for when, step in (("before", lambda: None), ("after", real)):
            first = step()
            t = threading.Thread(target=call_all, args=(when,))
            t.start()
            t.join(DEADLINE)
        return first

    monkeypatch.setattr(q._groups, "close_all", close_all)
    q.close()
    assert got == {(w, n): k7core.ClosedError for w in ("before", "after") for n in calls}
