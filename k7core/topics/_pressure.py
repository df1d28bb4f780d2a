"""Back-pressure: TitanMQ's dual watermark with hysteresis, on a consumer group's lag.

``Watermarks`` is the sans-I/O rule (lag in, state out); ``LagMeter`` measures the lag of
the watched group from the partitions' ends and cursors, counting messages incrementally
so that a producer re-reads it often at little cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from .._checks import check_int, check_seconds

UNITS = ("messages", "bytes")
ON_HIGH = ("block", "raise")
GROUP_EXPIRY = 300.0
"""``BackPressure.group_expiry``'s default: a group inactive for 5 minutes (Kafka's
``max.poll.interval.ms``) stops holding producers back."""


@dataclass(frozen=True)
class BackPressure:
    """When a topic's producers slow down or stop: on the lag of ``group`` (None: the
    slowest group of the topic), in ``unit`` (``"messages"`` or ``"bytes"``).

    Below ``low`` sends go through (throttle ratio 0). From ``high`` the topic is paused
    and stays paused until the lag falls to ``low`` again (hysteresis): a paused ``send``
    waits (``on_high="block"``, up to ``timeout`` seconds, None: no limit) or raises
    ``BackPressureError`` at once (``on_high="raise"``). Between the marks the throttle
    ratio rises linearly from 0 to 1 (``Topic.throttle_ratio()``), for callers that pace
    themselves. The lag is re-read at most every ``interval`` seconds while sending.

    A group inactive for ``group_expiry`` seconds (None: never) stops counting: no member
    has beaten (polled) and no generation was written for that long, and its committed
    offsets did not move as this topic saw them. A dead group then no longer holds
    producers back; it counts again as soon as a member joins or polls.
    """

    high: int
    low: int | None = None  # None: high // 2
    unit: str = "messages"
    group: str | None = None
    on_high: str = "block"
    timeout: float | None = None
    interval: float = 0.005
    group_expiry: float | None = GROUP_EXPIRY

    def __post_init__(self) -> None:
        check_int(self.high, "high", 1)
        low = self.high // 2 if self.low is None else check_int(self.low, "low", 0)
        if low >= self.high:
            raise ValueError(f"low ({low}) must be below high ({self.high})")
        object.__setattr__(self, "low", low)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be 'messages' or 'bytes', not {self.unit!r}")
        if self.on_high not in ON_HIGH:
            raise ValueError(f"on_high must be 'block' or 'raise', not {self.on_high!r}")
        if self.group is not None and not isinstance(self.group, str):
            raise TypeError(f"group must be a str or None, not {type(self.group).__name__}")
        if self.timeout is not None:
            check_seconds(self.timeout, "timeout")
        check_seconds(self.interval, "interval")
        if self.group_expiry is not None:
            check_seconds(self.group_expiry, "group_expiry", positive=True)

    @property
    def low_mark(self) -> int:
        assert self.low is not None
        return self.low


class Watermarks:
    """The hysteresis state: paused from ``high`` until the lag is back at ``low``."""

    def __init__(self, high: int, low: int) -> None:
        self.high, self.low = high, low
        self.paused = False
        self.pauses = 0  # times the state went from running to paused

    def update(self, lag: int) -> bool:
        """Take a new lag; return whether sends are paused."""
        if self.paused:
            if lag <= self.low:
                self.paused = False
        elif lag >= self.high:
            self.paused = True
            self.pauses += 1
        return self.paused

    def ratio(self, lag: int) -> float:
        """0 at or below ``low``, 1 at or above ``high``, linear between (or 1 while
        paused: TitanMQ's continuous throttle ratio with the hysteresis applied)."""
        if self.paused or lag >= self.high:
            return 1.0
        if lag <= self.low:
            return 0.0
        return (lag - self.low) / (self.high - self.low)


@dataclass
class _Span:
    committed: int
    end: int
    messages: int | None


class LagMeter:
    """The lag of one group (or the largest of several) summed over partitions.

    ``cursors()`` gives, per group, the committed offset of each partition (None: no
    cursor yet, counted from ``earliest(p)``); ``ends()`` the partitions' visible ends;
    ``count(p, start, end)`` the messages between two frame boundaries (None when that range
    is not readable, e.g. corrupt or deleted while counting). In bytes a partition's lag
    is its end less the committed offset (as ``TopicGroupStats.lag_bytes``); in messages,
    the records from the committed offset to the end, counted from ``earliest(p)`` when
    retention deleted records after the cursor (a stalled group keeps the lag of the
    records still there). Messages are counted only over what changed since the last
    reading, and always equal a count from scratch.
    """

    def __init__(
        self,
        unit: str,
        ends: Callable[[], Sequence[int]],
        cursors: Callable[[], dict[str, list[int | None]]],
        earliest: Callable[[int], int],
        count: Callable[[int, int, int], int | None],
    ) -> None:
        self.unit = unit
        self._ends, self._cursors, self._earliest, self._count = ends, cursors, earliest, count
        self._spans: dict[tuple[str, int], _Span] = {}

    def lags(self) -> dict[str, int]:
        """The lag of every group of the topic now, in the meter's unit."""
        ends = self._ends()
        out: dict[str, int] = {}
        firsts: dict[int, int] = {}  # each partition's earliest offset, read once
        for group, committed in self._cursors().items():
            total = 0
            for p, end in enumerate(ends):
                c = committed[p] if p < len(committed) else None
                # Messages are counted from the earliest record when retention deleted
                # records after the cursor: a count over them is impossible.
                if c is None or self.unit == "messages":
                    first = firsts.get(p)
                    if first is None:
                        first = firsts[p] = self._earliest(p)
                    c = first if c is None else max(c, first)
                total += self._lag(group, p, min(c, end), end)
            out[group] = total
        return out

    def _lag(self, group: str, p: int, committed: int, end: int) -> int:
        if self.unit == "bytes":
            return end - committed
        span = self._spans.get((group, p))
        n: int | None = None
        if span is not None and span.messages is not None and committed >= span.committed \
                and end >= span.end:
            more = self._count(p, span.end, end)
            done = self._count(p, span.committed, committed)
            if more is not None and done is not None:
                n = span.messages + more - done
        if n is None:
            n = self._count(p, committed, end)
        if n is None:  # unreadable (corrupt, deleted under us): estimate nothing rather
            self._spans.pop((group, p), None)  # than block; count afresh next time
            return 0
        self._spans[(group, p)] = _Span(committed, end, n)
        return n


def watched_lag(lags: dict[str, int], group: str | None, expired: Collection[str] = ()) -> int:
    """The lag back-pressure acts on: the named group's (0 if it has no cursor yet or
    expired) or the slowest group's that has not expired (0 with none: nobody to wait
    for)."""
    if group is not None:
        return 0 if group in expired else lags.get(group, 0)
    return max((n for g, n in lags.items() if g not in expired), default=0)


class GroupActivity:
    """When each group was last active (wall-clock seconds), and which ones expired.

    A group's activity is the newest of: its files' times, passed in (members' heartbeats,
    the last generation written; None for a group known only by its cursors), and the last
    move of its committed offsets seen here (``saw``). A group known only by its cursors
    counts as active when first seen, so a producer that starts does not forget a group
    just because it has not watched it yet. Sans-I/O: times come in.
    """

    def __init__(self, expiry: float | None) -> None:
        self.expiry = expiry
        self._cursors: dict[str, tuple[int | None, ...]] = {}
        self._first: dict[str, float] = {}
        self._moved: dict[str, float] = {}

    def saw(self, cursors: dict[str, list[int | None]], now: float) -> None:
        """Take every group's committed offsets as read at ``now``."""
        for group, committed in cursors.items():
            offsets = tuple(committed)
            old = self._cursors.get(group)
            if old is None:
                self._first[group] = now
            elif old != offsets:
                self._moved[group] = now
            self._cursors[group] = offsets

    def last_active(self, group: str, files: float | None) -> float | None:
        """The group's last activity; None when nothing is known of it."""
        times = [t for t in (files, self._moved.get(group)) if t is not None]
        if files is None and group in self._first:
            times.append(self._first[group])
        return max(times, default=None)

    def expired(self, group: str, files: float | None, now: float) -> bool:
        last = self.last_active(group, files)
        return self.expiry is not None and last is not None and now - last > self.expiry


def deadline_left(deadline: float, now: float) -> float:
    return max(0.0, deadline - now) if math.isfinite(deadline) else math.inf
