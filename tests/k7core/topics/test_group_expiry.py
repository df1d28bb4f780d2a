"""Groups that stop being active: back-pressure forgets a group nobody has polled for
``group_expiry`` seconds (its only member SIGKILLed, or every member gone for good), and a
member that has not polled for its ``max_poll_interval`` loses its partitions.

Time is injected: a group's activity is its files' mtimes (members' heartbeats, the last
generation), which the tests set into the past; nothing waits on the wall clock.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from k7core.topics import BackPressure, BackPressureError, Topic
from k7core.topics._pressure import GroupActivity, watched_lag
from tests._childproc import Child

CHILDREN = "tests.k7core.topics._group_children"
SEG = 1 << 20
EXPIRY = 60.0


def age_group(topic: Path, group: str, seconds: float) -> None:
    """Make every file of a group's directory look ``seconds`` old (the injected clock)."""
    when = time.time() - seconds
    gdir = topic / "k7py-groups" / group
    for path in [gdir / "state.json", *(gdir / "members").iterdir()]:
        os.utime(path, (when, when))


def test_group_activity_rules() -> None:
    act = GroupActivity(10.0)
    act.saw({"spark": [0, None], "g": [5]}, now=100.0)
    # known only by its cursors: active when first seen
    assert act.last_active("spark", None) == 100.0
    assert not act.expired("spark", None, 110.0) and act.expired("spark", None, 110.5)
    # with files: their time, not when this topic first looked
    assert act.last_active("g", 50.0) == 50.0 and act.expired("g", 50.0, 100.0)
    act.saw({"spark": [0, None], "g": [7]}, now=200.0)  # g's offsets moved
    assert act.last_active("g", 50.0) == 200.0 and not act.expired("g", 50.0, 205.0)
    assert act.expired("spark", None, 200.0)  # no move since first seen
    assert not GroupActivity(None).expired("g", 0.0, 1e12)  # None: never
    assert watched_lag({"a": 3, "b": 7}, None, {"b"}) == 3
    assert watched_lag({"a": 3, "b": 7}, "b", {"b"}) == 0
    assert watched_lag({"b": 7}, None, {"b"}) == 0


def test_a_group_whose_only_member_was_killed_expires(tmp_path: Path) -> None:
    path = tmp_path / "t"
    raising = BackPressure(high=5, low=2, group="g", on_high="raise", group_expiry=EXPIRY)
    blocking = BackPressure(high=5, low=2, group="g", timeout=None, group_expiry=EXPIRY)
    with Topic(path, partitions=2, segment_size=SEG, back_pressure=raising) as t, \
            Topic(path, back_pressure=blocking) as blocked, ExitStack() as stack:
        member = stack.enter_context(Child(
            "consume", str(path), "g", "m", str(tmp_path / "m.log"), program=CHILDREN))
        assert member.line() == b"joined"
        member.kill_and_drain()
        with pytest.raises(BackPressureError):
            for i in range(20):
                t.send(b"v%d" % i)
        t.sync()  # visible to the other Topic object too
        g = t.stats().groups[0]
        assert not g.expired and g.last_active is not None
        assert time.time() - g.last_active < EXPIRY
        # a producer with no timeout waits for the dead group...
        sent = threading.Event()

        def send() -> None:
            blocked.send(b"w")
            sent.set()

        thread = threading.Thread(target=send)
        thread.start()
        try:
            assert not sent.wait(0.2)  # (a failure here is real: it went through)
            age_group(path, "g", 2 * EXPIRY)  # ...until the group is EXPIRY old
            assert sent.wait(30.0), "the blocked send never saw the group expire"
        finally:
            age_group(path, "g", 2 * EXPIRY)
            thread.join(30.0)
        assert not thread.is_alive()
        assert not t.paused()
        for i in range(20):
            t.send(b"x%d" % i)
            t.sync()  # visible: what this topic wrote and readers cannot see yet counts
        g = t.stats().groups[0]
        assert g.expired and g.last_active is not None
        assert time.time() - g.last_active >= 2 * EXPIRY - 1
        bp = t.pressure_stats()
        assert bp is not None and bp.expired_groups == ("g",) and bp.group_expiry == EXPIRY
        # a member that comes back makes the group count again
        with t.consumer("g", "back"):
            assert t.paused()
            assert t.pressure_stats().expired_groups == ()  # type: ignore[union-attr]


def test_the_slowest_group_ignores_a_group_that_left_for_good(tmp_path: Path) -> None:
    bp = BackPressure(high=10, low=5, on_high="raise", group_expiry=EXPIRY)
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG, back_pressure=bp) as t:
        t.consumer("gone", "x").close()  # joined once, left, never came back
        live = t.consumer("live", "y")
        with pytest.raises(BackPressureError):
            for i in range(30):
                t.send(b"v%d" % i)
        t.sync()
        acked = 0
        for _ in range(1_000):
            if acked == 10:
                break
            acked += live.ack_many(live.poll(100, 0.05))
        assert acked == 10
        assert t.paused(), "the group that left is the slowest"
        age_group(tmp_path / "t", "gone", 2 * EXPIRY)
        assert not t.paused()
        for i in range(10):  # the live group governs now
            t.send(b"w%d" % i)
            t.sync()
        with pytest.raises(BackPressureError, match="lags 10"):
            t.send(b"one too many")
        assert [g.expired for g in t.stats().groups] == [True, False]
        live.close()


def test_group_expiry_is_checked() -> None:
    with pytest.raises(ValueError, match="group_expiry"):
        BackPressure(high=10, group_expiry=0)
    assert BackPressure(high=10).group_expiry == 300.0
    assert BackPressure(high=10, group_expiry=None).group_expiry is None


def test_a_member_that_stops_polling_loses_its_partitions(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        for i in range(10):
            t.send(b"v%d" % i, partition=i % 2)
        t.sync()
        a = t.consumer("g", "a", strategy="range", max_poll_interval=30.0)
        b = t.consumer("g", "b", strategy="range", max_poll_interval=30.0)
        quiet = t.consumer("h", "q", strategy="range")  # no max_poll_interval: keeps them
        other = t.consumer("h", "r", strategy="range")
        for c in (a, b, quiet, other):
            c.beat()
        assert a.assignment == (0,) and b.assignment == (1,)
        members = tmp_path / "t" / "k7py-groups"
        old = time.time() - 60.0
        os.utime(members / "g" / "members" / "b.member", (old, old))
        os.utime(members / "h" / "members" / "q.member", (old, old))
        a.beat()
        other.beat()
        assert a.assigned == (0, 1) and a.stats().members == ("a",)
        assert other.stats().members == ("q", "r")
        # b still holds partition 1 (its cursor lock: a waits for it); at its next
        # heartbeat b is back in the group, and gets a partition again
        assert a.assignment == (0,) and a.stats().held == (0,)
        b.beat()
        assert b.stats().members == ("a", "b")
        assert {r.partition for r in b.poll(10, 0.5)} == {1}
        a.beat()
        assert list(a.assigned) == [0] and list(b.assigned) == [1]
        with pytest.raises(ValueError, match="max_poll_interval"):
            t.consumer("g", max_poll_interval=0.05)
        with pytest.raises(ValueError, match="lock_timeout"):
            t.consumer("g", lock_timeout=float("inf"))  # no unbounded wait
        for c in (a, b, quiet, other):
            c.close()
