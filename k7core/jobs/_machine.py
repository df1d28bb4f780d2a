"""JobMachine: every live job in RAM, beanstalkd's rules, and no I/O.

A plain class: no threads, locks, clocks or files. Time (``now``, wall-clock seconds as
``time.time()`` gives) is always passed in, so the store, the beanstalkd server and the
tests drive it the same way. One caller at a time: the store holds its lock around every call.

Two kinds of operations:

- **Journaled mutations** (put, delete, release, bury, kick, the move to ready that
  starts a reserve-job of a delayed or buried job, a mark moved by a put that stored
  nothing, forget) come in two halves. ``check_*``
  validates and resolves the arguments and raises, changing nothing, on bad input; it returns
  a plan. ``apply_*`` never fails and is deterministic: the store calls it with the plan after
  the journal append, and replay calls it with the decoded record. Between a ``check_*`` and
  its ``apply_*`` no other mutation may run (the store holds its lock across both). Plans
  carry absolute times (``ready_at``, ``created_at``), so a replay rebuilds the same state.
- **Not journaled** (as in beanstalkd's binlog): reservations (``reserve``, ``reserve_job``,
  ``touch``, ``release_owner``, the expiry of a time-to-run), delays coming due, pauses and
  tube references. A job is reserved only from ready, so at replay a job that was reserved
  is ready (as a snapshot saves it), and ``apply_release``/``apply_bury``/``apply_kick``/
  ``apply_delete`` accept a job in any state they can meet there (a delayed one whose
  delay ran out live, for one).

Deadlines move jobs only in :meth:`JobMachine.advance`: call it with the current time before
the operations of a moment and after each mutation (it costs a comparison when nothing is
due: a delete that frees a waiting job whose delay has passed leaves it delayed and due), and
arm one timer at :meth:`JobMachine.next_deadline` to make expiry eager.

Structures: a dict of records by id; per tube a heap of ready jobs (beanstalkd's order:
priority, then id), each entry one int ``priority << 128 | id << 64 | seq`` (an int compares
in half the time of a tuple, and popping is what ``reserve`` pays for), a heap of
``(ready_at, id, seq)`` for delayed jobs and an insertion-ordered dict of buried ids (FIFO);
one heap of delayed jobs and one of reservations ``(deadline, id, seq)`` over every tube.
Heap entries are deleted lazily: an entry is valid only while its job's ``seq`` is the entry's
(a job starts at 0 and every state change adds 1, so an entry of an earlier state is stale),
and a heap is rebuilt once it holds more than about twice its valid entries.

Beside the jobs, two things a relay (a transactional outbox) needs: *marks*, per name the
position (an int) given with the last put that carried that name, and *remembered keys*,
per tube the keys put with ``remember=True`` and not yet forgotten, with the id each had: a
put with such a key stores nothing and returns that id, whether the job is live or done.

And *groups* (yoltq's job groups): a put may name a group of its tube; per group the machine
keeps its live jobs' ids and how many of its jobs were deleted (done), until the group is
forgotten, so :meth:`JobMachine.group_progress` costs the group's live jobs, not the tube's.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice
from typing import Any, NamedTuple, TypeGuard

from .._native._fast import JobMaker, JobRecord
from ._errors import DependencyError, InvalidJobError, JobNotFoundError

MAX_U32 = 2**32 - 1
"""The largest priority, delay, time-to-run and pause (seconds), as beanstalkd's u32."""
MAX_U64 = 2**64 - 1
"""The largest position of a mark."""
MAX_TUBE_NAME = 200
MAX_KEY_BYTES = 1024
MAX_ERROR_BYTES = 4096
ERRORS_KEPT = 16
"""Error texts kept per job, newest last."""
URGENT_BELOW = 1024
"""beanstalkd: a ready job with a priority below this counts as urgent."""
DEADLINE_MARGIN = 1.0
"""beanstalkd's safety margin: DEADLINE_SOON when a reservation ends within it (seconds)."""

_M64 = (1 << 64) - 1
_IDLE_TUBES_KEPT = 1024  # records of empty, unreferenced tubes kept for reuse (see _idle)
_FREED_PER_STEP = 4096  # heap entries freed per step by dismantle()
_TUBE_NAME = re.compile(r"[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()\-]{0,199}")


class JobState(StrEnum):
    """Where a job is. beanstalkd's four, and ``waiting``: its dependencies are not done."""

    READY = "ready"
    DELAYED = "delayed"
    RESERVED = "reserved"
    BURIED = "buried"
    WAITING = "waiting"


READY = JobState.READY
DELAYED = JobState.DELAYED
RESERVED = JobState.RESERVED
BURIED = JobState.BURIED
WAITING = JobState.WAITING
SNAPSHOT_STATES = (READY, DELAYED, BURIED, WAITING)
"""The states a snapshot holds, by their index there (a reserved job is saved ready)."""


@dataclass(frozen=True, slots=True)
class Job:
    """A job as it was when the call returned it (a copy: later changes do not show).

    ``delay`` is the delay (seconds) it was last put or released with; ``ready_at`` the
    wall-clock time it becomes ready (delayed, or waiting with a delay) or its reservation
    ends (reserved), else 0. ``depends_on`` are the ids it was put with; ``errors`` the
    failure texts given to release and bury, newest last, the last 16.
    """

    id: int
    tube: str
    priority: int
    body: bytes
    state: JobState
    ttr: float
    reserves: int
    timeouts: int
    releases: int
    buries: int
    kicks: int
    created_at: float
    key: str | None
    depends_on: tuple[int, ...]
    errors: tuple[str, ...]
    delay: float
    ready_at: float


_job = JobMaker(Job)
"""``_job(record)``: the :class:`Job` copy of a record that a call returns (built in C; the
dataclass's ``__init__`` sets each field through ``object.__setattr__``)."""


PutPlan = tuple[str, int, float, float, float, float, str | None, tuple[int, ...], bytes]
"""A checked put: (tube, priority, delay, ttr, ready_at, created_at, key, dep_ids, body), the
arguments of :func:`encode_put` and (after the id) of :meth:`JobMachine.apply_put`. A plain
tuple: building a NamedTuple goes through a slow ``tuple.__new__`` call per put."""


class ReleasePlan(NamedTuple):
    """A checked release: the arguments of ``encode_release`` and ``apply_release``."""

    id: int
    priority: int
    delay: float
    ready_at: float
    error: str | None


class BuryPlan(NamedTuple):
    """A checked bury: the arguments of ``encode_bury`` and ``apply_bury``."""

    id: int
    priority: int
    error: str | None


# --- argument checks (shared with the codec and the store) ---------------------------------


def check_tube(name: object) -> str:
    """``name`` if it is a valid tube name (beanstalkd's rules), else InvalidJobError."""
    if type(name) is str and _TUBE_NAME.fullmatch(name):
        return name
    raise InvalidJobError(
        f"tube name {name!r} is not valid",
        hint="use 1 to 200 of A-Z a-z 0-9 - + / ; . $ _ ( ), not starting with '-'",
    )


def check_priority(value: object) -> int:
    """``value`` if it is an int in 0 .. 2**32-1 (0 most urgent), else InvalidJobError."""
    if type(value) is int and 0 <= value <= MAX_U32:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_U32:
        return int(value)
    raise InvalidJobError(f"priority {value!r} is not valid", hint="use an int, 0 .. 2**32-1")


def check_seconds(value: object, what: str) -> float:
    """``value`` as a float if it is a number of seconds in 0 .. 2**32-1, else
    InvalidJobError (``what`` names the argument)."""
    if (type(value) is float or type(value) is int) and 0 <= value <= MAX_U32:
        return float(value)
    if (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 <= value <= MAX_U32):
        return float(value)
    raise InvalidJobError(f"{what} {value!r} is not valid",
                          hint="use seconds (int or float), 0 .. 2**32-1")


def _utf8_within(text: object, limit: int) -> TypeGuard[str]:
    """True when ``text`` is a str of at most ``limit`` UTF-8 bytes (lone surrogates fail)."""
    if type(text) is not str:
        return False
    try:
        return len(text.encode()) <= limit
    except UnicodeEncodeError:
        return False


def check_key(key: object) -> str:
    """``key`` if it is a str of at most 1024 UTF-8 bytes, else InvalidJobError."""
    if _utf8_within(key, MAX_KEY_BYTES):
        return key
    raise InvalidJobError(f"key {key!r:.80} is not valid",
                          hint="use a str of at most 1024 UTF-8 bytes (or None: no key)")


def _name(name: object, what: str, hint: str = "") -> str:
    """``name`` if it is a str of 1 to 1024 UTF-8 bytes, else InvalidJobError."""
    if _utf8_within(name, MAX_KEY_BYTES) and name:
        return name
    raise InvalidJobError(f"{what} {name!r:.80} is not valid",
                          hint="use a str of 1 to 1024 UTF-8 bytes" + hint)


def check_mark_name(name: object) -> str:
    """``name`` if it is a valid mark name (1 to 1024 UTF-8 bytes), else InvalidJobError."""
    return _name(name, "mark name")


def check_group(group: object) -> str:
    """``group`` if it is a valid job group name (1 to 1024 UTF-8 bytes), else
    InvalidJobError."""
    return _name(group, "group", " (or None: no group)")


def check_mark(mark: object) -> tuple[str, int]:
    """``mark`` if it is a ``(name, position)`` pair: a mark name and an int in
    0 .. 2**64-1; else InvalidJobError."""
    if isinstance(mark, tuple) and len(mark) == 2:
        name, position = mark
        if isinstance(position, int) and not isinstance(position, bool) and (
                0 <= position <= MAX_U64):
            return check_mark_name(name), int(position)
    raise InvalidJobError(f"mark {mark!r:.80} is not valid",
                          hint="use a (name, position) pair: a str and an int, 0 .. 2**64-1")


def check_keys(keys: object) -> list[str]:
    """``keys`` as a list if it is an iterable of valid keys (not one str), else
    InvalidJobError."""
    if isinstance(keys, str | bytes):
        raise InvalidJobError("keys is an iterable of keys",
                              hint=f"got a {type(keys).__name__}: wrap it in a list")
    try:
        items = list(keys)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidJobError("keys is an iterable of keys",
                              hint=f"got {type(keys).__name__}") from None
    return [check_key(key) for key in items]


def check_error(error: object) -> str | None:
    """``error`` if it is None or a str of at most 4096 UTF-8 bytes, else InvalidJobError."""
    if error is None or _utf8_within(error, MAX_ERROR_BYTES):
        return error
    raise InvalidJobError(f"error text {error!r:.80} is not valid",
                          hint="use None or a str of at most 4096 UTF-8 bytes")


def check_body(body: object) -> bytes:
    """``body`` as bytes if it is bytes-like (bytes, bytearray, memoryview...), else
    InvalidJobError (a str must be encoded first)."""
    if type(body) is bytes:
        return body
    if not isinstance(body, str):
        try:
            return memoryview(body).tobytes()  # type: ignore[arg-type]
        except TypeError:
            pass
    raise InvalidJobError(f"body of type {type(body).__name__} is not bytes-like",
                          hint="pass bytes (encode a str first)")


def _not_found(job_id: int) -> JobNotFoundError:
    return JobNotFoundError(
        f"job {job_id} not found",
        job_id=job_id,
        hint="it was deleted, never existed, or is reserved by another owner",
    )


def _with_error(errors: tuple[str, ...], error: str | None) -> tuple[str, ...]:
    if error is None:
        return errors
    return (*errors[1 - ERRORS_KEPT:], error) if len(errors) >= ERRORS_KEPT else (*errors, error)


# --- records -------------------------------------------------------------------------------


class _Tube:
    """A tube: its heaps, its buried list, its keys, its counts and counters."""

    __slots__ = (
        "buried", "delayed", "deletes", "jobs", "keys", "n_buried", "n_delayed", "n_ready",
        "n_reserved", "n_urgent", "n_waiting", "name", "pause", "pauses", "ready", "refs",
        "total_jobs", "unpause_at",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: list[int] = []  # priority << 128 | id << 64 | seq
        self.delayed: list[tuple[float, int, int]] = []  # (ready_at, id, seq)
        self.buried: dict[int, None] = {}  # ids, oldest buried first
        self.keys: dict[str, int] = {}  # key -> id of the live job that has it
        self.jobs = 0  # live jobs, every state
        self.n_ready = 0
        self.n_urgent = 0
        self.n_reserved = 0
        self.n_delayed = 0
        self.n_buried = 0
        self.n_waiting = 0
        self.refs = 0  # ref_tube() calls not yet undone (the server's use/watch)
        self.pause = 0.0  # seconds the tube was paused for, 0 when not paused
        self.unpause_at = 0.0  # 0 when not paused
        self.total_jobs = 0  # beanstalkd's counters, since the tube was made
        self.deletes = 0
        self.pauses = 0

    def live(self) -> bool:
        """beanstalkd keeps a tube while it has jobs or users; a pause keeps it here too."""
        return bool(self.jobs or self.refs or self.unpause_at)

    def reset(self) -> None:
        """Forget the counters of a tube that beanstalkd would have freed."""
        self.total_jobs = self.deletes = self.pauses = 0
        self.ready.clear()
        self.delayed.clear()
        self.keys.clear()


class _Group:
    """A job group: its live jobs and how many of its jobs were deleted."""

    __slots__ = ("done", "ids", "name", "tube")

    def __init__(self, tube: str, name: str) -> None:
        self.tube = tube
        self.name = name
        self.ids: dict[int, None] = {}  # live jobs, in put order
        self.done = 0


_Record = JobRecord
"""A live job, mutable (a C struct: made by one call, numbers inline, never walked by the
cycle collector). Built into a :class:`Job` only when a call
returns one. ``_Record(id, tube, priority, delay, ttr, ready_at, created_at, key,
depends_on, body, state)``; seq (+ 1 per state change: heap entries of an earlier state are
stale), pending (dependencies not yet deleted), the counters start at 0, errors at (),
owner at None."""


# --- the machine ---------------------------------------------------------------------------


class JobMachine:
    """Every live job in RAM, with beanstalkd's rules. See the module's docstring."""

    def __init__(self) -> None:
        self._jobs: dict[int, _Record] = {}
        self._tubes: dict[str, _Tube] = {}
        # Empty, unreferenced tubes whose record is kept for the next put (beanstalkd frees
        # them: they are hidden and their counters reset; dropped past _IDLE_TUBES_KEPT).
        self._idle: dict[str, None] = {}
        # Live tubes in beanstalkd's order (list-tubes): appended when made, a freed one's
        # place taken by the last (its ms_delete); _where maps a name to its index.
        self._order: list[str] = []
        self._where: dict[str, int] = {}
        self._paused: dict[str, _Tube] = {}
        self._delayed: list[tuple[float, int, int]] = []  # (ready_at, id, seq), every tube
        self._reserved: list[tuple[float, int, int]] = []  # (deadline, id, seq)
        self._owners: dict[Hashable, dict[int, None]] = {}  # owner -> ids it has reserved
        self._dependents: dict[int, list[int]] = {}  # id -> waiting ids that depend on it
        self._n_delayed = 0
        self._n_reserved = 0
        self._timeouts = 0
        self._total_jobs = 0
        self._loading: list[_Record] | None = None  # waiting jobs of a snapshot being loaded
        self._marks: dict[str, int] = {}  # mark name -> position of the last put with it
        # tube -> key -> id: the keys put with remember=True and not forgotten (the tube's
        # own keys dict holds live jobs' keys only, and goes with the tube)
        self._kept: dict[str, dict[str, int]] = {}
        self._groups: dict[tuple[str, str], _Group] = {}  # (tube, name) -> group
        self._grouped: dict[int, _Group] = {}  # id -> the group of a live job in one

    # --- tubes -----------------------------------------------------------------------------

    def _tube(self, name: str) -> _Tube:
        """The record of tube ``name`` (valid), made or revived as needed."""
        t = self._tubes.get(name)
        if t is None:
            t = self._tubes[name] = _Tube(name)
            self._list(name)
        elif self._idle and name in self._idle:
            del self._idle[name]
            self._list(name)
        return t

    def _list(self, name: str) -> None:
        if name == "default" and self._order:  # beanstalkd makes it first and keeps it
            self._order.insert(0, name)
            self._where = {n: i for i, n in enumerate(self._order)}
            return
        self._where[name] = len(self._order)
        self._order.append(name)

    def _unlist(self, name: str) -> None:
        order, where = self._order, self._where
        i = where.pop(name)
        last = order.pop()
        if i < len(order):
            order[i] = last
            where[last] = i

    def _settle(self, t: _Tube) -> None:
        """Hide ``t`` if beanstalkd would free it now (no jobs, no users, no pause)."""
        if t.live():
            return
        t.reset()
        self._unlist(t.name)
        self._idle[t.name] = None
        if len(self._idle) > _IDLE_TUBES_KEPT:
            for name in self._idle:
                del self._tubes[name]
            self._idle.clear()

    def _live_tube(self, name: str) -> _Tube | None:
        t = self._tubes.get(name)
        return t if t is not None and name not in self._idle else None

    def ref_tube(self, tube: str) -> None:
        """Count a user of ``tube`` (a connection's use or watch): the tube exists, with its
        counters, until every ref is undone and it has no jobs, as in beanstalkd."""
        self._tube(check_tube(tube)).refs += 1

    def unref_tube(self, tube: str) -> None:
        """Undo one :meth:`ref_tube`."""
        t = self._live_tube(tube)
        if t is None or t.refs == 0:
            raise InvalidJobError(f"tube {tube!r} has no ref to undo",
                                  hint="call unref_tube once per ref_tube")
        t.refs -= 1
        self._settle(t)

    def has_tube(self, tube: str) -> bool:
        """True when beanstalkd would know the tube: it has jobs, refs or a pause."""
        return self._live_tube(tube) is not None

    def tubes(self) -> list[str]:
        """The tubes that exist (jobs, refs or a pause), in beanstalkd's order: as made,
        except that a tube freed gives its place to the last one."""
        return list(self._order)

    def pause_tube(self, tube: str, seconds: float, now: float) -> None:
        """No reservations from ``tube`` until ``now + seconds`` (0 counts as 1, as in
        beanstalkd). Not journaled: a pause ends with the process."""
        seconds = check_seconds(seconds, "pause") or 1.0
        t = self._tube(check_tube(tube))
        t.pause = seconds
        t.unpause_at = now + seconds
        t.pauses += 1
        self._paused[t.name] = t

    # --- put -------------------------------------------------------------------------------

    def check_put(
        self, tube: str, body: bytes | bytearray | memoryview, priority: int, delay: float,
        ttr: float, key: str | None, depends_on: Iterable[int | tuple[str, str]], now: float,
    ) -> int | PutPlan:
        """Check a put. The id of the live job of ``tube`` that already has ``key``, or the
        id a remembered ``key`` had (store nothing), or the plan to journal and apply.
        ``depends_on``: job ids or ``(tube, key)`` pairs of live jobs (DependencyError
        otherwise). A ttr below 1 becomes 1."""
        t = self._tubes.get(tube)
        if t is None:
            check_tube(tube)
        # the checks' fast paths inline (a call each would cost a third of the put)
        if type(priority) is not int or not 0 <= priority <= MAX_U32:
            priority = check_priority(priority)
        kind = type(delay)
        if (kind is not float and kind is not int) or not 0 <= delay <= MAX_U32:
            delay = check_seconds(delay, "delay")
        kind = type(ttr)
        if (kind is not float and kind is not int) or not 0 <= ttr <= MAX_U32:
            ttr = check_seconds(ttr, "ttr")
        if type(body) is not bytes:
            body = check_body(body)
        if key is not None:
            key = check_key(key)
            if t is not None:
                found = t.keys.get(key)
                if found is not None:
                    return found
            if self._kept:
                kept = self._kept.get(tube)
                if kept is not None and key in kept:
                    return kept[key]
        dep_ids = self._resolve(depends_on) if depends_on else ()
        return (tube, priority, delay, ttr if ttr >= 1.0 else 1.0,
                now + delay if delay > 0.0 else 0.0, now, key, dep_ids, body)

    def _resolve(self, depends_on: Iterable[int | tuple[str, str]]) -> tuple[int, ...]:
        if isinstance(depends_on, str | bytes):
            raise InvalidJobError("depends_on is a sequence of job ids or (tube, key) pairs",
                                  hint=f"got a {type(depends_on).__name__}: wrap it in a list")
        ids: dict[int, None] = {}
        try:
            items = list(depends_on)
        except TypeError:
            raise InvalidJobError("depends_on is a sequence of job ids or (tube, key) pairs",
                                  hint=f"got {type(depends_on).__name__}") from None
        for dep in items:
            if isinstance(dep, int) and not isinstance(dep, bool):
                if dep not in self._jobs:
                    raise DependencyError(
                        f"depends_on: job {dep} does not exist",
                        hint="a dependency must be a live job; deleted jobs count as done")
                ids[int(dep)] = None
            elif isinstance(dep, tuple) and len(dep) == 2:
                tube, key = dep
                check_tube(tube)
                check_key(key)
                t = self._live_tube(tube)
                found = None if t is None else t.keys.get(key)
                if found is None:
                    raise DependencyError(
                        f"depends_on: no live job in tube {tube!r} has key {key!r}",
                        hint="a dependency must be a live job; deleted jobs count as done")
                ids[found] = None
            else:
                raise InvalidJobError(f"depends_on item {dep!r} is not valid",
                                      hint="use a job id (int) or a (tube, key) pair")
        return tuple(ids)

    def apply_put(self, job_id: int, plan: PutPlan) -> None:
        """Store a checked put as job ``job_id``: waiting if a dependency is live, else
        delayed if ``ready_at`` is set, else ready."""
        tube, priority, delay, ttr, ready_at, created_at, key, dep_ids, body = plan
        t = self._tubes.get(tube)
        if t is None or (self._idle and tube in self._idle):
            t = self._tube(tube)
        rec = _Record(job_id, t, priority, delay, ttr, ready_at, created_at, key, dep_ids,
                      body, READY)
        self._jobs[job_id] = rec
        t.jobs += 1
        t.total_jobs += 1
        self._total_jobs += 1
        if key is not None:
            t.keys[key] = job_id
        if dep_ids:
            jobs = self._jobs
            for dep in dep_ids:
                if dep in jobs and dep != job_id:
                    rec.pending += 1
                    self._dependents.setdefault(dep, []).append(job_id)
            if rec.pending:
                rec.state = WAITING
                t.n_waiting += 1
                return
        if ready_at > 0.0:
            self._enter_delayed(rec)
        else:  # (ready_at is 0.0: not delayed)
            t.n_ready += 1
            if priority < URGENT_BELOW:
                t.n_urgent += 1
            heap = t.ready
            heapq.heappush(heap, priority << 128 | job_id << 64)  # seq 0: a new job
            if len(heap) > 2 * t.n_ready + 64:
                self._compact_ready(heap)

    def apply_puts(
        self, puts: Iterable[tuple[int, str, int, float, float, float, float, bytes]],
    ) -> None:
        """:meth:`apply_put` for many puts without key or dependencies, given as (id, tube,
        priority, delay, ttr, ready_at, created_at, body): the same state, one call (replay
        at open is mostly such puts)."""
        jobs = self._jobs
        tubes = self._tubes
        push = heapq.heappush
        n = 0
        for job_id, tube, priority, delay, ttr, ready_at, created_at, body in puts:
            t = tubes.get(tube)
            if t is None or (self._idle and tube in self._idle):
                t = self._tube(tube)
            rec = _Record(job_id, t, priority, delay, ttr, ready_at, created_at, None, (),
                          body, READY)
            jobs[job_id] = rec
            t.jobs += 1
            t.total_jobs += 1
            n += 1
            if ready_at > 0.0:
                self._enter_delayed(rec)
                continue
            t.n_ready += 1
            if priority < URGENT_BELOW:
                t.n_urgent += 1
            heap = t.ready
            push(heap, priority << 128 | job_id << 64)
            if len(heap) > 2 * t.n_ready + 64:
                self._compact_ready(heap)
        self._total_jobs += n

    def check_extras(
        self, key: str | None, mark: object, remember: object, group: object = None,
    ) -> tuple[str, int] | None:
        """Check a put's ``mark`` (None, or ``(name, position)`` with a position not below
        the mark's), ``remember`` (a bool; True needs a ``key``) and ``group`` (None or a
        group name); InvalidJobError otherwise. Returns the checked mark."""
        if group is not None:
            check_group(group)
        if type(remember) is not bool:
            raise InvalidJobError(f"remember={remember!r:.80} is not valid",
                                  hint="use True or False")
        if remember and key is None:
            raise InvalidJobError("remember=True needs a key",
                                  hint="give the put a key (the one to remember)")
        if mark is None:
            return None
        name, position = check_mark(mark)
        last = self._marks.get(name)
        if last is not None and position < last:
            raise InvalidJobError(
                f"mark {name!r:.80} is at {last}: position {position} is behind it",
                hint="the positions of a mark only grow: read it with mark(name) and skip "
                     "what is at or below it")
        return name, position

    def apply_put_with(
        self, job_id: int, plan: PutPlan, mark: tuple[str, int] | None, remember: bool,
        group: str | None = None,
    ) -> None:
        """:meth:`apply_put`, then set ``mark``, with ``remember`` keep the job's key
        until :meth:`apply_forget`, and add the job to ``group`` (a put checked by
        :meth:`check_extras` too)."""
        self.apply_put(job_id, plan)
        if mark is not None:
            self._marks[mark[0]] = mark[1]
        key = plan[6]
        if remember and key is not None:  # (check_extras refuses remember without a key)
            self.apply_remember(plan[0], key, job_id)
        if group is not None:
            self.load_group(plan[0], group, 0, (job_id,))

    def apply_mark(self, name: str, position: int) -> None:
        """Set mark ``name`` to ``position`` (a put with a mark that stored nothing; a
        snapshot being loaded)."""
        self._marks[name] = position

    def mark(self, name: str) -> int | None:
        """The position of mark ``name`` (None: no put carried it)."""
        return self._marks.get(check_mark_name(name))

    def marks(self) -> dict[str, int]:
        """Every mark and its position."""
        return dict(self._marks)

    # --- remembered keys -------------------------------------------------------------------

    def check_forget(self, tube: str, keys: Iterable[str]) -> list[str]:
        """Check a forget: the remembered ``keys`` of ``tube`` among ``keys`` (each once),
        the ones to journal and apply; InvalidJobError for a bad tube name or key."""
        check_tube(tube)
        kept = self._kept.get(tube, {})
        return [key for key in dict.fromkeys(check_keys(keys)) if key in kept]

    def apply_forget(self, tube: str, keys: Iterable[str]) -> None:
        """Forget the remembered ``keys`` of ``tube`` (others are ignored): a key whose job
        is done is free again; a live job keeps its key until it is deleted."""
        kept = self._kept.get(tube)
        if kept is None:
            return
        for key in keys:
            kept.pop(key, None)
        if not kept:
            del self._kept[tube]

    def apply_remember(self, tube: str, key: str, job_id: int) -> None:
        """Remember ``key`` of ``tube`` as job ``job_id``'s (a snapshot being loaded)."""
        self._kept.setdefault(tube, {})[key] = job_id

    def remembered(self, tube: str, prefix: str = "") -> list[str]:
        """The remembered keys of ``tube`` that start with ``prefix``, sorted (their jobs
        live or done)."""
        check_tube(tube)
        if type(prefix) is not str:
            raise InvalidJobError(f"prefix {prefix!r:.80} is not valid", hint="use a str")
        return sorted(k for k in self._kept.get(tube, ()) if k.startswith(prefix))

    def find(self, tube: str, key: str) -> int | None:
        """The id of the live job of ``tube`` with ``key`` (None: no such live job)."""
        check_tube(tube)
        check_key(key)
        t = self._tubes.get(tube)
        return None if t is None else t.keys.get(key)

    def remembered_keys(self) -> dict[str, dict[str, int]]:
        """Every remembered key, per tube, with the id it had (the machine's own dicts:
        read them, do not change them)."""
        return self._kept

    # --- groups ----------------------------------------------------------------------------

    def load_group(self, tube: str, name: str, done: int, ids: Iterable[int]) -> None:
        """Add ``done`` deleted jobs and the live jobs ``ids`` to group ``name`` of ``tube``
        (a put in a group; a snapshot being loaded). Ids of jobs not live are ignored."""
        g = self._groups.get((tube, name))
        if g is None:
            g = self._groups[(tube, name)] = _Group(tube, name)
        g.done += done
        jobs, grouped = self._jobs, self._grouped
        for job_id in ids:
            if job_id in jobs and job_id not in grouped:
                g.ids[job_id] = None
                grouped[job_id] = g

    def group_progress(self, tube: str, name: str) -> dict[str, int]:
        """The live jobs of group ``name`` of ``tube`` per state, and ``done``: how many
        of its jobs were deleted since it was last forgotten (all 0 for an unknown group)."""
        check_tube(tube)
        g = self._groups.get((tube, check_group(name)))
        out = dict.fromkeys([s.value for s in JobState], 0)
        out["done"] = 0
        if g is None:
            return out
        jobs = self._jobs
        for job_id in g.ids:
            out[jobs[job_id].state] += 1
        out["done"] = g.done
        return out

    def groups(self, tube: str) -> list[str]:
        """The groups of ``tube`` (with live jobs, or done ones not forgotten), sorted."""
        check_tube(tube)
        return sorted(name for t, name in self._groups if t == tube)

    def check_forget_group(self, tube: str, name: str) -> bool:
        """Check a forget of a group: True when there is such a group (to journal and
        apply); InvalidJobError for a bad tube or group name."""
        check_tube(tube)
        return (tube, check_group(name)) in self._groups

    def apply_forget_group(self, tube: str, name: str) -> None:
        """Forget group ``name`` of ``tube``: its done count, and its live jobs' membership
        (they stay, in no group). No-op for an unknown group."""
        g = self._groups.pop((tube, name), None)
        if g is not None:
            for job_id in g.ids:
                del self._grouped[job_id]

    def group_records(self) -> list[tuple[str, str, int, list[int]]]:
        """Every group as ``(tube, name, done, live ids)`` (for a snapshot)."""
        return [(g.tube, g.name, g.done, list(g.ids)) for g in self._groups.values()]

    # --- state changes ---------------------------------------------------------------------

    def _leave(self, rec: _Record) -> None:
        """Take ``rec`` out of its state (counts, buried list, owner); its heap entries
        go stale with a new seq."""
        t = rec.tube
        state = rec.state
        if state is READY:
            t.n_ready -= 1
            if rec.priority < URGENT_BELOW:
                t.n_urgent -= 1
        elif state is RESERVED:
            t.n_reserved -= 1
            self._n_reserved -= 1
            self._disown(rec)
        elif state is DELAYED:
            t.n_delayed -= 1
            self._n_delayed -= 1
        elif state is BURIED:
            t.n_buried -= 1
            del t.buried[rec.id]
        else:
            t.n_waiting -= 1
        rec.seq += 1

    def _disown(self, rec: _Record) -> None:
        mine = self._owners[rec.owner]
        del mine[rec.id]
        if not mine:
            del self._owners[rec.owner]
        rec.owner = None

    def _enter_ready(self, rec: _Record) -> None:
        rec.state = READY
        rec.ready_at = 0.0
        t = rec.tube
        t.n_ready += 1
        if rec.priority < URGENT_BELOW:
            t.n_urgent += 1
        heap = t.ready
        heapq.heappush(heap, rec.priority << 128 | rec.id << 64 | rec.seq)
        if len(heap) > 2 * t.n_ready + 64:
            self._compact_ready(heap)

    def _enter_delayed(self, rec: _Record) -> None:
        rec.state = DELAYED
        t = rec.tube
        t.n_delayed += 1
        self._n_delayed += 1
        entry = (rec.ready_at, rec.id, rec.seq)
        heapq.heappush(t.delayed, entry)
        if len(t.delayed) > 2 * t.n_delayed + 64:
            self._compact(t.delayed)
        heapq.heappush(self._delayed, entry)
        if len(self._delayed) > 2 * self._n_delayed + 1024:
            self._compact(self._delayed)

    def _enter_buried(self, rec: _Record) -> None:
        rec.state = BURIED
        rec.ready_at = 0.0
        t = rec.tube
        t.n_buried += 1
        t.buried[rec.id] = None

    def _enter_reserved(self, rec: _Record, owner: Hashable, now: float) -> None:
        """Reserve ``rec`` (already out of its state) for ``owner`` until now + ttr."""
        seq = rec.seq = rec.seq + 1
        rec.state = RESERVED
        rec.owner = owner
        rec.reserves += 1
        deadline = rec.ready_at = now + rec.ttr
        rec.tube.n_reserved += 1
        self._n_reserved += 1
        heap = self._reserved
        heapq.heappush(heap, (deadline, rec.id, seq))
        if len(heap) > 2 * self._n_reserved + 1024:
            self._compact(heap)
        mine = self._owners.get(owner)
        if mine is None:
            self._owners[owner] = {rec.id: None}
        else:
            mine[rec.id] = None

    def _compact(self, heap: list[Any]) -> None:
        """Drop the stale entries of ``heap`` (amortized: it had grown to twice its valid
        entries since the last time)."""
        jobs = self._jobs
        heap[:] = [e for e in heap if (r := jobs.get(e[1])) is not None and r.seq == e[2]]
        heapq.heapify(heap)

    def _compact_ready(self, heap: list[int]) -> None:
        jobs = self._jobs
        heap[:] = [e for e in heap
                   if (r := jobs.get(e >> 64 & _M64)) is not None and r.seq == e & _M64]
        heapq.heapify(heap)

    def _top_ready(self, heap: list[int]) -> int | None:
        """The smallest valid entry of a ready heap (stale ones above it popped), or None."""
        jobs = self._jobs
        while heap:
            entry = heap[0]
            r = jobs.get(entry >> 64 & _M64)
            if r is not None and r.seq == entry & _M64:
                return entry
            heapq.heappop(heap)
        return None

    def _top(self, heap: list[Any]) -> Any:
        """The smallest valid entry of ``heap`` (stale ones above it popped), or None."""
        jobs = self._jobs
        while heap:
            entry = heap[0]
            r = jobs.get(entry[1])
            if r is not None and r.seq == entry[2]:
                return entry
            heapq.heappop(heap)
        return None

    # --- delete ----------------------------------------------------------------------------

    def check_delete(self, job_id: int, owner: Hashable = None) -> None:
        """JobNotFoundError unless job ``job_id`` is live and not reserved by another owner
        (``owner=None``: nobody's reservations)."""
        rec = self._jobs.get(job_id)
        if rec is None or (rec.state is RESERVED and rec.owner != owner):
            raise _not_found(job_id)

    def apply_delete(self, job_id: int) -> int:
        """Delete job ``job_id`` (any state; no-op if unknown), free its key, and count it
        done for the jobs waiting on it. Returns how many of those became ready."""
        rec = self._jobs.pop(job_id, None)
        if rec is None:
            return 0
        t = rec.tube
        state = rec.state
        if state is RESERVED:
            t.n_reserved -= 1
            self._n_reserved -= 1
            self._disown(rec)
        elif state is READY:
            t.n_ready -= 1
            if rec.priority < URGENT_BELOW:
                t.n_urgent -= 1
        else:
            self._leave(rec)
        t.jobs -= 1
        t.deletes += 1
        key = rec.key
        if key is not None and t.keys.get(key) == job_id:
            del t.keys[key]
        if self._grouped:
            g = self._grouped.pop(job_id, None)
            if g is not None:
                del g.ids[job_id]
                g.done += 1
        made = 0
        if self._dependents:
            waiting = self._dependents.pop(job_id, None)
            if waiting:
                made = self._resolved(waiting)
        if not t.jobs:
            self._settle(t)
        return made

    def has_dependents(self, job_id: int) -> bool:
        """True when a waiting job depends on job ``job_id`` (deleting it may free them)."""
        return job_id in self._dependents

    def _resolved(self, waiting: list[int]) -> int:
        made = 0
        for wid in waiting:
            w = self._jobs.get(wid)
            if w is None or w.state is not WAITING:
                continue
            w.pending -= 1
            if w.pending:
                continue
            self._leave(w)
            if w.ready_at > 0.0:
                self._enter_delayed(w)
            else:
                self._enter_ready(w)
                made += 1
        return made

    # --- release, bury, kick ---------------------------------------------------------------

    def _owned(self, job_id: int, owner: Hashable) -> _Record:
        rec = self._jobs.get(job_id)
        if rec is None or rec.state is not RESERVED or rec.owner != owner:
            raise _not_found(job_id)
        return rec

    def check_release(
        self, job_id: int, owner: Hashable, priority: int, delay: float, error: str | None,
        now: float,
    ) -> ReleasePlan:
        """Check a release of a job ``owner`` has reserved (else JobNotFoundError): back to
        ready, or delayed until ``now + delay``; ``error`` (if not None) is recorded."""
        self._owned(job_id, owner)
        priority = check_priority(priority)
        delay = check_seconds(delay, "delay")
        error = check_error(error)
        return ReleasePlan(job_id, priority, delay, now + delay if delay > 0.0 else 0.0, error)

    def apply_release(
        self, job_id: int, priority: int, delay: float, ready_at: float, error: str | None,
    ) -> None:
        """Release job ``job_id`` (reserved; at replay ready, delayed or buried too) with
        ``priority``: delayed until ``ready_at`` if set, else ready."""
        rec = self._jobs.get(job_id)
        if rec is None or rec.state is WAITING:
            return
        self._leave(rec)
        rec.priority = priority
        rec.delay = delay
        rec.releases += 1
        rec.errors = _with_error(rec.errors, error)
        if ready_at > 0.0:
            rec.ready_at = ready_at
            self._enter_delayed(rec)
        else:
            self._enter_ready(rec)

    def check_bury(
        self, job_id: int, owner: Hashable, priority: int, error: str | None,
    ) -> BuryPlan:
        """Check a bury of a job ``owner`` has reserved (else JobNotFoundError)."""
        self._owned(job_id, owner)
        return BuryPlan(job_id, check_priority(priority), check_error(error))

    def apply_bury(self, job_id: int, priority: int, error: str | None) -> None:
        """Bury job ``job_id`` (reserved; at replay ready, delayed or buried too) at the
        end of its tube's buried list."""
        rec = self._jobs.get(job_id)
        if rec is None or rec.state is WAITING:
            return
        self._leave(rec)
        rec.priority = priority
        rec.buries += 1
        rec.errors = _with_error(rec.errors, error)
        self._enter_buried(rec)

    def plan_kick(self, tube: str, bound: int) -> list[int]:
        """The ids ``kick`` moves to ready, in order: up to ``bound`` buried jobs of
        ``tube``, oldest buried first; if it has none, up to ``bound`` delayed jobs, soonest
        first (beanstalkd). Journal and apply each with :meth:`apply_kick`."""
        check_tube(tube)
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
            raise InvalidJobError(f"kick bound {bound!r} is not valid", hint="use an int >= 0")
        t = self._live_tube(tube)
        if t is None or not bound:
            return []
        if t.n_buried:
            return list(islice(t.buried, bound))
        if not t.n_delayed:
            return []
        jobs = self._jobs
        valid = (e for e in t.delayed if (r := jobs.get(e[1])) is not None and r.seq == e[2])
        return [e[1] for e in heapq.nsmallest(bound, valid)]

    def check_kick_job(self, job_id: int) -> None:
        """JobNotFoundError unless job ``job_id`` is buried or delayed."""
        rec = self._jobs.get(job_id)
        if rec is None or (rec.state is not BURIED and rec.state is not DELAYED):
            raise _not_found(job_id)

    def apply_kick(self, job_id: int) -> None:
        """Move job ``job_id`` from buried or delayed to ready (else no-op)."""
        rec = self._jobs.get(job_id)
        if rec is None or (rec.state is not BURIED and rec.state is not DELAYED):
            return
        self._leave(rec)
        rec.kicks += 1
        self._enter_ready(rec)

    # --- reservations (not journaled) ------------------------------------------------------

    def reserve(self, owner: Hashable, tubes: Iterable[str], now: float) -> Job | None:
        """Reserve for ``owner`` the ready job of smallest (priority, id) among the
        unpaused ``tubes``, until ``now + ttr``; None if there is none."""
        if isinstance(tubes, str):
            raise InvalidJobError(f"tubes={tubes!r} is one name", hint=f"pass ({tubes!r},)")
        jobs = self._jobs
        best = None
        best_tube = None
        for name in tubes:
            t = self._tubes.get(name)
            if t is None:
                check_tube(name)
                continue
            if not t.n_ready or t.unpause_at > now:
                continue
            heap = t.ready
            entry = heap[0]
            r = jobs.get(entry >> 64 & _M64)
            while r is None or r.seq != entry & _M64:
                heapq.heappop(heap)
                entry = heap[0]
                r = jobs.get(entry >> 64 & _M64)
            if best is None or entry < best:
                best = entry
                best_tube = t
        if best_tube is None or best is None:
            return None
        heapq.heappop(best_tube.ready)
        rec = jobs[best >> 64 & _M64]
        best_tube.n_ready -= 1
        if rec.priority < URGENT_BELOW:
            best_tube.n_urgent -= 1
        self._enter_reserved(rec, owner, now)
        return _job(rec)

    def check_reserve_job(self, job_id: int) -> bool:
        """Check beanstalkd's reserve-job: JobNotFoundError unless job ``job_id`` is ready,
        delayed or buried. True when it is delayed or buried: then journal a READY record
        and :meth:`apply_ready` before :meth:`reserve_job`, so that the job is ready after a
        restart whether the store reopens from a snapshot or from the journal."""
        rec = self._jobs.get(job_id)
        if rec is None or rec.state is RESERVED or rec.state is WAITING:
            raise _not_found(job_id)
        return rec.state is not READY

    def apply_ready(self, job_id: int) -> None:
        """Move job ``job_id`` from delayed or buried to ready, counting nothing (the first
        half of reserve-job; no-op in any other state)."""
        rec = self._jobs.get(job_id)
        if rec is not None and (rec.state is BURIED or rec.state is DELAYED):
            self._leave(rec)
            self._enter_ready(rec)

    def reserve_job(self, job_id: int, owner: Hashable, now: float) -> Job:
        """Reserve the ready job ``job_id`` for ``owner`` (beanstalkd's reserve-job, after
        :meth:`check_reserve_job`), else JobNotFoundError."""
        rec = self._jobs.get(job_id)
        if rec is None or rec.state is not READY:
            raise _not_found(job_id)
        self._leave(rec)
        self._enter_reserved(rec, owner, now)
        return _job(rec)

    def touch(self, job_id: int, owner: Hashable, now: float) -> None:
        """Give ``owner``'s reservation of job ``job_id`` a full ttr again from ``now``."""
        rec = self._owned(job_id, owner)
        seq = rec.seq = rec.seq + 1
        deadline = rec.ready_at = now + rec.ttr
        heap = self._reserved
        heapq.heappush(heap, (deadline, job_id, seq))
        if len(heap) > 2 * self._n_reserved + 1024:
            self._compact(heap)

    def release_owner(self, owner: Hashable) -> int:
        """Every reservation of ``owner`` back to ready at once (its connection closed, its
        handle was closed). Returns how many."""
        mine = self._owners.pop(owner, None)
        if not mine:
            return 0
        for job_id in mine:
            rec = self._jobs[job_id]
            rec.owner = None
            rec.tube.n_reserved -= 1
            self._n_reserved -= 1
            rec.seq += 1
            self._enter_ready(rec)
        return len(mine)

    def deadline_soon(self, owner: Hashable, now: float) -> bool:
        """beanstalkd's DEADLINE_SOON: a reservation of ``owner`` ends within 1 s."""
        mine = self._owners.get(owner)
        if not mine:
            return False
        jobs = self._jobs
        return min(jobs[i].ready_at for i in mine) - DEADLINE_MARGIN <= now

    def soonest_end(self, owner: Hashable) -> float | None:
        """When the first of ``owner``'s reservations runs out (None: it has none)."""
        mine = self._owners.get(owner)
        if not mine:
            return None
        jobs = self._jobs
        return min(jobs[i].ready_at for i in mine)

    def reserved_by(self, owner: Hashable) -> list[int]:
        """The ids ``owner`` has reserved, in the order it reserved them."""
        return list(self._owners.get(owner, ()))

    # --- time ------------------------------------------------------------------------------

    def advance(self, now: float) -> int:
        """Apply the deadlines up to ``now``: delayed jobs due become ready, reservations
        past their ttr become ready (timeouts + 1), pauses over end. Returns how many jobs
        became reservable (the ready jobs of an unpaused tube count), to wake reservers."""
        made = 0
        jobs = self._jobs
        heap = self._delayed
        while heap and heap[0][0] <= now:
            _, job_id, seq = heapq.heappop(heap)
            rec = jobs.get(job_id)
            if rec is not None and rec.seq == seq:
                self._leave(rec)
                self._enter_ready(rec)
                made += 1
        heap = self._reserved
        while heap and heap[0][0] <= now:
            _, job_id, seq = heapq.heappop(heap)
            rec = jobs.get(job_id)
            if rec is not None and rec.seq == seq:
                self._leave(rec)
                rec.timeouts += 1
                self._timeouts += 1
                self._enter_ready(rec)
                made += 1
        if self._paused:
            for t in [t for t in self._paused.values() if t.unpause_at <= now]:
                del self._paused[t.name]
                t.pause = t.unpause_at = 0.0
                made += t.n_ready
                self._settle(t)
        return made

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`advance` has something to do (a delayed job due, a
        reservation ending, a pause ending), or None: arm one timer for it."""
        times = []
        for heap in (self._delayed, self._reserved):
            top = self._top(heap)
            if top is not None:
                times.append(top[0])
        times.extend(t.unpause_at for t in self._paused.values())
        return min(times, default=None)

    # --- reads -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Live jobs."""
        return len(self._jobs)

    def highest_id(self) -> int:
        """The largest id of a live job (0: none)."""
        return max(self._jobs, default=0)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def peek(self, job_id: int) -> Job | None:
        """Job ``job_id``, or None if no live job has that id."""
        rec = self._jobs.get(job_id)
        return None if rec is None else _job(rec)

    def peek_ready(self, tube: str) -> Job | None:
        """The job ``reserve`` would take next from ``tube`` (a pause does not matter)."""
        t = self._live_tube(check_tube(tube))
        top = None if t is None or not t.n_ready else self._top_ready(t.ready)
        return None if top is None else _job(self._jobs[top >> 64 & _M64])

    def peek_delayed(self, tube: str) -> Job | None:
        """The delayed job of ``tube`` that is due first."""
        t = self._live_tube(check_tube(tube))
        top = None if t is None or not t.n_delayed else self._top(t.delayed)
        return None if top is None else _job(self._jobs[top[1]])

    def peek_buried(self, tube: str) -> Job | None:
        """The job of ``tube`` buried longest ago (the next ``kick`` takes)."""
        t = self._live_tube(check_tube(tube))
        if t is None or not t.n_buried:
            return None
        return _job(self._jobs[next(iter(t.buried))])

    def errors(self, tube: str) -> list[Job]:
        """The buried jobs of ``tube``, oldest buried first, with their error texts."""
        t = self._live_tube(check_tube(tube))
        return [] if t is None else [_job(self._jobs[i]) for i in t.buried]

    def jobs(self) -> Iterator[Job]:
        """Every live job: those not buried in id order of put, then the buried ones tube
        by tube in burial order (the order a snapshot keeps)."""
        for rec in self._jobs.values():
            if rec.state is not BURIED:
                yield _job(rec)
        for t in self._tubes.values():
            for job_id in t.buried:
                yield _job(self._jobs[job_id])

    def counts(self, tube: str) -> dict[JobState, int]:
        """Jobs of ``tube`` per state (for metrics)."""
        t = self._live_tube(check_tube(tube))
        if t is None:
            return dict.fromkeys(JobState, 0)
        return {READY: t.n_ready, DELAYED: t.n_delayed, RESERVED: t.n_reserved,
                BURIED: t.n_buried, WAITING: t.n_waiting}

    def oldest_ready_created_at(self, tube: str) -> float | None:
        """``created_at`` of the oldest ready job of ``tube`` (for a queue-age metric).
        Scans the tube's ready jobs: call it at scrape rate, not per operation."""
        t = self._live_tube(check_tube(tube))
        if t is None or not t.n_ready:
            return None
        jobs = self._jobs
        return min(r.created_at for e in t.ready
                   if (r := jobs.get(e >> 64 & _M64)) is not None and r.seq == e & _M64)

    def job_stats(self, job_id: int, now: float) -> dict[str, int | str]:
        """beanstalkd 1.12's stats-job fields, in its order (STATS_JOB_FMT); times in whole
        seconds as beanstalkd truncates them. ``file`` (the binlog file) is always 0 here.
        A waiting job says ``state: waiting``. JobNotFoundError if not live."""
        rec = self._jobs.get(job_id)
        if rec is None:
            raise _not_found(job_id)
        state = rec.state
        timed = state is RESERVED or state is DELAYED
        return {
            "id": rec.id,
            "tube": rec.tube.name,
            "state": state.value,
            "pri": rec.priority,
            "age": int(now - rec.created_at),
            "delay": int(rec.delay),
            "ttr": int(rec.ttr),
            "time-left": int(rec.ready_at - now) if timed else 0,
            "file": 0,
            "reserves": rec.reserves,
            "timeouts": rec.timeouts,
            "releases": rec.releases,
            "buries": rec.buries,
            "kicks": rec.kicks,
        }

    def tube_stats(self, tube: str, now: float) -> dict[str, int | str]:
        """beanstalkd 1.12's stats-tube fields, in its order (STATS_TUBE_FMT), zeros for a
        tube that does not exist (:meth:`has_tube` tells). ``current-using``,
        ``current-watching`` and ``current-waiting`` are connections: 0 here, for the
        server to overwrite in place."""
        t = self._live_tube(check_tube(tube))
        if t is None:
            t = _Tube(tube)
        paused = t.unpause_at > 0.0
        return {
            "name": t.name,
            "current-jobs-urgent": t.n_urgent,
            "current-jobs-ready": t.n_ready,
            "current-jobs-reserved": t.n_reserved,
            "current-jobs-delayed": t.n_delayed,
            "current-jobs-buried": t.n_buried,
            "total-jobs": t.total_jobs,
            "current-using": 0,
            "current-watching": 0,
            "current-waiting": 0,
            "cmd-delete": t.deletes,
            "cmd-pause-tube": t.pauses,
            "pause": int(t.pause) if paused else 0,
            "pause-time-left": int(t.unpause_at - now) if paused else 0,
        }

    def stats(self, now: float) -> dict[str, int]:
        """The job part of beanstalkd 1.12's stats (STATS_FMT), in its relative order:
        current-jobs-{urgent,ready,reserved,delayed,buried}, job-timeouts, total-jobs,
        current-tubes. Every other field (cmd-*, connections, pid, binlog-*...) is the
        server's. Waiting jobs are in no beanstalkd count (see :meth:`counts`)."""
        live = [t for t in self._tubes.values() if t.name not in self._idle]
        return {
            "current-jobs-urgent": sum(t.n_urgent for t in live),
            "current-jobs-ready": sum(t.n_ready for t in live),
            "current-jobs-reserved": self._n_reserved,
            "current-jobs-delayed": self._n_delayed,
            "current-jobs-buried": sum(t.n_buried for t in live),
            "job-timeouts": self._timeouts,
            "total-jobs": self._total_jobs,
            "current-tubes": len(live),
        }

    def reset_counters(self) -> None:
        """Zero the counters beanstalkd keeps since its start (total-jobs, job-timeouts,
        cmd-delete, cmd-pause-tube): the store calls it after replaying its journal."""
        self._timeouts = self._total_jobs = 0
        for t in self._tubes.values():
            t.total_jobs = t.deletes = t.pauses = 0

    def dismantle(self) -> None:
        """Free every job, one record (a heap's few thousand entries) per step: a machine
        dropped whole frees all of them in one call, holding the GIL, and so every other
        thread of the process, for tens of milliseconds per million jobs. The machine is
        unusable afterwards: drop it."""
        jobs = self._jobs
        pop = jobs.popitem
        for _ in range(len(jobs)):  # one record (and its body) freed per step
            pop()
        lists: list[list[Any]] = [t.ready for t in self._tubes.values()]
        lists += [t.delayed for t in self._tubes.values()]
        lists += [self._delayed, self._reserved]
        for items in lists:
            while items:
                del items[-_FREED_PER_STEP:]
        dependents = self._dependents
        for _ in range(len(dependents)):
            dependents.popitem()
        for kept in self._kept.values():
            for _ in range(len(kept)):
                kept.popitem()

    # --- loading a snapshot ----------------------------------------------------------------

    def load_jobs(
        self, rows: Iterable[tuple[Any, ...]], tubes: list[str], bodies: Iterable[bytes],
    ) -> None:
        """Add the jobs read from a snapshot, into a new machine; buried ones in burial
        order. Each row is the snapshot's fixed part of a job: (id, tube index in ``tubes``,
        state index in :data:`SNAPSHOT_STATES`, priority, delay, ttr, ready_at, created_at,
        reserves, timeouts, releases, buries, kicks); ``bodies`` are in the same order. Then
        :meth:`load_extra` for jobs with a key, dependencies or errors, and
        :meth:`finish_load`. (One loop here, not a call per job: loading a million jobs is
        a second.)"""
        known = self._tubes
        by_index = [known.get(name) or known.setdefault(name, _Tube(name)) for name in tubes]
        jobs = self._jobs
        delayed = self._delayed
        waiting = self._loading if self._loading is not None else []
        for row, body in zip(rows, bodies, strict=True):
            (job_id, tube, state, priority, delay, ttr, ready_at, created_at, reserves,
             timeouts, releases, buries, kicks) = row
            t = by_index[tube]
            rec = _Record(job_id, t, priority, delay, ttr, ready_at, created_at, None, (),
                          body, READY)
            if reserves:
                rec.reserves = reserves
            if timeouts:
                rec.timeouts = timeouts
            if releases:
                rec.releases = releases
            if buries:
                rec.buries = buries
            if kicks:
                rec.kicks = kicks
            jobs[job_id] = rec
            t.jobs += 1
            if state == 0:
                rec.ready_at = 0.0
                t.ready.append(priority << 128 | job_id << 64)
                t.n_ready += 1
                if priority < URGENT_BELOW:
                    t.n_urgent += 1
            elif state == 1:
                rec.state = DELAYED
                entry = (ready_at, job_id, 0)
                t.delayed.append(entry)
                delayed.append(entry)
                t.n_delayed += 1
                self._n_delayed += 1
            elif state == 2:
                rec.state = BURIED
                rec.ready_at = 0.0
                t.buried[job_id] = None
                t.n_buried += 1
            else:
                rec.state = WAITING
                t.n_waiting += 1
                waiting.append(rec)
        self._loading = waiting

    def load_extra(
        self, job_id: int, key: str | None, depends_on: tuple[int, ...],
        errors: tuple[str, ...],
    ) -> None:
        """Give a job added by :meth:`load_jobs` its key, dependencies and error texts."""
        rec = self._jobs[job_id]
        rec.key = key
        rec.depends_on = depends_on
        rec.errors = errors
        if key is not None:
            rec.tube.keys[key] = job_id

    def finish_load(self) -> None:
        """Build the heaps and the dependency index after :meth:`load_jobs`."""
        for t in list(self._tubes.values()):
            if not t.jobs:  # a tube of the snapshot's table without jobs
                del self._tubes[t.name]
                continue
            heapq.heapify(t.ready)
            heapq.heapify(t.delayed)
        heapq.heapify(self._delayed)
        self._order = sorted((name for name in self._tubes if name not in self._idle),
                             key=lambda name: name != "default")  # default first (_list)
        self._where = {name: i for i, name in enumerate(self._order)}
        waiting, self._loading = self._loading or [], None
        jobs = self._jobs
        for rec in waiting:
            for dep in rec.depends_on:
                if dep in jobs and dep != rec.id:
                    rec.pending += 1
                    self._dependents.setdefault(dep, []).append(rec.id)
            if not rec.pending:  # cannot happen in a snapshot this machine wrote
                self._leave(rec)
                if rec.ready_at > 0.0:
                    self._enter_delayed(rec)
                else:
                    self._enter_ready(rec)
