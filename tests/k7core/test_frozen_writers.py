"""A shared writer frozen (SIGSTOP) while it holds a shared lock: the other writers' calls end
within ``lock_timeout``, in ``LockTimeoutError`` naming the frozen process (the lock of
appends), or go on without it (the lock of msyncs: the others msync themselves); the
background flusher of another process never waits on it, so that process's other queues
and groups open while the freeze lasts (docs/concurrency.md, "A writer stopped while
holding a lock").

Every wait here is bounded by ``BOUND`` seconds, far above ``lock_timeout``: a call still
blocked then waits for the whole freeze, which is the failure."""

from __future__ import annotations

import array
import gc
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import k7async
import k7core
from tests._childproc import Child, stopped
from tests._childproc import bounded as bounded_call
from tests._queuehelp import read_all

PROGRAM = "tests.k7core._frozen_children"
BOUND = 60.0
LOCK_TIMEOUT = 0.2


@contextmanager
def frozen(mode: str, qdir: Path, fsync: str) -> Iterator[int]:
    """A child writer of ``qdir`` holding a lock (``mode``), stopped with SIGSTOP for the
    block; yields its pid. Continued (SIGCONT) and killed afterwards, whatever happens."""
    with Child(mode, str(qdir), fsync, program=PROGRAM) as child:
        assert child.line() == b"held"
        with stopped(child) as pid:
            yield pid


def bounded(call: Callable[[], Any]) -> Any:
    """``call()``'s result or exception; fails if it is still blocked after ``BOUND`` s."""
    return bounded_call(call, BOUND)


def shared(qdir: Path, fsync: str, **kw: Any) -> k7core.Queue:
    return k7core.Queue(qdir, writers="shared", fsync=fsync, lock_timeout=LOCK_TIMEOUT, **kw)


CALLS: dict[str, Callable[[k7core.Queue], object]] = {
    "enqueue": lambda q: q.enqueue(b"x"),
    "enqueue_many": lambda q: q.enqueue_many([b"a", b"b"]),
    "enqueue_columnar": lambda q: q.enqueue_columnar(b"ab", array.array("q", [0, 1, 2])),
    "enforce_retention": lambda q: q.enforce_retention(),
    "delete_before": lambda q: q.delete_before(0),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_calls_beside_a_frozen_holder_of_the_append_lock(
    tmp_path: Path, fsync: str, call: str
) -> None:
    """The holder is named by its process, also when a thread other than its first holds
    the lock (``holdthread``, with ``enqueue``)."""
    qdir = tmp_path / "q"
    mode = "holdthread" if call == "enqueue" else "hold"
    with shared(qdir, fsync) as q:
        before = q.enqueue(b"before")
        with frozen(mode, qdir, fsync) as pid:
            exc = bounded(lambda: CALLS[call](q))
            assert isinstance(exc, k7core.LockTimeoutError), exc
            assert isinstance(exc, k7core.LockedError)
            assert exc.pid == pid
            assert f"process {pid}" in str(exc) and exc.hint
        # the child is killed now: its lock passes on (recovered), and writing goes on
        after = q.enqueue(b"after")
        assert after > before
        q.sync()
        assert read_all(q)[-1] == b"after"


def test_sync_appends_beside_a_frozen_holder_of_the_msync_lock(tmp_path: Path) -> None:
    """A "sync" append is durable and visible without the frozen msync's end: once that msync
    has run for ``lock_timeout``, the others msync for themselves."""
    qdir = tmp_path / "q"
    with shared(qdir, "sync") as q, frozen("holdsync", qdir, "sync"):
        offs = bounded(lambda: [q.enqueue(b"m%d" % i) for i in range(20)])
        assert isinstance(offs, list), offs
        with k7core.Queue(qdir, readonly=True) as ro:
            assert ro.end > offs[-1]
            assert read_all(ro)[-20:] == [b"m%d" % i for i in range(20)]


def test_async_flusher_beside_a_frozen_holder_of_the_msync_lock(tmp_path: Path) -> None:
    """``"async"``: the records still become visible (within ``lock_timeout``, then the
    flusher msyncs for itself), and the flusher, which serves every queue of this process,
    never waits on the frozen process meanwhile: another queue (an unrelated directory) and
    a group with an ``"async"`` cursor open while the freeze lasts."""
    qdir = tmp_path / "q"
    with shared(qdir, "async") as q, frozen("holdsync", qdir, "async"):
        last = q.enqueue_many([b"r%d" % i for i in range(10)])[-1]

        def unrelated() -> int:
            with k7core.Queue(tmp_path / "other") as other:
                return other.enqueue(b"y")

        assert bounded(unrelated) == 0
        g = bounded(lambda: q.consumer_group("g", cursor_fsync="async"))
        assert isinstance(g, k7core.ConsumerGroup), g
        with k7core.Queue(qdir, readonly=True) as ro:
            assert bounded(lambda: ro.wait(last, BOUND)) > last, "the records never became visible"
        got = bounded(lambda: g.poll(max_batch=100, timeout=BOUND))
        assert [bytes(m.payload) for m in got][-10:] == [b"r%d" % i for i in range(10)]
        g.close()


def test_async_face_beside_a_frozen_holder_of_the_append_lock(tmp_path: Path) -> None:
    """``k7async``: the awaiting task gets the same error, and the queue goes on after."""
    qdir = tmp_path / "q"

    async def main() -> None:
        async with k7async.open_queue(qdir, writers="shared", fsync="flush",
                                      lock_timeout=LOCK_TIMEOUT) as aq:
            await aq.enqueue(b"before")
            with frozen("hold", qdir, "flush") as pid:
                with pytest.raises(k7core.LockTimeoutError) as info, anyio.fail_after(BOUND):
                    await aq.enqueue(b"x")
                assert info.value.pid == pid
            with anyio.fail_after(BOUND):  # the child was killed: its lock passed on
                assert await aq.enqueue(b"after") > 0

    anyio.run(main)


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_opening_beside_a_frozen_holder_of_the_append_lock(tmp_path: Path, fsync: str) -> None:
    """Joining the writers takes the lock too (to enter the list of writers): the open fails
    cleanly, and opens once the holder is gone."""
    qdir = tmp_path / "q"
    with shared(qdir, fsync) as q:
        with frozen("hold", qdir, fsync) as pid:
            exc = bounded(lambda: shared(qdir, fsync))
            assert isinstance(exc, k7core.LockTimeoutError), exc
            assert exc.pid == pid
            gc.collect()  # what the failed open left is released
        with shared(qdir, fsync) as again:  # the child was killed: its lock passed on
            again.enqueue(b"x")
            q.enqueue(b"y")
            again.sync()
            assert read_all(q)[-2:] == [b"x", b"y"]


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_random_stops_of_a_busy_writer(tmp_path: Path, fsync: str) -> None:
    """A child appends in a loop and is stopped at random moments (holding a lock or not):
    each time, this process's calls go on or end in ``LockTimeoutError`` naming the child,
    none waits for the freeze, and what they returned is in the log."""
    qdir = tmp_path / "q"
    rng = random.Random(7)
    sent: list[tuple[int, bytes]] = []
    timeouts = 0
    with shared(qdir, fsync, segment_size=1 << 16) as q, Child(
        "loop", str(qdir), fsync, program=PROGRAM
    ) as child:
        assert child.line() == b"ready"
        pid = child.proc.pid

        def put() -> None:
            data = b"p%d" % len(sent)
            sent.append((q.enqueue(data), data))

        def calls() -> int:
            """Appends until one times out (0) or 100 went through (1)."""
            for _ in range(100):
                try:
                    put()
                except k7core.LockTimeoutError as exc:
                    assert exc.pid == pid, exc
                    return 0
            return 1

        for _ in range(10):
            for _ in range(rng.randrange(1, 50)):  # the child runs meanwhile
                put()
            time.sleep(rng.random() / 50)  # not a wait: a random moment of the child's loop
            os.kill(pid, signal.SIGSTOP)
            try:
                os.waitpid(pid, os.WUNTRACED)
                got = bounded(calls)
                assert isinstance(got, int), got
                timeouts += 1 - got
                if fsync == "async" and sent:
                    with k7core.Queue(qdir, readonly=True) as ro:
                        assert bounded(lambda: ro.wait(sent[-1][0], BOUND)) > sent[-1][0]
            finally:
                os.kill(pid, signal.SIGCONT)
        child.proc.kill()
        q.sync()
        mine = {off: data for off, data in sent}
        with k7core.Queue(qdir, readonly=True) as ro, ro.consumer_group("check") as g:
            while len(mine) and (msgs := g.poll(max_batch=4096, timeout=0)):
                for m in msgs:
                    if m.offset in mine:
                        assert bytes(m.payload) == mine.pop(m.offset)
    assert not mine, f"{len(mine)} returned offsets are not in the log"
    print(f"{fsync}: {timeouts} of 10 stops held the append lock")


@pytest.mark.parametrize("fsync", ["flush", "async"])
def test_close_beside_a_frozen_holder_of_the_append_lock(
    tmp_path: Path, fsync: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``close()`` ends too: it cannot leave the list of writers (a WARNING says so), and
    closes everything else."""
    qdir = tmp_path / "q"
    q = shared(qdir, fsync)
    q.enqueue(b"before")
    with frozen("hold", qdir, fsync) as pid:
        assert bounded(q.close) is None
        assert q.closed
        assert f"process {pid}" in caplog.text and "without leaving" in caplog.text
    with k7core.Queue(qdir, readonly=True) as ro:
        assert b"before" in read_all(ro)


@pytest.mark.parametrize("opener", ["shared", "exclusive", "readonly"])
def test_opens_beside_a_process_frozen_inside_the_join_lock(tmp_path: Path, opener: str) -> None:
    """A writer frozen while it joins or leaves holds ``k7py-writers.lock``: a shared writer
    joining, an exclusive writer asking whether shared writers live, and a readonly open
    asking whether any writer lives all wait for it at most ``lock_timeout``."""
    qdir = tmp_path / "q"
    openers: dict[str, dict[str, Any]] = {
        "shared": {"writers": "shared"}, "exclusive": {}, "readonly": {"readonly": True}}
    kw = openers[opener]
    with frozen("holdjoin", qdir, "flush") as pid:
        got = bounded(lambda: k7core.Queue(qdir, lock_timeout=LOCK_TIMEOUT, **kw))
        assert isinstance(got, k7core.LockTimeoutError), got
        assert got.pid == pid and f"process {pid}" in str(got), got
        assert "kill -CONT" in (got.hint or ""), got.hint
