"""Worker: consumers on threads (the sync face; ``k7async.AsyncWorker`` is the async one).

Each consumer slot is a thread with a session of its own (its reservations); one watch
thread touches running jobs, logs the ones running past ``max_execute_time`` with their
thread's stack, and checks health. The rules are in ``_core`` and ``_policy``.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Unpack, cast, overload

from .._errors import ClosedError, K7Error
from .._resource import Resource
from ..jobs import JobStore
from ._beanstalk import BeanstalkSource
from ._core import (
    HEALTH_LIMIT,
    STOPS,
    WATCH_TICK,
    Consumer,
    Core,
    FailedJob,
    Handled,
    NoJobError,
    OptionsDict,
    Recorder,
    Run,
    make_options,
)
from ._monitor import Monitor
from ._policy import Action, Defer, Delete, Options, Retry
from ._source import ALL, Deps, JobView, MemorySource, Session, Source, StoreSource

log = logging.getLogger("k7core.workers")

SyncConsumer = Callable[[Any], Any]



def apply(session: Session, job: JobView, action: Action) -> int:
    """Do ``action`` to the reserved ``job``; returns its id from now on."""
    if isinstance(action, Delete):
        session.delete(job)
        return job.id
    if isinstance(action, Retry):
        return session.release(job, action.delay, action.error)
    if isinstance(action, Defer):
        return session.release(job, action.delay, None)
    return session.bury(job, action.error)


def source_of(spec: JobStore | Source | str) -> Source:
    """The :class:`Source` a worker's first argument names."""
    if isinstance(spec, JobStore):
        return StoreSource(spec)
    if isinstance(spec, str):
        return BeanstalkSource(spec)
    if callable(getattr(spec, "session", None)):
        return spec
    raise K7Error(f"{spec!r} is not a job source",
                  hint="pass a k7core.jobs.JobStore, a beanstalkd address or a Source")


class Worker(Resource):
    """Runs consumers on jobs of a source: a :class:`k7core.jobs.JobStore` in this process,
    a beanstalkd address, or a :class:`MemorySource` (the test mode: nothing runs by itself;
    :meth:`consume` runs one job in the caller, time moves with the source's clock).

    Keyword arguments are the defaults of every tube's :class:`Options` (a consumer's own
    override them). ``health_interval``: seconds between health checks; ``grace``,
    ``allowed_error_time``: see :meth:`healthy`.
    """

    def __init__(
        self,
        source: JobStore | Source | str,
        *,
        poll: float = 0.25,
        health_interval: float = 10.0,
        grace: float = 600.0,
        allowed_error_time: float = 900.0,
        clock: Callable[[], float] | None = None,
        rand: Callable[[], float] | None = None,
        **defaults: Unpack[OptionsDict],
    ) -> None:
        self._closed = True
        self._source = source_of(source)
        self._owns_source = isinstance(source, str)
        testing = isinstance(self._source, MemorySource)
        if clock is None:
            clock = self._source.clock if isinstance(self._source, MemorySource) else time.time
        if rand is None:
            rand = random.Random(0).random if testing else random.random
        monitor = Monitor(grace=grace, allowed_error_time=allowed_error_time)
        self._core: Core[SyncConsumer] = Core(make_options(Options(), defaults), clock=clock,
                                             rand=rand, monitor=monitor)
        self._poll = poll
        self._health_interval = health_interval
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sessions: dict[int, Session] = {}  # by thread id, for stop()
        self._lock = threading.Lock()
        self._started = False
        self._testing = testing
        self._fatal: BaseException | None = None  # a consumer's SystemExit, raised by stop()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def source(self) -> Source:
        return self._source

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this worker is closed", hint="make a new Worker")

    # --- consumers and puts -----------------------------------------------------------

    @overload
    def consumer(self, tube: str, fn: SyncConsumer, /, **options: Unpack[OptionsDict]
                 ) -> SyncConsumer: ...
    @overload
    def consumer(self, tube: str, fn: None = None, /, **options: Unpack[OptionsDict]
                 ) -> Callable[[SyncConsumer], SyncConsumer]: ...

    def consumer(self, tube: str, fn: SyncConsumer | None = None, /,
                 **options: Unpack[OptionsDict]
                 ) -> SyncConsumer | Callable[[SyncConsumer], SyncConsumer]:
        """Run ``fn(payload)`` on the jobs of ``tube`` (also as a decorator). What it
        returns is success; what it raises is a failure (see :class:`Options`)."""
        def register(f: SyncConsumer) -> SyncConsumer:
            self._check_open()
            with self._lock:
                consumer = self._core.register(tube, f, options)
                if self._started:
                    self._spawn(consumer)
            return f
        return register if fn is None else register(fn)

    def put(self, tube: str, payload: Any, *, priority: int | None = None,
            delay: float = 0.0, ttr: float | None = None, key: str | None = None,
            depends_on: Deps | None = None, group: str | None = None) -> int:
        """Put a job: ``payload`` encoded with the tube's codec, the tube's context
        variables captured. ``key``: unique among the tube's live jobs (a put with a taken
        key returns that job's id). ``depends_on``: ids or ``(tube, key)`` pairs (default:
        the tube's ``depends_on`` function of the payload). ``group``: the job group it
        joins (:meth:`group_progress`). Returns the job's id."""
        self._check_open()
        body, args = self._core.put_args(tube, payload, priority, delay, ttr, key, depends_on,
                                         group)
        return self._source.put(body, **args)

    # --- running ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the consumers' threads and the watch thread (in the test mode, nothing:
        jobs run only through :meth:`consume`)."""
        self._check_open()
        with self._lock:
            if self._started or self._testing:
                return
            self._started = True
            for consumer in self._core.consumers.values():
                self._spawn(consumer)
            watch = threading.Thread(target=self._watch, name="k7-workers-watch", daemon=True)
            self._threads.append(watch)
            watch.start()

    def _spawn(self, consumer: Consumer[SyncConsumer]) -> None:
        for i in range(consumer.options.concurrency):
            t = threading.Thread(target=self._slot, args=(consumer,),
                                 name=f"k7-worker-{consumer.tube}-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs; wait up to ``timeout`` seconds for running jobs to finish, then
        release the ones still running (ready again at once). Idempotent. If a consumer
        stopped the worker by raising SystemExit or KeyboardInterrupt (or a slot thread
        died of something else), raises that exception (once: here, :meth:`join` or
        :meth:`close`)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            stuck = list(self._sessions.values())
        for session in stuck:  # their jobs go back; their threads fail and end
            try:
                session.close()
            except Exception:
                log.exception("releasing a running job at stop failed")
        with self._lock:
            fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the worker is told to stop (:meth:`stop` or :meth:`close` in another
        thread, or a consumer raising SystemExit or KeyboardInterrupt), then :meth:`stop`
        it, raising that exception here. False if ``timeout`` seconds passed first."""
        if not self._stopping.wait(timeout):
            return False
        self.stop()
        return True

    def close(self) -> None:
        """:meth:`stop`, and the source if the worker opened it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
        finally:
            if self._owns_source:
                self._source.close()

    def __enter__(self) -> Worker:
        self.start()
        return self

    def _slot(self, consumer: Consumer[SyncConsumer]) -> None:
        me = threading.get_ident()
        tubes = (consumer.tube,)
        stopping, poll, handle = self._stopping.is_set, self._poll, self._handle
        while not stopping():
            session = self._source.session()
            where = (me, session)  # for the watch: the thread's stack, and touches
            with self._lock:
                self._sessions[me] = session
            try:
                reserve = session.reserve
                while not stopping():
                    job = reserve(tubes, poll)
                    if job is not None:
                        handle(session, job, where=where)
            except ClosedError:
                if self._stopping.is_set():
                    return
                log.exception("the job source of tube %r closed", consumer.tube)
                return
            except Exception as exc:
                if self._stopping.is_set():  # e.g. an outcome it was still trying to record
                    log.warning("worker of tube %r stops; its job source failed: %s",
                                consumer.tube, exc)
                    return
                log.exception("worker of tube %r: the job source failed; again in 1 s",
                              consumer.tube)
                self._stopping.wait(1.0)
            except BaseException as exc:  # a consumer's SystemExit: stop, visibly
                self._die(consumer.tube, exc)
                return
            finally:
                with self._lock:
                    self._sessions.pop(me, None)
                session.close()

    def _die(self, tube: str, exc: BaseException) -> None:
        log.error("worker of tube %r stops: %s (stop(), join() and close() raise it)",
                  tube, type(exc).__name__, exc_info=exc)
        with self._lock:
            if self._fatal is None:
                self._fatal = exc
        self._stopping.set()

    def _handle(self, session: Session, job: JobView, *, gated: bool = True,
                forced: bool = False, where: object = None) -> Handled:
        """Run one reserved job through the policy; returns what was done, the run, the
        consumer's result and its exception. ``forced``: run whatever the gate, and bury
        it again if it fails. ``where``: ``(thread id, session)`` (default: this thread's)."""
        core = self._core
        step = core.start(job, gated=gated and not forced)
        if not isinstance(step, Run):
            core.done(job, step, self._record(session, job, step), None)
            return step, None, None, None
        if where is None:
            where = (threading.get_ident(), session)
        if step.context:
            with core.context(step):
                return self._run(session, job, step, forced, where)
        return self._run(session, job, step, forced, where)

    def _run(self, session: Session, job: JobView, step: Run, forced: bool, where: object
             ) -> Handled:
        """The consumer on a decoded job, and what follows (the job's context is set)."""
        core = self._core
        handle = core.begin(job, where)
        result, error = None, None
        try:
            result = core.consumers[job.tube].fn(step.payload)
        except STOPS:
            raise  # the job is released with its session
        except BaseException as exc:  # any other is the job's failure
            error = exc
        finally:
            took = core.end(handle)
        action = core.finish(job, error, bury=forced)
        core.done(job, action, self._record(session, job, action), took)
        return action, step, result, error

    def _record(self, session: Session, job: JobView, action: Action) -> int:
        """:func:`apply`; if the source refuses to record it, the job stays reserved and it
        is tried again until recorded or the worker stops (``_core.Recorder``)."""
        try:
            return apply(session, job, action)
        except Exception as exc:
            return self._retry(session, job, action, exc)

    def _retry(self, session: Session, job: JobView, action: Action, error: Exception
               ) -> int:
        """Recording ``action`` failed with ``error``: ``_core.Recorder``'s rule."""
        rec = Recorder(job, action, error)
        while not self._stopping.wait(rec.wait(session.touch(job))):
            try:
                new_id = apply(session, job, action)
            except Exception as exc:
                rec.failed(exc)
                continue
            return rec.recorded(new_id)
        raise rec.error

    def _watch(self) -> None:
        core = self._core
        next_check = time.monotonic()
        wait = WATCH_TICK
        while not self._stopping.wait(wait):
            touch, slow, wait = core.due()
            for r in touch:
                _, session = cast(tuple[int, Session], r.where)
                try:
                    core.touched(r, session.touch(r.job))
                except Exception as exc:  # the job finished meanwhile
                    log.debug("touch of job %d: %s", r.job.id, exc)
            for r in slow:
                ident, _ = cast(tuple[int, Session], r.where)
                frame = sys._current_frames().get(ident)
                stack = "".join(traceback.format_stack(frame)) if frame else "(gone)"
                core.log_slow(r, stack)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self._health_interval
                try:
                    self.check_health()
                except Exception:
                    log.exception("health check failed")

    # --- the test mode and the REPL's tools ---------------------------------------------

    def consume(self, tube: str) -> Any:
        """Run one ready job of ``tube`` now, in this thread, and return the consumer's
        result or raise its exception (the job is then released or buried as a worker
        would). The test mode's step (yoltq's ``consume!``); NoJobError if none is ready."""
        session = self._source.session()
        try:
            job = session.reserve((tube,), 0)
            if job is None:
                raise NoJobError(f"no ready job in tube {tube!r}")
            return self._core.outcome(tube, self._handle(session, job, gated=False))
        finally:
            session.close()

    def force_retry(self, tube: str) -> Any:
        """Run the consumer again on the payload (and context) of the last job
        :meth:`consume` or :meth:`retry_one_error` ran on ``tube``, to check that it is
        idempotent (yoltq's ``force-retry!``). Stores nothing."""
        fn, run = self._core.last(tube)
        with self._core.context(run):
            return fn(run.payload)

    def errors(self, tube: str) -> list[FailedJob]:
        """The buried jobs of ``tube`` with their errors (texts and tracebacks), oldest
        buried first (yoltq's ``get-errors``)."""
        return [self._core.failed_job(j) for j in self._source.buried(tube)]

    def retry_one_error(self, tube: str) -> Any:
        """Run the oldest buried job of ``tube`` now, in this thread, whatever its failures
        (yoltq's ``retry-one-error!``): returns the consumer's result (the job is done) or
        raises its exception (the job is buried again with it); None if none is buried."""
        buried = self._source.buried(tube)
        if not buried:
            return None
        session = self._source.session()
        try:
            job = session.take(buried[0].id)
            return self._core.outcome(tube, self._handle(session, job, forced=True))
        finally:
            session.close()

    def retry_errors(self, tube: str) -> int:
        """Make every buried job of ``tube`` ready again (never a delayed one); returns how
        many."""
        return self._source.kick(tube, ALL)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per tube, live jobs by state (yoltq's ``queue-stats``)."""
        return self._source.counts()

    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        """How far job group ``group`` of ``tube`` is (yoltq's ``job-group-progress``): its
        live jobs per state and ``done``, how many of its jobs finished (the job store
        counts them until :meth:`forget_group`)."""
        return self._source.group_progress(tube, group)

    def forget_group(self, tube: str, group: str) -> bool:
        """Drop the job store's count of a group (its live jobs stay); False if unknown."""
        return self._source.forget_group(tube, group)

    def retry_stats(self) -> dict[str, dict[str, float]]:
        """Per tube since start: ok, retried_ok, failures, buried, deferred and
        retry_percentage (yoltq's ``retry-stats``)."""
        return self._core.retry_stats()

    def processing_time_stats(self) -> dict[str, dict[str, float]]:
        """Per tube, run times in seconds over the last hour: count, avg, min, max, p50,
        p90, p95, p99 (yoltq's ``processing-time-stats``)."""
        return self._core.processing_time_stats()

    def check_health(self) -> bool:
        """Judge health now (the watch thread does every ``health_interval``)."""
        core, source = self._core, self._source
        tubes = core.all_tubes(source.counts())
        suspects = core.health_suspects({t: source.buried(t, HEALTH_LIMIT) for t in tubes})
        return core.settle_health(suspects, [source.exists(i) for _, i in suspects.jobs])

    def running(self) -> dict[str, int]:
        """Per tube, jobs running now."""
        return self._core.running_counts()

    def healthy(self) -> bool | None:
        """yoltq's ``healthy?``: None before the first check; True during the start-up
        grace; False while a failing job created more than ``allowed_error_time`` ago is
        still in the store (buried, or seen failing here and not done yet by any worker),
        or a job runs past its max_execute_time; else True."""
        return self._core.healthy()

    def __repr__(self) -> str:
        return f"<k7core.workers.Worker {sorted(self._core.consumers)!r}>"
