"""A process frozen (SIGSTOP) while it holds a lock of the topics layer. A consumer
group's: the members' polls and heartbeats go on without it (the rebalance waits for the
next one), a leave does not wait for it, and a join waits ``lock_timeout`` then names the
frozen process's pid. A topic's metadata lock and an exchange's: creating the topic and
binding wait ``LOCK_TIMEOUT``, then name it; publishing never takes the lock."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from k7core.topics import Exchange, Topic, TopicLockTimeoutError
from tests._childproc import Child

CHILDREN = "tests.k7core.topics._group_children"
SEG = 1 << 20
T = TypeVar("T")

#: How long a call that must not wait for the frozen process may take before the test
#: calls it stuck (generous: a busy machine; the old code waited forever).
STUCK = 20.0


def bounded(pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
    """``fn()`` in a thread; fails if it has not returned within ``STUCK`` seconds."""
    return pool.submit(fn).result(timeout=STUCK)


def test_a_frozen_lock_holder_stalls_no_poll_and_names_itself(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t, \
            ThreadPoolExecutor(1) as pool:
        for i in range(20):
            t.send(b"v%d" % i, partition=i % 2)
        t.sync()
        a = t.consumer("g", "a", strategy="range")
        b = t.consumer("g", "b", strategy="range")
        a.beat()
        assert a.assignment == (0,)
        lock = t.path / "k7py-groups" / "g" / "k7py-group.lock"
        with Child("freeze-in-lock", str(lock), program=CHILDREN) as frozen:
            try:
                assert frozen.line() == b"held"
                bounded(pool, b.close)  # leaves without writing the next generation
                got = bounded(pool, lambda: a.poll(100, 0.05))
                assert {r.partition for r in got} == {0}  # its own partition, meanwhile
                a.ack_many(got)
                assert bounded(pool, lambda: a.poll(100, 0.05)) == []
                fds = set(os.listdir("/proc/self/fd"))
                with pytest.raises(TopicLockTimeoutError) as info:
                    bounded(pool, lambda: t.consumer("g", "c", lock_timeout=0.1))
                assert set(os.listdir("/proc/self/fd")) == fds, "a descriptor leaked"
                assert not (lock.parent / "members" / "c.member").exists()
                assert info.value.pid == frozen.proc.pid
                assert f"process {frozen.proc.pid}" in str(info.value)
                assert "kill -CONT" in str(info.value)
                assert a.assignment == (0,)
            finally:
                frozen.proc.send_signal(signal.SIGCONT)
            assert frozen.wait() == 0
        # the lock is free again: the next heartbeat writes the generation without b
        for _ in range(2_000):
            a.ack_many(a.poll(100, 0.05))
            if list(a.assignment) == [0, 1]:
                break
        assert list(a.assignment) == [0, 1]
        g = t.stats().groups[0]
        assert g.members == ("a",) and all(p.lag_bytes == 0 for p in g.partitions)
        a.close()


@pytest.fixture
def short_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOCK_TIMEOUT (10 s) made 0.1 s where the metadata and exchange locks use it."""
    monkeypatch.setattr("k7core.topics._layout.LOCK_TIMEOUT", 0.1)
    monkeypatch.setattr("k7core.topics._exchange.LOCK_TIMEOUT", 0.1)


def frozen_holder(lock: Path) -> Child:
    c = Child("freeze-in-lock", str(lock), program=CHILDREN)
    assert c.line() == b"held"
    return c


@pytest.mark.usefixtures("short_lock_timeout")
def test_a_frozen_creator_names_itself(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    with frozen_holder(tmp_path / "t" / "k7py-topic.lock") as frozen, \
            ThreadPoolExecutor(1) as pool:
        try:
            with pytest.raises(TopicLockTimeoutError, match=f"process {frozen.proc.pid}"):
                bounded(pool, lambda: Topic(tmp_path / "t", partitions=2, segment_size=SEG))
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        assert frozen.wait() == 0
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        assert t.partitions == 2


@pytest.mark.usefixtures("short_lock_timeout")
def test_a_frozen_binder_names_itself_and_publishing_goes_on(tmp_path: Path) -> None:
    Topic(tmp_path / "t", partitions=2, segment_size=SEG).close()
    with Exchange(tmp_path / "ex", "fanout") as ex, ThreadPoolExecutor(1) as pool:
        ex.bind(tmp_path / "t")
        with frozen_holder(tmp_path / "ex" / "k7py-exchange.lock") as frozen:
            try:
                assert len(bounded(pool, lambda: ex.publish(b"x"))) == 1
                with pytest.raises(TopicLockTimeoutError) as info:
                    bounded(pool, lambda: ex.bind(tmp_path / "t", "other"))
                assert info.value.pid == frozen.proc.pid
            finally:
                frozen.proc.send_signal(signal.SIGCONT)
            assert frozen.wait() == 0
        ex.bind(tmp_path / "t", "other")
        assert len(ex.bindings()) == 2
