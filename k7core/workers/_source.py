"""Where a worker's jobs come from: what it needs of a job store, and the two in this module.

A :class:`Source` puts jobs and answers the worker's questions about a tube; a
:class:`Session` holds reservations (one per running consumer: a job store's owner, a
beanstalkd connection). :class:`StoreSource` serves a :class:`k7core.jobs.JobStore` in this
process; :class:`MemorySource` is the test mode's: a job machine in memory with a clock the
test moves, no thread and no timer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, cast

from ..jobs import Job, JobNotFoundError, JobOwner, JobState, JobStore
from ..jobs._machine import JobMachine


class JobView(NamedTuple):
    """A job as a worker sees it: reserved, or buried with its failures."""

    id: int
    tube: str
    body: bytes
    priority: int
    errors: tuple[str, ...]
    """Recorded failure texts, newest last (bounded)."""
    created_at: float
    ttr: float = 0.0
    """Its own time-to-run (seconds), whoever put it: a running job is touched every third
    of it. 0.0: not known yet (a beanstalkd server's reserve does not say; the first touch
    asks)."""


_new_view = cast(Callable[[type[JobView], tuple[Any, ...]], JobView], tuple.__new__)
"""``tuple.__new__``: a JobView without the Python-level ``__new__`` of a NamedTuple (half
the cost, once per job)."""


def view(job: Job) -> JobView:
    return _new_view(JobView, (job.id, job.tube, job.body, job.priority, job.errors,
                               job.created_at, job.ttr))


Deps = Sequence[int | tuple[str, str]]


class Session(Protocol):
    """Reservations of one consumer; only it may finish them; closing it makes them ready."""

    def reserve(self, tubes: tuple[str, ...], timeout: float) -> JobView | None: ...
    def delete(self, job: JobView) -> None: ...
    def release(self, job: JobView, delay: float, error: str | None) -> int:
        """Back to ready after ``delay``; returns the job's id from now on."""
    def bury(self, job: JobView, error: str) -> int:
        """Aside until kicked; returns the job's id from now on."""
    def touch(self, job: JobView) -> float:
        """Give the reserved ``job`` a full time-to-run again; returns its ttr."""
    def take(self, job_id: int) -> JobView:
        """Reserve this job whatever its state (beanstalkd's reserve-job)."""
    def close(self) -> None: ...


class Source(Protocol):
    def session(self) -> Session: ...
    def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
            key: str | None, depends_on: Deps, group: str | None = None) -> int: ...
    def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        """The buried jobs of ``tube`` (the first ``limit``), oldest buried first."""
    def kick(self, tube: str, bound: int) -> int:
        """Make up to ``bound`` buried jobs of ``tube`` ready, oldest buried first; never a
        delayed one (beanstalkd's ``kick`` kicks delayed jobs when none is buried: a job
        due in an hour would run now). Returns how many."""
    def exists(self, job_id: int) -> bool:
        """Whether job ``job_id`` is still in the store, in any state (not done, not
        deleted): the health check asks it of jobs it saw fail."""
    def counts(self) -> dict[str, dict[str, int]]:
        """Per tube, live jobs by state."""
    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        """A job group's live jobs by state, and ``done``."""
    def forget_group(self, tube: str, group: str) -> bool: ...
    def close(self) -> None: ...


def store_counts(store: JobStore) -> dict[str, dict[str, int]]:
    """Per tube of ``store``, live jobs by state (the shape of ``Source.counts``)."""
    return {tube: {"ready": o.ready, "delayed": o.delayed, "reserved": o.reserved,
                   "buried": o.buried, "waiting": o.waiting}
            for tube, o in store.overview().items()}


ALL = 1 << 31
"""A kick's bound meaning every buried job."""


def kick_buried(store: JobStore, tube: str, bound: int) -> int:
    """``Source.kick`` on a job store: each buried job kicked by id (the store's ``kick``
    would kick delayed jobs if none were buried any more); one msync for all under sync."""
    kicked = 0
    with store.batch():
        for job in store.errors(tube)[:bound]:
            try:
                store.kick_job(job.id)
            except JobNotFoundError:  # kicked or deleted meanwhile
                continue
            kicked += 1
    return kicked


def _counts(machine_counts: dict[JobState, int]) -> dict[str, int]:
    return {state.value: n for state, n in machine_counts.items()}


class StoreSession:
    """A job store owner as a :class:`Session`."""

    def __init__(self, owner: JobOwner) -> None:
        self.owner = owner

    def reserve(self, tubes: tuple[str, ...], timeout: float) -> JobView | None:
        reserve = self.owner.reserve
        job = reserve(tubes, 0)  # a ready job: the store's cheapest call
        if job is None and timeout:
            job = reserve(tubes, timeout)
        return None if job is None else view(job)

    def delete(self, job: JobView) -> None:
        self.owner.delete(job.id)

    def release(self, job: JobView, delay: float, error: str | None) -> int:
        self.owner.release(job.id, delay=delay, error=error)
        return job.id

    def bury(self, job: JobView, error: str) -> int:
        self.owner.bury(job.id, error=error)
        return job.id

    def touch(self, job: JobView) -> float:
        self.owner.touch(job.id)
        return job.ttr

    def take(self, job_id: int) -> JobView:
        return view(self.owner.reserve_job(job_id))

    def close(self) -> None:
        self.owner.close()


class StoreSource:
    """A :class:`k7core.jobs.JobStore` of this process; the worker does not close it."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def session(self) -> Session:
        return StoreSession(self.store.owner())

    def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
            key: str | None, depends_on: Deps, group: str | None = None) -> int:
        return self.store.put(body, tube=tube, priority=priority, delay=delay, ttr=ttr,
                              key=key, depends_on=depends_on, group=group)

    def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return [view(j) for j in self.store.errors(tube)[:limit]]

    def kick(self, tube: str, bound: int) -> int:
        return kick_buried(self.store, tube, bound)

    def exists(self, job_id: int) -> bool:
        return self.store.peek(job_id) is not None

    def counts(self) -> dict[str, dict[str, int]]:
        return store_counts(self.store)

    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        return self.store.group_progress(tube, group)

    def forget_group(self, tube: str, group: str) -> bool:
        return self.store.forget_group(tube, group)

    def close(self) -> None:
        pass


class ManualClock:
    """The test mode's time: it moves only when the test calls :meth:`advance`."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.now += seconds


class MemorySession:
    def __init__(self, source: MemorySource) -> None:
        self._source = source
        self._me = object()

    def reserve(self, tubes: tuple[str, ...], timeout: float) -> JobView | None:
        m, now = self._source.machine, self._source.clock()
        m.advance(now)
        job = m.reserve(self._me, tubes, now)
        return None if job is None else view(job)

    def delete(self, job: JobView) -> None:
        m = self._source.machine
        m.check_delete(job.id, self._me)
        m.apply_delete(job.id)

    def release(self, job: JobView, delay: float, error: str | None) -> int:
        m = self._source.machine
        m.apply_release(*m.check_release(job.id, self._me, job.priority, delay, error,
                                         self._source.clock()))
        return job.id

    def bury(self, job: JobView, error: str) -> int:
        m = self._source.machine
        m.apply_bury(*m.check_bury(job.id, self._me, job.priority, error))
        return job.id

    def touch(self, job: JobView) -> float:
        self._source.machine.touch(job.id, self._me, self._source.clock())
        return job.ttr

    def take(self, job_id: int) -> JobView:
        m, now = self._source.machine, self._source.clock()
        m.advance(now)
        if m.check_reserve_job(job_id):
            m.apply_ready(job_id)
        return view(m.reserve_job(job_id, self._me, now))

    def close(self) -> None:
        self._source.machine.release_owner(self._me)


class MemorySource:
    """Jobs in memory for the test mode: no thread, no timer, nothing on disk; delays and
    time-to-run follow ``clock`` (a :class:`ManualClock` by default)."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self.machine = JobMachine()
        self._ids = itertools.count(1)

    def session(self) -> Session:
        return MemorySession(self)

    def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
            key: str | None, depends_on: Deps, group: str | None = None) -> int:
        m = self.machine
        plan = m.check_put(tube, body, priority, delay, ttr, key, depends_on, self.clock())
        m.check_extras(key, None, False, group)
        if isinstance(plan, int):
            return plan
        job_id = next(self._ids)
        m.apply_put_with(job_id, plan, None, False, group)
        return job_id

    def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return [view(j) for j in self.machine.errors(tube)[:limit]]

    def kick(self, tube: str, bound: int) -> int:
        jobs = self.machine.errors(tube)[:bound]  # buried ones only (plan_kick: delayed too)
        for job in jobs:
            self.machine.apply_kick(job.id)
        return len(jobs)

    def exists(self, job_id: int) -> bool:
        return self.machine.peek(job_id) is not None

    def counts(self) -> dict[str, dict[str, int]]:
        self.machine.advance(self.clock())
        return {t: _counts(self.machine.counts(t)) for t in sorted(self.machine.tubes())}

    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        self.machine.advance(self.clock())
        return self.machine.group_progress(tube, group)

    def forget_group(self, tube: str, group: str) -> bool:
        found = self.machine.check_forget_group(tube, group)
        self.machine.apply_forget_group(tube, group)
        return found

    def close(self) -> None:
        pass
