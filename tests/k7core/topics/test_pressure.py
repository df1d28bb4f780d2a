"""Back-pressure's sans-I/O parts (k7core.topics._pressure): the watermarks' hysteresis and
throttle ratio, BackPressure's checks, and LagMeter against a fake partition log, whose
incremental message count must always equal a full recount."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k7core.topics import BackPressure
from k7core.topics._pressure import LagMeter, Watermarks, deadline_left, watched_lag

# ------------------------------------------------------------------------ Watermarks


def test_watermarks_hysteresis() -> None:
    w = Watermarks(10, 5)
    seen = [(lag, w.update(lag)) for lag in [0, 5, 9, 10, 9, 6, 11, 6, 5, 9, 4, 10, 100, 0]]
    assert seen == [
        (0, False), (5, False), (9, False),
        (10, True),  # paused at high
        (9, True), (6, True), (11, True), (6, True),  # stays paused above low
        (5, False),  # resumes at low
        (9, False), (4, False),
        (10, True), (100, True), (0, False),
    ]
    assert w.pauses == 2  # running -> paused twice; staying paused does not count
    assert w.paused is False


def test_watermarks_ratio() -> None:
    w = Watermarks(10, 4)
    assert [w.ratio(lag) for lag in (0, 3, 4)] == [0.0, 0.0, 0.0]
    assert w.ratio(5) == pytest.approx(1 / 6)
    assert w.ratio(7) == pytest.approx(0.5)
    assert w.ratio(9) == pytest.approx(5 / 6)
    assert w.ratio(10) == 1.0 and w.ratio(1000) == 1.0
    w.update(10)  # paused: 1 until the lag is back at low
    assert w.ratio(7) == 1.0 and w.ratio(5) == 1.0
    w.update(4)
    assert w.ratio(7) == pytest.approx(0.5)


@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(st.integers(1, 1000).flatmap(lambda h: st.tuples(st.just(h), st.integers(0, h - 1))),
       st.lists(st.integers(0, 1200), max_size=50))
def test_watermarks_model(marks: tuple[int, int], lags: list[int]) -> None:
    high, low = marks
    w = Watermarks(high, low)
    paused, pauses = False, 0
    for lag in lags:
        if not paused and lag >= high:
            paused, pauses = True, pauses + 1
        elif paused and lag <= low:
            paused = False
        assert w.update(lag) is paused
        r = w.ratio(lag)
        assert 0.0 <= r <= 1.0
        if paused:
            assert r == 1.0
        elif lag <= low:
            assert r == 0.0
        else:
            assert r == pytest.approx((lag - low) / (high - low))
    assert w.pauses == pauses


# ------------------------------------------------------------------------ BackPressure


def test_back_pressure_defaults() -> None:
    bp = BackPressure(high=10)
    assert (bp.low, bp.low_mark, bp.unit, bp.group, bp.on_high, bp.timeout) == (
        5, 5, "messages", None, "block", None)
    assert BackPressure(high=1).low == 0
    assert BackPressure(high=7).low == 3
    assert BackPressure(high=10, low=0).low == 0
    assert BackPressure(high=10, low=9, unit="bytes", group="g", on_high="raise",
                        timeout=0, interval=0).timeout == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        bp.high = 3  # type: ignore[misc]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"high": 0}, ValueError, "high must be >= 1, not 0"),
    ({"high": -5}, ValueError, "high must be >= 1"),
    ({"high": True}, TypeError, "high must be an int, not a bool"),
    ({"high": 1.5}, TypeError, "high must be an int, not float"),
    ({"high": "10"}, TypeError, "high must be an int, not str"),
    ({"high": 10, "low": 10}, ValueError, r"low \(10\) must be below high \(10\)"),
    ({"high": 10, "low": 11}, ValueError, r"low \(11\) must be below high \(10\)"),
    ({"high": 10, "low": -1}, ValueError, "low must be >= 0, not -1"),
    ({"high": 10, "low": 2.0}, TypeError, "low must be an int, not float"),
    ({"high": 10, "unit": "records"}, ValueError, "unit must be 'messages' or 'bytes', not "
                                                  "'records'"),
    ({"high": 10, "on_high": "drop"}, ValueError, "on_high must be 'block' or 'raise', not "
                                                  "'drop'"),
    ({"high": 10, "group": 3}, TypeError, "group must be a str or None, not int"),
    ({"high": 10, "timeout": -1}, ValueError, "timeout must be seconds >= 0"),
    ({"high": 10, "timeout": math.nan}, ValueError, "timeout must be seconds >= 0"),
    ({"high": 10, "timeout": "1"}, TypeError, "timeout must be a number of seconds, not str"),
    ({"high": 10, "interval": -0.1}, ValueError, "interval must be seconds >= 0"),
    ({"high": 10, "interval": None}, TypeError, "interval must be a number of seconds"),
])
def test_back_pressure_validation(kwargs: dict[str, Any], error: type[Exception],
                                  match: str) -> None:
    with pytest.raises(error, match=match):
        BackPressure(**kwargs)


def test_watched_lag() -> None:
    lags = {"a": 3, "b": 7}
    assert watched_lag(lags, None) == 7  # the slowest group
    assert watched_lag(lags, "a") == 3
    assert watched_lag(lags, "nobody") == 0  # no cursor yet: nothing to wait for
    assert watched_lag({}, None) == 0


def test_deadline_left() -> None:
    assert deadline_left(10.0, 4.0) == 6.0
    assert deadline_left(10.0, 12.0) == 0.0
    assert deadline_left(math.inf, 12.0) == math.inf


# ------------------------------------------------------------------------ LagMeter


class FakeTopic:
    """Partitions as lists of frame offsets (sizes from the test), groups' cursors, and
    retention that deletes a partition's oldest frames. ``count`` scans like the real one
    (None for a range that starts before the earliest frame or off a boundary) and records
    how many frames it stepped over."""

    def __init__(self, partitions: int) -> None:
        self.frames: list[list[int]] = [[] for _ in range(partitions)]  # offsets
        self.end: list[int] = [0] * partitions
        self.first: list[int] = [0] * partitions  # the earliest offset
        self.cursors: dict[str, list[int | None]] = {}
        self.breaking: set[int] = set()  # partitions whose next frames are written corrupt
        self.corrupt: set[tuple[int, int]] = set()  # (partition, offset) of corrupt frames
        self.scanned = 0
        self.calls = 0

    # the meter's callables
    def ends(self) -> list[int]:
        return list(self.end)

    def get_cursors(self) -> dict[str, list[int | None]]:
        return {g: list(c) for g, c in self.cursors.items()}

    def earliest(self, p: int) -> int:
        return self.first[p]

    def count(self, p: int, start: int, end: int) -> int | None:
        self.calls += 1
        if start >= end:
            return 0
        live = [o for o in self.frames[p] if o >= self.first[p]] + [self.end[p]]
        if start < self.first[p] or start not in live or end not in live:
            return None
        if any(q == p and start <= o < end for q, o in self.corrupt):
            return None
        n = sum(1 for o in live[:-1] if start <= o < end)
        self.scanned += n
        return n

    def meter(self, unit: str) -> LagMeter:
        return LagMeter(unit, self.ends, self.get_cursors, self.earliest, self.count)

    # changes
    def append(self, p: int, size: int) -> None:
        if p in self.breaking:
            self.corrupt.add((p, self.end[p]))
        self.frames[p].append(self.end[p])
        self.end[p] += size

    def boundaries(self, p: int) -> list[int]:
        return [o for o in self.frames[p] if o >= self.first[p]] + [self.end[p]]

    def expected(self, unit: str) -> dict[str, int]:
        """A full recount, written independently of the meter: bytes from the cursor (or
        the earliest offset without one) to the end; messages from the cursor or from the
        earliest record (no cursor yet, or records deleted after it)."""
        out = {}
        for g, cs in self.cursors.items():
            total = 0
            for p in range(len(self.end)):
                c = cs[p] if p < len(cs) else None
                start = min(max(c or 0, self.first[p]), self.end[p])
                if unit == "bytes":
                    total += self.end[p] - min(self.first[p] if c is None else c, self.end[p])
                elif not any(q == p and o >= start for q, o in self.corrupt):
                    total += sum(1 for o in self.frames[p] if start <= o)
            out[g] = total
        return out


def test_lag_meter_counts_messages_and_bytes() -> None:
    t = FakeTopic(2)
    for size in (10, 20, 30):
        t.append(0, size)
    t.append(1, 5)
    t.cursors = {"a": [None, None], "b": [10, 5], "c": [60, None]}
    assert t.meter("messages").lags() == {"a": 4, "b": 2, "c": 1}
    assert t.meter("bytes").lags() == {"a": 65, "b": 50, "c": 5}


def test_lag_meter_group_without_cursor_counts_from_earliest() -> None:
    t = FakeTopic(1)
    for _ in range(5):
        t.append(0, 8)
    t.first[0] = 16  # retention deleted the first two frames
    t.cursors = {"new": [None], "short": []}  # a list shorter than the partitions: None
    assert t.meter("messages").lags() == {"new": 3, "short": 3}
    assert t.meter("bytes").lags() == {"new": 24, "short": 24}


def test_lag_meter_unreadable_range_is_zero() -> None:
    t = FakeTopic(2)
    for _ in range(4):
        t.append(0, 8)
        t.append(1, 8)
    t.cursors = {"g": [0, 8]}
    m = t.meter("messages")
    assert m.lags() == {"g": 4 + 3}
    t.breaking.add(0)
    t.append(0, 8)  # a corrupt frame: partition 0 cannot be counted, 0 rather than block
    t.breaking.clear()
    assert m.lags() == {"g": 0 + 3}
    t.append(0, 8)  # still unreadable: not the frames appended since, either
    assert m.lags() == {"g": 0 + 3}
    assert t.meter("bytes").lags() == {"g": 48 + 24}  # bytes need no count
    t.cursors["g"][0] = 40  # a seek past the corrupt frame
    assert m.lags() == {"g": 1 + 3}


def test_lag_meter_cursor_below_earliest() -> None:
    """Retention deleted records a stalled group had not read: in messages its lag is the
    records left, counted from the earliest one, and stays right as more arrive
    (incrementally); in bytes it is still the end less the cursor."""
    t = FakeTopic(1)
    for _ in range(4):
        t.append(0, 8)
    t.cursors = {"g": [8]}
    m, mb = t.meter("messages"), t.meter("bytes")
    assert (m.lags(), mb.lags()) == ({"g": 3}, {"g": 24})
    t.first[0] = 16  # the records at 0 and 8 are gone
    assert (m.lags(), mb.lags()) == ({"g": 2}, {"g": 24})
    t.append(0, 8)
    assert (m.lags(), mb.lags()) == ({"g": 3}, {"g": 32})
    t.first[0] = 40  # every record is gone
    assert (m.lags(), mb.lags()) == ({"g": 0}, {"g": 32})


def test_lag_meter_cursor_beyond_end_is_zero() -> None:
    t = FakeTopic(1)
    t.append(0, 8)
    t.cursors = {"g": [100]}
    assert t.meter("messages").lags() == {"g": 0}
    assert t.meter("bytes").lags() == {"g": 0}


def test_lag_meter_is_incremental() -> None:
    """A second reading counts only what changed since the first: not the whole backlog."""
    t = FakeTopic(1)
    for _ in range(1000):
        t.append(0, 4)
    t.cursors = {"g": [None]}
    m = t.meter("messages")
    assert m.lags() == {"g": 1000}
    assert t.scanned == 1000
    t.scanned = 0
    for _ in range(3):
        t.append(0, 4)
    t.cursors["g"] = [8]  # two acked
    assert m.lags() == {"g": 1001}
    assert t.scanned == 3 + 2
    t.scanned = 0
    assert m.lags() == {"g": 1001}
    assert t.scanned == 0
    t.cursors["g"] = [0]  # a seek backwards: a full recount
    assert m.lags() == {"g": 1003}
    assert t.scanned == 1003


def test_lag_meter_reads_earliest_once_per_partition() -> None:
    t = FakeTopic(3)
    calls: list[int] = []

    def earliest(p: int) -> int:
        calls.append(p)
        return t.first[p]

    t.cursors = {"a": [None, 0, None], "b": [0, 0, 0], "c": [None, None, None]}
    LagMeter("messages", t.ends, t.get_cursors, earliest, t.count).lags()
    assert sorted(calls) == [0, 1, 2]
    calls.clear()
    t.cursors = {"b": [0, 0, 0]}
    LagMeter("bytes", t.ends, t.get_cursors, earliest, t.count).lags()
    assert calls == []  # bytes with every cursor known: no need
    t.cursors = {}
    LagMeter("messages", t.ends, t.get_cursors, earliest, t.count).lags()
    assert calls == []  # no group: nothing read


def test_lag_meter_groups_counted_apart() -> None:
    t = FakeTopic(1)
    for _ in range(10):
        t.append(0, 1)
    t.cursors = {"a": [None]}
    m = t.meter("messages")
    assert m.lags() == {"a": 10}
    t.cursors = {"a": [None], "b": [9]}  # a group that appears later
    assert m.lags() == {"a": 10, "b": 1}
    t.cursors = {"b": [10]}  # and one that goes away
    assert m.lags() == {"b": 0}


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 2), st.integers(1, 50)),
        st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 6)),
        st.tuples(st.just("seek"), st.integers(0, 2), st.integers(0, 1 << 16)),
        st.tuples(st.just("group"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("retain"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("break"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("read"), st.integers(0, 2), st.integers(0, 0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, unit=st.sampled_from(["messages", "bytes"]))
def test_lag_meter_incremental_equals_recount(
    ops: list[tuple[str, int, int]], unit: str,
) -> None:
    """Over random appends, acks (cursors forward), seeks backwards, groups appearing,
    retention (deleting records before or after a cursor) and corrupt frames, the meter's
    reading equals a full recount after every step."""
    t = FakeTopic(3)
    groups = ["g0", "g1"]
    t.cursors = {"g0": [None, None, None]}
    m = t.meter(unit)
    for op, p, arg in ops:
        if op == "append":
            t.append(p, arg)
        elif op in ("ack", "seek"):
            g = groups[arg % 2] if op == "ack" else groups[0]
            if g not in t.cursors:
                continue
            marks = t.boundaries(p)
            c = t.cursors[g][p]
            now = marks.index(c) if c in marks else 0
            if op == "ack":
                t.cursors[g][p] = marks[min(now + arg, len(marks) - 1)]
            else:
                t.cursors[g][p] = marks[arg % (now + 1)]  # at or before where it was
        elif op == "group":
            t.cursors.setdefault(groups[arg], [None, None, None])
        elif op == "retain":
            marks = t.boundaries(p)
            # delete whole frames, never the one being written (the end stays)
            t.first[p] = marks[min(arg, len(marks) - 1)]
        elif op == "break":
            if arg:
                t.breaking.add(p)
            else:
                t.breaking.discard(p)
        assert m.lags() == t.expected(unit), (op, p, arg)
