"""A reference model of the job store's rules, written plainly: a dict of jobs, lists and
loops, no heaps, no lazy deletion, no caches. ``JobMachine`` must agree with it after every
step (test_model.py); the store's tests can drive it the same way.

The rules (beanstalkd 1.12's, plus unique keys, dependencies and error texts):

- ``reserve`` takes the ready job of smallest (priority, id) among the given tubes that are
  not paused; a reservation ends at now + ttr (a ttr below 1 counts as 1).
- Time moves only in ``advance(now)``: delayed jobs with ready_at <= now become ready,
  reservations with deadline <= now become ready (timeouts + 1), pauses with an end <= now
  end (the ready jobs of such a tube count as made ready, after the first two steps).
- ``kick`` takes up to ``bound`` buried jobs, oldest buried first, or if the tube has none, up
  to ``bound`` delayed jobs by (ready_at, id).
- Only the owner of a reservation may delete, release, bury or touch it; release and bury
  need a reservation; kick-job needs buried or delayed; reserve-job ready, delayed or buried.
- A key is unique per tube among live jobs: a put with a taken key returns that job's id.
  A job whose dependencies are not all deleted is waiting; then delayed (ready_at set) or
  ready. Errors: the last 16 texts given to release and bury.
- A tube exists while it has jobs or a pause; its counters (total-jobs, cmd-delete,
  cmd-pause-tube) start at 0 when it starts existing.
- ``restart()`` is what reopening from a snapshot gives: reservations end (ready, no
  counter), pauses end, the counters since start are 0 (and, for a JobStore, each job's
  reserves and timeouts).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from k7core.jobs import DependencyError, Job, JobState

READY, DELAYED, RESERVED, BURIED, WAITING = (
    JobState.READY, JobState.DELAYED, JobState.RESERVED, JobState.BURIED, JobState.WAITING)


@dataclass
class ModelJob:
    id: int
    tube: str
    priority: int
    body: bytes
    ttr: float
    delay: float
    ready_at: float
    created_at: float
    key: str | None
    depends_on: tuple[int, ...]
    state: JobState = READY
    errors: list[str] = field(default_factory=list)
    reserves: int = 0
    timeouts: int = 0
    releases: int = 0
    buries: int = 0
    kicks: int = 0
    owner: Hashable = None
    buried_at: int = 0  # the bury clock when it was buried: FIFO


@dataclass
class TubeCounters:
    total_jobs: int = 0
    deletes: int = 0
    pauses: int = 0


class Model:
    """The rules, plainly. Methods mirror JobMachine's, with booleans for found/not found."""

    def __init__(self) -> None:
        self.jobs: dict[int, ModelJob] = {}
        self.paused: dict[str, tuple[float, float]] = {}  # tube -> (seconds, unpause_at)
        self.counters: dict[str, TubeCounters] = {}
        self.timeouts = 0
        self.total_jobs = 0
        self.bury_clock = 0

    # --- helpers ---------------------------------------------------------------------------

    def in_tube(self, tube: str, state: JobState | None = None) -> list[ModelJob]:
        return [j for j in self.jobs.values()
                if j.tube == tube and (state is None or j.state is state)]

    def exists(self, tube: str) -> bool:
        return bool(self.in_tube(tube)) or tube in self.paused

    def counter(self, tube: str) -> TubeCounters:
        return self.counters.setdefault(tube, TubeCounters())

    def forget_empty_tubes(self) -> None:
        for tube in list(self.counters):
            if not self.exists(tube):
                del self.counters[tube]

    def owned(self, job_id: int, owner: Hashable) -> ModelJob | None:
        j = self.jobs.get(job_id)
        if j is None or j.state is not RESERVED or j.owner != owner:
            return None
        return j

    def make_ready(self, j: ModelJob) -> None:
        j.state = READY
        j.ready_at = 0.0
        j.owner = None

    def add_error(self, j: ModelJob, error: str | None) -> None:
        if error is not None:
            j.errors = [*j.errors, error][-16:]

    # --- journaled -------------------------------------------------------------------------

    def put(
        self, new_id: int, tube: str, body: bytes, priority: int, delay: float, ttr: float,
        key: str | None, depends_on: Iterable[int | tuple[str, str]], now: float,
    ) -> int:
        """The id stored (``new_id``) or found (same key); DependencyError if a dependency
        is not live (checked after the key)."""
        if key is not None:
            for j in self.jobs.values():
                if j.tube == tube and j.key == key:
                    return j.id
        deps: list[int] = []
        for dep in depends_on:
            if isinstance(dep, int):
                if dep not in self.jobs:
                    raise DependencyError(f"no job {dep}")
                found = dep
            else:
                matches = [j.id for j in self.jobs.values()
                           if j.tube == dep[0] and j.key == dep[1]]
                if not matches:
                    raise DependencyError(f"no job with key {dep}")
                found = matches[0]
            if found not in deps:
                deps.append(found)
        if not self.exists(tube):
            self.counters.pop(tube, None)
        j = ModelJob(new_id, tube, priority, body, max(float(ttr), 1.0), float(delay),
                     now + delay if delay > 0 else 0.0, now, key, tuple(deps))
        self.jobs[new_id] = j
        self.counter(tube).total_jobs += 1
        self.total_jobs += 1
        if deps:
            j.state = WAITING
        elif delay > 0:
            j.state = DELAYED
        return new_id

    def delete(self, job_id: int, owner: Hashable) -> bool:
        j = self.jobs.get(job_id)
        if j is None or (j.state is RESERVED and j.owner != owner):
            return False
        del self.jobs[job_id]
        self.counter(j.tube).deletes += 1
        for w in self.jobs.values():
            if w.state is WAITING and not any(d in self.jobs for d in w.depends_on):
                if w.ready_at > 0:
                    w.state = DELAYED
                else:
                    self.make_ready(w)
        self.forget_empty_tubes()
        return True

    def release(self, job_id: int, owner: Hashable, priority: int, delay: float,
                error: str | None, now: float) -> bool:
        j = self.owned(job_id, owner)
        if j is None:
            return False
        j.priority = priority
        j.delay = float(delay)
        j.releases += 1
        self.add_error(j, error)
        j.owner = None
        if delay > 0:
            j.state = DELAYED
            j.ready_at = now + delay
        else:
            self.make_ready(j)
        return True

    def bury(self, job_id: int, owner: Hashable, priority: int, error: str | None) -> bool:
        j = self.owned(job_id, owner)
        if j is None:
            return False
        j.priority = priority
        j.buries += 1
        self.add_error(j, error)
        j.owner = None
        j.state = BURIED
        j.ready_at = 0.0
        self.bury_clock += 1
        j.buried_at = self.bury_clock
        return True

    def kick(self, tube: str, bound: int) -> list[int]:
        buried = sorted(self.in_tube(tube, BURIED), key=lambda j: j.buried_at)
        if buried:
            chosen = buried[:bound]
        else:
            chosen = sorted(self.in_tube(tube, DELAYED), key=lambda j: (j.ready_at, j.id))
            chosen = chosen[:bound]
        for j in chosen:
            j.kicks += 1
            self.make_ready(j)
        return [j.id for j in chosen]

    def kick_job(self, job_id: int) -> bool:
        j = self.jobs.get(job_id)
        if j is None or j.state not in (BURIED, DELAYED):
            return False
        j.kicks += 1
        self.make_ready(j)
        return True

    # --- not journaled ---------------------------------------------------------------------

    def paused_now(self, tube: str, now: float) -> bool:
        return tube in self.paused and self.paused[tube][1] > now

    def reserve(self, owner: Hashable, tubes: Iterable[str], now: float) -> int | None:
        names = set(tubes)
        ready = [j for j in self.jobs.values() if j.state is READY and j.tube in names
                 and not self.paused_now(j.tube, now)]
        if not ready:
            return None
        j = min(ready, key=lambda j: (j.priority, j.id))
        self.take(j, owner, now)
        return j.id

    def take(self, j: ModelJob, owner: Hashable, now: float) -> None:
        j.state = RESERVED
        j.owner = owner
        j.reserves += 1
        j.ready_at = now + j.ttr

    def reserve_job(self, job_id: int, owner: Hashable, now: float) -> bool:
        j = self.jobs.get(job_id)
        if j is None or j.state not in (READY, DELAYED, BURIED):
            return False
        self.take(j, owner, now)
        return True

    def touch(self, job_id: int, owner: Hashable, now: float) -> bool:
        j = self.owned(job_id, owner)
        if j is None:
            return False
        j.ready_at = now + j.ttr
        return True

    def release_owner(self, owner: Hashable) -> int:
        mine = [j for j in self.jobs.values() if j.state is RESERVED and j.owner == owner]
        for j in mine:
            self.make_ready(j)
        return len(mine)

    def deadline_soon(self, owner: Hashable, now: float) -> bool:
        return any(j.ready_at - 1.0 <= now for j in self.jobs.values()
                   if j.state is RESERVED and j.owner == owner)

    def pause(self, tube: str, seconds: float, now: float) -> None:
        seconds = float(seconds) or 1.0
        if not self.exists(tube):
            self.counters.pop(tube, None)
        self.paused[tube] = (seconds, now + seconds)
        self.counter(tube).pauses += 1

    def advance(self, now: float) -> int:
        made = 0
        for j in self.jobs.values():
            if j.state is DELAYED and j.ready_at <= now:
                self.make_ready(j)
                made += 1
        for j in self.jobs.values():
            if j.state is RESERVED and j.ready_at <= now:
                self.make_ready(j)
                j.timeouts += 1
                self.timeouts += 1
                made += 1
        for tube, (_, until) in list(self.paused.items()):
            if until <= now:
                del self.paused[tube]
                made += len(self.in_tube(tube, READY))
        self.forget_empty_tubes()
        return made

    def next_deadline(self) -> float | None:
        times = [j.ready_at for j in self.jobs.values() if j.state in (DELAYED, RESERVED)]
        times += [until for _, until in self.paused.values()]
        return min(times, default=None)

    def restart(self, *, keep_reservation_counters: bool = True) -> None:
        """What reopening gives (from a snapshot, or a journal, with reset counters).
        ``keep_reservation_counters=False``: each job's ``reserves`` and ``timeouts`` are 0
        too, as a JobStore reopens (reservations are not journaled, and its snapshots are
        written from a state replayed from the journal)."""
        for j in self.jobs.values():
            if j.state is RESERVED:
                self.make_ready(j)
            if not keep_reservation_counters:
                j.reserves = j.timeouts = 0
        self.paused.clear()
        self.counters.clear()
        self.timeouts = self.total_jobs = 0

    # --- reads -----------------------------------------------------------------------------

    def view(self, j: ModelJob) -> Job:
        return Job(
            id=j.id, tube=j.tube, priority=j.priority, body=j.body, state=j.state, ttr=j.ttr,
            reserves=j.reserves, timeouts=j.timeouts, releases=j.releases, buries=j.buries,
            kicks=j.kicks, created_at=j.created_at, key=j.key, depends_on=j.depends_on,
            errors=tuple(j.errors), delay=j.delay, ready_at=j.ready_at,
        )

    def peek(self, job_id: int) -> Job | None:
        j = self.jobs.get(job_id)
        return None if j is None else self.view(j)

    def peek_ready(self, tube: str) -> Job | None:
        ready = self.in_tube(tube, READY)
        return self.view(min(ready, key=lambda j: (j.priority, j.id))) if ready else None

    def peek_delayed(self, tube: str) -> Job | None:
        delayed = self.in_tube(tube, DELAYED)
        return self.view(min(delayed, key=lambda j: (j.ready_at, j.id))) if delayed else None

    def errors(self, tube: str) -> list[Job]:
        return [self.view(j) for j in sorted(self.in_tube(tube, BURIED),
                                             key=lambda j: j.buried_at)]

    def peek_buried(self, tube: str) -> Job | None:
        buried = self.errors(tube)
        return buried[0] if buried else None

    def tubes(self) -> list[str]:
        return sorted({j.tube for j in self.jobs.values()} | set(self.paused))

    def counts(self, tube: str) -> dict[JobState, int]:
        return {s: len(self.in_tube(tube, s)) for s in (READY, DELAYED, RESERVED, BURIED,
                                                         WAITING)}

    def job_stats(self, job_id: int, now: float) -> dict[str, int | str]:
        j = self.jobs[job_id]
        return {
            "id": j.id, "tube": j.tube, "state": j.state.value, "pri": j.priority,
            "age": int(now - j.created_at), "delay": int(j.delay), "ttr": int(j.ttr),
            "time-left": int(j.ready_at - now) if j.state in (RESERVED, DELAYED) else 0,
            "file": 0, "reserves": j.reserves, "timeouts": j.timeouts,
            "releases": j.releases, "buries": j.buries, "kicks": j.kicks,
        }

    def tube_stats(self, tube: str, now: float) -> dict[str, int | str]:
        c = self.counters.get(tube, TubeCounters()) if self.exists(tube) else TubeCounters()
        seconds, until = self.paused.get(tube, (0.0, 0.0))
        return {
            "name": tube,
            "current-jobs-urgent": len([j for j in self.in_tube(tube, READY)
                                        if j.priority < 1024]),
            "current-jobs-ready": len(self.in_tube(tube, READY)),
            "current-jobs-reserved": len(self.in_tube(tube, RESERVED)),
            "current-jobs-delayed": len(self.in_tube(tube, DELAYED)),
            "current-jobs-buried": len(self.in_tube(tube, BURIED)),
            "total-jobs": c.total_jobs,
            "current-using": 0, "current-watching": 0, "current-waiting": 0,
            "cmd-delete": c.deletes,
            "cmd-pause-tube": c.pauses,
            "pause": int(seconds),
            "pause-time-left": int(until - now) if tube in self.paused else 0,
        }

    def stats(self) -> dict[str, int]:
        jobs = list(self.jobs.values())
        return {
            "current-jobs-urgent": len([j for j in jobs if j.state is READY
                                        and j.priority < 1024]),
            "current-jobs-ready": len([j for j in jobs if j.state is READY]),
            "current-jobs-reserved": len([j for j in jobs if j.state is RESERVED]),
            "current-jobs-delayed": len([j for j in jobs if j.state is DELAYED]),
            "current-jobs-buried": len([j for j in jobs if j.state is BURIED]),
            "job-timeouts": self.timeouts,
            "total-jobs": self.total_jobs,
            "current-tubes": len(self.tubes()),
        }
