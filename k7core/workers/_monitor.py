"""What a worker counts and how it judges its health, without I/O (time is passed in).

yoltq's ``retry-stats``, ``processing-time-stats`` and ``healthy?``: per tube, jobs done,
retries and jobs given up; run times over a sliding window; and health, which is False
while a failing job created more than ``healthy_allowed_error_time`` ago is still in the
store (buried there, or one this worker saw fail and not yet done: retrying here or in any
other worker), or a job has run past its ``max_execute_time``. As yoltq's, health follows
the jobs' state, not this worker's memory: a job that failed here and was then done by
another worker (or deleted) no longer counts, whichever worker did it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass
class TubeCounts:
    """One tube's figures since the worker started."""

    ok: int = 0
    """Jobs done (the consumer returned, or raised an ``already_done`` class)."""
    retried_ok: int = 0
    """Of those, jobs that had failed before."""
    failures: int = 0
    """Consumer runs that raised."""
    buried: int = 0
    """Jobs given up: retries exhausted, an invalid or undecodable payload."""
    deferred: int = 0
    """Runs put off because the tube's gate was closed after a failure."""

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {
            "ok": self.ok, "retried_ok": self.retried_ok, "failures": self.failures,
            "buried": self.buried, "deferred": self.deferred,
        }
        if self.ok:
            out["retry_percentage"] = 100.0 * self.failures / self.ok
        return out


def percentile(sorted_values: list[float], p: float) -> float:
    """The nearest-rank percentile ``p`` (0-100) of a non-empty sorted list (yoltq's)."""
    return sorted_values[min(len(sorted_values) - 1, math.floor(len(sorted_values) * p / 100))]


class Suspects(NamedTuple):
    """What a health check must ask the store (:meth:`Monitor.suspects`)."""

    buried_old: bool
    """A job created more than allowed_error_time ago is buried now: unhealthy."""
    jobs: list[tuple[str, int]]
    """(tube, id) of remembered failing jobs that old, not buried now, oldest first."""


@dataclass
class Monitor:
    """Figures and health of one worker. Not thread-safe: the worker serializes calls."""

    window: float = 3600.0
    """Seconds of run times kept for :meth:`processing_times`."""
    max_samples: int = 100_000
    """Run times kept per tube at most (the oldest go first)."""
    allowed_error_time: float = 900.0
    """yoltq's ``healthy-allowed-error-time`` (15 min)."""
    grace: float = 600.0
    """Seconds after start during which :meth:`healthy` says True (yoltq: 10 min)."""
    started: float = 0.0
    counts: dict[str, TubeCounts] = field(default_factory=dict)
    _times: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    _failing: dict[str, dict[int, float]] = field(default_factory=dict)
    _checked: bool | None = None

    def _tube(self, tube: str) -> TubeCounts:
        c = self.counts.get(tube)
        if c is None:
            c = self.counts[tube] = TubeCounts()
        return c

    def done(self, tube: str, job_id: int, had_failed: bool, took: float, now: float) -> None:
        c = self._tube(tube)
        c.ok += 1
        if had_failed:
            c.retried_ok += 1
            self._failing.get(tube, {}).pop(job_id, None)
        q = self._times.get(tube)
        if q is None:
            q = self._times[tube] = deque(maxlen=self.max_samples)
        q.append((now, took))

    def failed(self, tube: str, job_id: int, created_at: float) -> None:
        self._tube(tube).failures += 1
        self._failing.setdefault(tube, {})[job_id] = created_at

    def moved(self, tube: str, old_id: int, new_id: int) -> None:
        """A failing job was put again under a new id (a beanstalkd source's retry)."""
        failing = self._failing.get(tube)
        if failing is not None and old_id in failing:
            failing[new_id] = failing.pop(old_id)

    def buried(self, tube: str, job_id: int, created_at: float) -> None:
        self._tube(tube).buried += 1
        self._failing.setdefault(tube, {})[job_id] = created_at

    def deferred(self, tube: str) -> None:
        self._tube(tube).deferred += 1

    def forget(self, tube: str, job_id: int) -> None:
        """A failing job left the worker's hands (kicked and done elsewhere, deleted)."""
        self._failing.get(tube, {}).pop(job_id, None)

    def suspects(self, now: float, buried: dict[str, list[tuple[int, float]]], limit: int
                 ) -> Suspects:
        """A health check's first step. ``buried``: per tube, (id, created_at) of its buried
        jobs as the store has them now (remembered as failing). Returns whether one of them
        is old enough to make the worker unhealthy, and the other remembered failing jobs
        old enough (the oldest ``limit``): ask the store whether each is still there, then
        :meth:`settle`."""
        old = now - self.allowed_error_time
        buried_old = False
        known = set()
        for tube, jobs in buried.items():
            failing = self._failing.setdefault(tube, {})
            for job_id, created in jobs:
                failing[job_id] = created
                known.add((tube, job_id))
                buried_old = buried_old or created <= old
        ask = sorted((created, tube, job_id) for tube, failing in self._failing.items()
                     for job_id, created in failing.items()
                     if created <= old and (tube, job_id) not in known)
        return Suspects(buried_old, [(tube, job_id) for _, tube, job_id in ask[:limit]])

    def settle(self, suspects: Suspects, present: Sequence[bool], slow: bool) -> bool:
        """Judge health now: ``present``, whether each of ``suspects.jobs`` is still in the
        store (those that are not were done or deleted somewhere: forgotten); ``slow``, a
        job runs past its max_execute_time."""
        for (tube, job_id), here in zip(suspects.jobs, present, strict=True):
            if not here:
                self.forget(tube, job_id)
        self._checked = not (suspects.buried_old or any(present) or slow)
        return self._checked

    def healthy(self, now: float) -> bool | None:
        """None before the first check; True during the start-up grace; else the last
        check's verdict."""
        if self._checked is None:
            return None
        if now - self.started < self.grace:
            return True
        return self._checked

    def processing_times(self, now: float) -> dict[str, dict[str, float]]:
        """Per tube, run times (seconds) over the window: avg, min, max, p50, p90, p95, p99."""
        out = {}
        for tube, q in self._times.items():
            while q and q[0][0] < now - self.window:
                q.popleft()
            if not q:
                continue
            values = sorted(t for _, t in q)
            out[tube] = {
                "count": float(len(values)), "avg": sum(values) / len(values),
                "min": values[0], "max": values[-1],
                **{f"p{p}": percentile(values, p) for p in (50, 90, 95, 99)},
            }
        return out

    def retry_stats(self) -> dict[str, dict[str, float]]:
        """Per tube: ok, retried_ok, failures, buried, deferred, retry_percentage (failures
        per 100 done, yoltq's)."""
        return {tube: c.as_dict() for tube, c in sorted(self.counts.items())}
