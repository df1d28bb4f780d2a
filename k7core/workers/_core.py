"""The worker's logic that both faces share (threads in ``_worker``, tasks in
``k7async.workers``): consumers by tube, payloads to bodies and back, context capture, the
failure policy, figures and health. No I/O here: the faces reserve, run, and do what this
decides.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar, cast

from .._errors import ClosedError, K7Error
from ..jobs import JobNotFoundError
from ._codec import MAGIC, Codec, PayloadError, codec, encode_body, unpack
from ._monitor import Monitor, Suspects
from ._policy import (
    Action,
    Backoff,
    Bury,
    Defer,
    Delete,
    Gates,
    Options,
    Retry,
    after_failure,
    error_text,
    failures,
)
from ._source import Deps, JobView

log = logging.getLogger("k7core.workers")
HEALTH_LIMIT = 100
"""Buried jobs per tube a health check looks at (the oldest buried), and remembered failing
jobs it asks the store about (the oldest)."""
MIN_TTR = 1.0
"""The shortest time-to-run (beanstalkd's and the job store's: a shorter one becomes 1 s);
a running job whose ttr is not known yet is touched as if it had this one."""
STOPS = (SystemExit, KeyboardInterrupt)
"""What a consumer raises to stop its worker (not a failure of the job): the job is released,
ready again at once, the worker stops and raises it from ``join``, ``stop`` or ``close``
(``Worker``), or from the ``async with`` (``AsyncWorker``). Any other exception, even a
BaseException, is a failure of the job."""
WATCH_TICK = 0.25
"""Longest sleep of the watch (seconds): below a third of MIN_TTR, so that a job that just
began is touched in time."""
_NO_CONTEXT: dict[ContextVar[Any], Any] = {}
_NOTHING = nullcontext()
DELETE = Delete()

F = TypeVar("F", bound=Callable[..., Any])


class OptionsDict(TypedDict, total=False):
    """The keyword arguments of :class:`Options`, for ``consumer(...)`` and the workers."""

    concurrency: int
    max_retries: int
    backoff: Backoff
    valid_payload: Callable[[Any], object] | None
    already_done: tuple[type[BaseException], ...]
    codec: Codec | str
    context: Sequence[ContextVar[Any]]
    priority: int
    ttr: float
    max_execute_time: float
    depends_on: Callable[[Any], Sequence[int | tuple[str, str]]] | None


def make_options(base: Options, overrides: OptionsDict) -> Options:
    """``base`` with ``overrides`` (a codec may be named; context may be any sequence)."""
    fields: dict[str, Any] = dict(overrides)
    if "codec" in fields:
        fields["codec"] = codec(fields["codec"])
    if "context" in fields:
        fields["context"] = tuple(fields["context"])
    try:
        return dataclasses.replace(base, **fields)
    except TypeError as exc:
        raise K7Error(f"not a worker option: {exc}",
                      hint=f"use {', '.join(f.name for f in dataclasses.fields(Options))}"
                      ) from exc


class NoJobError(K7Error):
    """``consume`` found no ready job in the tube (test mode: put one, or move the clock
    past its delay)."""


@dataclass
class Consumer(Generic[F]):
    """A tube's consumer and its options."""

    tube: str
    fn: F
    options: Options


class Run(NamedTuple):
    """A job to run: its payload, and the context to set around the consumer."""

    payload: Any
    context: dict[ContextVar[Any], Any]


_new_run = cast(Callable[[type[Run], tuple[Any, Any]], Run], tuple.__new__)
"""``tuple.__new__``: a Run without the NamedTuple's Python-level ``__new__`` (per job)."""


Handled = tuple[Action, "Run | None", Any, "BaseException | None"]
"""What a face did with a job: the action, the run (None: it did not run), the consumer's
result and its exception."""


class FailedJob(NamedTuple):
    """A buried job: its payload (decoded; the raw body if that fails) and its failures."""

    id: int
    tube: str
    payload: Any
    errors: tuple[str, ...]
    """Failure texts with their tracebacks, newest last."""
    created_at: float


@dataclass(slots=True)
class Running:
    """A job a consumer is running, for touches and the slow-job watch."""

    job: JobView
    options: Options
    started: float
    touched: float
    every: float
    """Seconds between its touches: a third of the job's own ttr."""
    where: object
    """What runs it (a thread id, a task): the face turns it into a stack."""
    logged: bool = False


def touch_every(ttr: float) -> float:
    """Seconds between touches of a running job whose time-to-run is ``ttr`` (0: not
    known yet): a third of it, so the ttr measures a live worker, not the job's length."""
    return max(ttr, MIN_TTR) / 3


RECORD_WAIT = (0.1, 1.0)
"""Seconds between tries to record a run's outcome the source refused (a full disk): the
first wait, doubling up to the second (and never more than a third of the job's ttr)."""


def may_retry_record(exc: BaseException) -> bool:
    """Whether recording an outcome that failed with ``exc`` is worth trying again: the
    source refused to record it (StorageError...), not the job or the source being gone."""
    return isinstance(exc, K7Error) and not isinstance(
        exc, (JobNotFoundError, ClosedError, ConnectionError))


class Recorder:
    """The rule after recording ``action`` for a job that ran failed with ``error``: the job
    is not run again. It stays reserved (the face touches it: a touch writes nothing) and the
    face tries the action again after each :meth:`wait`, until it is recorded or the worker
    stops (then ``error`` is raised and the job is released with its session). One WARNING
    at the first failure, one INFO when recorded. Raises ``error`` at once if
    ``may_retry_record`` refuses it."""

    def __init__(self, job: JobView, action: Action, error: Exception) -> None:
        if not may_retry_record(error):
            raise error
        self.job, self.error = job, error
        self._what = type(action).__name__.lower()
        self._wait, self._tries = RECORD_WAIT[0], 1
        log.warning("job %d of tube %r ran, but its %s could not be recorded (%s); it stays "
                    "reserved and the %s is tried again until it is recorded", job.id,
                    job.tube, self._what, error, self._what)

    def wait(self, ttr: float) -> float:
        """Seconds to wait before the next try, given the job's ttr its touch returned."""
        return min(self._wait, touch_every(ttr))

    def failed(self, exc: Exception) -> None:
        """The try failed with ``exc``: raises it if it is not worth another."""
        if not may_retry_record(exc):
            raise exc
        self.error, self._tries = exc, self._tries + 1
        self._wait = min(2 * self._wait, RECORD_WAIT[1])

    def recorded(self, new_id: int) -> int:
        """The try worked; returns ``new_id``."""
        log.info("job %d of tube %r: its %s is recorded (after %d failed tries)",
                 self.job.id, self.job.tube, self._what, self._tries)
        return new_id


class Core(Generic[F]):
    """Consumers, policy and figures of one worker (sync or async: ``F`` is the consumer
    type). Thread-safe."""

    def __init__(self, defaults: Options, *, clock: Callable[[], float] = time.time,
                 rand: Callable[[], float] = random.random, monitor: Monitor | None = None
                 ) -> None:
        self.defaults = defaults
        self.clock = clock
        self.rand = rand
        self.consumers: dict[str, Consumer[F]] = {}
        self.monitor = monitor or Monitor()
        self.monitor.started = clock()
        self.gates = Gates()
        self.running: dict[int, Running] = {}
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._last: dict[str, Run] = {}

    # --- registration and puts --------------------------------------------------------

    def register(self, tube: str, fn: F, overrides: OptionsDict) -> Consumer[F]:
        if not callable(fn):
            raise K7Error(f"the consumer of tube {tube!r} is not callable")
        if tube in self.consumers:
            raise K7Error(f"tube {tube!r} has a consumer already",
                          hint="one consumer per tube; raise its concurrency instead")
        consumer = Consumer(tube, fn, make_options(self.defaults, overrides))
        self.consumers[tube] = consumer
        return consumer

    def options(self, tube: str) -> Options:
        consumer = self.consumers.get(tube)
        return self.defaults if consumer is None else consumer.options

    def put_args(self, tube: str, payload: Any, priority: int | None, delay: float,
                 ttr: float | None, key: str | None, depends_on: Deps | None,
                 group: str | None = None) -> tuple[bytes, dict[str, Any]]:
        """The body and the keyword arguments of a source's put."""
        o = self.options(tube)
        body = encode_body(o.codec, o.context, payload, tube)
        if depends_on is None:
            depends_on = o.depends_on(payload) if o.depends_on is not None else ()
        return body, {
            "tube": tube, "priority": o.priority if priority is None else priority,
            "delay": delay, "ttr": o.ttr if ttr is None else ttr, "key": key,
            "depends_on": tuple(depends_on), "group": group,
        }

    # --- running a job ----------------------------------------------------------------

    def start(self, job: JobView, *, gated: bool = True) -> Run | Bury | Defer:
        """Decode ``job``; Bury if it cannot be decoded or fails ``valid_payload``; Defer if
        it failed before and the tube's gate is closed (``gated``)."""
        consumer = self.consumers.get(job.tube)
        o = self.defaults if consumer is None else consumer.options
        if gated and job.errors:
            with self._lock:
                wait = self.gates.wait(job.tube, job.errors, self.clock())
                if wait > 0:
                    self.monitor.deferred(job.tube)
                    return Defer(wait)
        body = job.body
        context = _NO_CONTEXT
        try:
            if body.startswith(MAGIC):  # an envelope: context (or errors) with the payload
                envelope = unpack(body)
                payload = o.codec.decode(envelope.payload)
                if envelope.context:
                    context = {var: envelope.context[var.name] for var in o.context
                               if var.name in envelope.context}
            else:  # the body is the payload (most jobs)
                payload = o.codec.decode(body)
        except Exception as exc:
            return self._invalid(job, exc)
        if o.valid_payload is not None:
            try:
                valid = o.valid_payload(payload)
            except Exception as exc:
                return self._invalid(job, exc)
            if not valid:
                return self._invalid(job, PayloadError("valid_payload rejected the payload"))
        return _new_run(Run, (payload, context))

    def _invalid(self, job: JobView, exc: BaseException) -> Bury:
        text = error_text(failures(job.errors) + 1, exc)
        log.error("job %d of tube %r buried: invalid payload: %s", job.id, job.tube,
                  text.splitlines()[0])
        return Bury(text)

    def context(self, run: Run) -> AbstractContextManager[None]:
        """The job's context variables set (around its consumer and the worker's log
        lines about it), and reset after."""
        return self._context(run) if run.context else _NOTHING

    @contextmanager
    def _context(self, run: Run) -> Iterator[None]:
        tokens = [(var, var.set(value)) for var, value in run.context.items()]
        try:
            yield
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    def begin(self, job: JobView, where: object) -> int:
        """Note that ``job`` runs (for touches and the slow-job watch); returns a handle
        for :meth:`end`."""
        now = self.clock()
        handle = next(self._keys)
        consumer = self.consumers.get(job.tube)
        # one dict item set or popped: atomic, no lock (due() copies the values at once)
        self.running[handle] = Running(job, self.defaults if consumer is None
                                       else consumer.options, now, now,
                                       touch_every(job.ttr), where)
        return handle

    def end(self, handle: int) -> float:
        """The run of :meth:`begin` is over; returns how long it took."""
        return self.clock() - self.running.pop(handle).started

    def finish(self, job: JobView, exc: BaseException | None, *, bury: bool = False
               ) -> Delete | Retry | Bury:
        """What to do after the consumer returned (``exc`` None) or raised ``exc``
        (``bury``: a failure buries the job whatever its retries)."""
        if exc is None:
            return DELETE
        o = self.options(job.tube)
        if isinstance(exc, o.already_done):
            return DELETE
        action = after_failure(o, job.errors, exc, self.rand())
        if bury:
            action = Bury(action.error)
        first = action.error.splitlines()[0]
        with self._lock:
            self.gates.failed(job.tube, self.clock(), o)
        if isinstance(action, Bury):
            log.error("job %d of tube %r buried after %d failures: %s", job.id, job.tube,
                      failures(job.errors) + 1, first)
        else:
            log.warning("job %d of tube %r failed, retry in %.1f s: %s", job.id, job.tube,
                        action.delay, first)
        return action

    def done(self, job: JobView, action: Action, new_id: int, took: float | None) -> None:
        """Count what was done with ``job`` (now ``new_id``); ``took`` is how long its
        consumer ran (None: it did not run)."""
        if isinstance(action, Delete):  # the common case: a short lock
            now = self.clock()
            with self._lock:
                self.monitor.done(job.tube, job.id, bool(job.errors), took or 0.0, now)
            return
        with self._lock:
            m = self.monitor
            if isinstance(action, Defer):
                m.moved(job.tube, job.id, new_id)
            else:
                if took is not None:
                    m.failed(job.tube, job.id, job.created_at)
                m.moved(job.tube, job.id, new_id)
                if isinstance(action, Bury):
                    m.buried(job.tube, new_id, job.created_at)

    def outcome(self, tube: str, handled: Handled) -> Any:
        """What ``consume`` and ``retry_one_error`` give: the consumer's result, or its
        exception raised (PayloadError if the job could not run)."""
        action, run, result, error = handled
        if run is None:
            raise PayloadError(action.error if isinstance(action, Bury) else "not run")
        with self._lock:
            self._last[tube] = run
        if error is not None and not isinstance(action, Delete):
            raise error
        return result

    def last(self, tube: str) -> tuple[F, Run]:
        """The consumer of ``tube`` and the last run ``outcome`` saw there (force_retry)."""
        with self._lock:
            run = self._last.get(tube)
        if run is None:
            raise NoJobError(f"no job of tube {tube!r} was consumed yet")
        return self.consumers[tube].fn, run

    def all_tubes(self, counted: Iterable[str]) -> list[str]:
        """The tubes a health check looks at: those with consumers, and ``counted``."""
        return sorted(set(self.consumers) | set(counted))

    # --- the watch --------------------------------------------------------------------

    def due(self) -> tuple[list[Running], list[Running], float]:
        """Runs to touch now (a third of their job's own ttr since the last touch), runs
        past their max_execute_time not yet logged (marked logged), and the seconds until
        the next touch falls due (at most WATCH_TICK)."""
        now = self.clock()
        touch, slow = [], []
        wait = WATCH_TICK
        with self._lock:
            for r in list(self.running.values()):
                if now - r.touched >= r.every:
                    r.touched = now
                    touch.append(r)
                wait = min(wait, r.touched + r.every - now)
                if not r.logged and now - r.started > r.options.max_execute_time:
                    r.logged = True
                    slow.append(r)
        return touch, slow, max(wait, 0.0)

    def touched(self, r: Running, ttr: float) -> None:
        """``r`` was touched and its job's ttr is ``ttr`` (learnt then, over a server)."""
        if ttr != r.job.ttr:
            with self._lock:
                r.job = r.job._replace(ttr=ttr)
                r.every = touch_every(ttr)

    def log_slow(self, r: Running, stack: str) -> None:
        log.error("job %d of tube %r has run for %.0f s (max_execute_time %.0f s); its "
                  "stack:\n%s", r.job.id, r.job.tube, self.clock() - r.started,
                  r.options.max_execute_time, stack)

    # --- visibility -------------------------------------------------------------------

    def failed_job(self, job: JobView) -> FailedJob:
        try:
            payload = self.options(job.tube).codec.decode(unpack(job.body).payload)
        except Exception:
            payload = job.body
        return FailedJob(job.id, job.tube, payload, job.errors, job.created_at)

    def health_suspects(self, buried: dict[str, list[JobView]]) -> Suspects:
        """A health check's first step (:meth:`Monitor.suspects`): ``buried``, per tube its
        oldest buried jobs; the face then asks the store about each of ``jobs``."""
        with self._lock:
            return self.monitor.suspects(self.clock(), {t: [(j.id, j.created_at) for j in jobs]
                                                        for t, jobs in buried.items()},
                                         HEALTH_LIMIT)

    def settle_health(self, suspects: Suspects, present: Sequence[bool]) -> bool:
        """The verdict: ``present``, whether each of ``suspects.jobs`` is in the store."""
        with self._lock:
            return self.monitor.settle(suspects, present, self._slow())

    def _slow(self) -> bool:
        now = self.clock()
        return any(now - r.started > r.options.max_execute_time
                   for r in list(self.running.values()))

    def running_counts(self) -> dict[str, int]:
        """Per tube, jobs running now."""
        out: dict[str, int] = {}
        for r in list(self.running.values()):
            out[r.job.tube] = out.get(r.job.tube, 0) + 1
        return out

    def healthy(self) -> bool | None:
        with self._lock:
            return self.monitor.healthy(self.clock())

    def retry_stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return self.monitor.retry_stats()

    def processing_time_stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return self.monitor.processing_times(self.clock())
