"""Back-pressure: TitanMQ's dual watermark with hysteresis, on a consumer group's lag.

``Watermarks`` is the sans-I/O rule (lag in, state out); ``LagMeter`` measures the lag of
the watched group from the partitions' ends and cursors, counting messages incrementally
so that a producer re-reads it often at little cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._checks import check_int, check_seconds

UNITS = ("messages", "bytes")
ON_HIGH = ("block", "raise")


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
    """

    high: int
    low: int | None = None  # None: high // 2
    unit: str = "messages"
    group: str | None = None
    on_high: str = "block"
    timeout: float | None = None
    interval: float = 0.005

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


def watched_lag(lags: dict[str, int], group: str | None) -> int:
    """The lag back-pressure acts on: the named group's (0 if it has no cursor yet) or the
    slowest group's (0 with no group: nobody to wait for)."""
    if group is not None:
        return lags.get(group, 0)
    return max(lags.values(), default=0)


def deadline_left(deadline: float, now: float) -> float:
    return max(0.0, deadline - now) if math.isfinite(deadline) else math.inf
