"""AsyncWorker: consumers as tasks (asyncio or trio), over the same core as
:class:`k7core.workers.Worker` (``k7core.workers._core`` decides; this module reserves, runs
and applies).

Sources: an :class:`AsyncJobStore` of this process (its calls run in the event loop under
``"flush"`` and ``"async"``, on its owner thread under ``"sync"`` for group commit; a reserve
that waits is woken by the store's ready listener, no thread), a
:class:`k7core.workers.MemorySource` (the test mode), or any :class:`AsyncSource`.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, Unpack, cast, overload

import anyio
import anyio.abc
import anyio.lowlevel

from k7core import ClosedError, K7Error
from k7core.workers import (
    FailedJob,
    JobView,
    MemorySource,
    NoJobError,
    Options,
    OptionsDict,
)
from k7core.workers._core import (
    DELETE,
    HEALTH_LIMIT,
    STOPS,
    WATCH_TICK,
    Consumer,
    Core,
    Handled,
    Recorder,
    Run,
    make_options,
)
from k7core.workers._monitor import Monitor
from k7core.workers._policy import Action, Defer, Delete, Retry
from k7core.workers._source import ALL, Deps

from ._bridge import SCHEDULE_EVERY
from ._jobs import AsyncJobStore
from ._worker_sources import (
    AsyncBeanstalkSource,
    AsyncSession,
    AsyncSource,
    AsyncStoreSource,
    InlineSource,
)

log = logging.getLogger("k7core.workers")

AsyncConsumer = Callable[[Any], Awaitable[Any]]


# --- the worker ------------------------------------------------------------------------------


async def apply(session: AsyncSession, job: JobView, action: Action) -> int:
    """Do ``action`` to the reserved ``job``; returns its id from now on."""
    if isinstance(action, Delete):
        await session.delete(job)
        return job.id
    if isinstance(action, Retry):
        return await session.release(job, action.delay, action.error)
    if isinstance(action, Defer):
        return await session.release(job, action.delay, None)
    return await session.bury(job, action.error)


def task_stack(task: anyio.TaskInfo) -> str:
    """The stack of a suspended task, outermost call first."""
    frames = []
    coro: Any = task.coro
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "".join(traceback.StackSummary.extract(frames).format()) or "(no frames)"


class AsyncWorker:
    """Runs async consumers on jobs of a source, as tasks, while its ``async with`` block
    runs; :class:`k7core.workers.Worker`'s twin (same options, same rules). The source: an
    :class:`AsyncJobStore`, a beanstalkd address (``beanstalk://host:port``, ``host:port``,
    ``unix:/path``: our server or beanstalkd itself), a :class:`k7core.workers.MemorySource`
    (test mode: nothing runs by itself, :meth:`consume` runs one job), or an
    :class:`AsyncSource`."""

    def __init__(
        self,
        source: AsyncJobStore | MemorySource | AsyncSource | str,
        *,
        health_interval: float = 10.0,
        stop_timeout: float = 30.0,
        grace: float = 600.0,
        allowed_error_time: float = 900.0,
        clock: Callable[[], float] | None = None,
        rand: Callable[[], float] | None = None,
        **defaults: Unpack[OptionsDict],
    ) -> None:
        self._spec = source
        testing = isinstance(source, MemorySource)
        if clock is None:
            clock = source.clock if isinstance(source, MemorySource) else time.time
        if rand is None:
            rand = random.Random(0).random if testing else random.random
        monitor = Monitor(grace=grace, allowed_error_time=allowed_error_time)
        self._core: Core[AsyncConsumer] = Core(make_options(Options(), defaults),
                                              clock=clock, rand=rand, monitor=monitor)
        self._testing = testing
        self._health_interval = health_interval
        self._stop_timeout = stop_timeout
        self._source: AsyncSource | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self._waiting: set[anyio.CancelScope] = set()
        self._slots = 0
        self._idle = anyio.Event()
        self._fatal: BaseException | None = None  # a consumer's SystemExit, raised at exit

    # --- life ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        spec = self._spec
        if isinstance(spec, str):
            self._source = AsyncBeanstalkSource(spec)
        elif isinstance(spec, AsyncJobStore):
            self._source = AsyncStoreSource(spec)
        elif isinstance(spec, MemorySource):
            self._source = InlineSource(spec)
        elif callable(getattr(spec, "session", None)):
            self._source = spec
        else:
            raise K7Error(f"{spec!r} is not a job source",
                          hint="pass an AsyncJobStore, a MemorySource or an AsyncSource")
        if not self._testing:
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            for consumer in self._core.consumers.values():
                self._spawn(consumer)
            self._tg.start_soon(self._watch, name="k7-workers-watch")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        try:
            suppress = None
            if self._tg is not None:
                await self.stop()
                suppress = await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None
            if self._source is not None:
                source, self._source = self._source, None
                with anyio.CancelScope(shield=True):
                    await source.aclose()
        fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal
        return suppress

    def _spawn(self, consumer: Consumer[AsyncConsumer]) -> None:
        assert self._tg is not None
        for i in range(consumer.options.concurrency):
            self._slots += 1
            self._tg.start_soon(self._slot, consumer, name=f"k7-worker-{consumer.tube}-{i}")

    async def stop(self) -> None:
        """Stop taking jobs; give running jobs ``stop_timeout`` seconds to finish, then
        cancel them (their jobs are ready again at once). The ``async with`` exit does it."""
        self._stopping = True
        for scope in self._waiting:
            scope.cancel()
        if self._slots:
            with anyio.move_on_after(self._stop_timeout):
                await self._idle.wait()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @property
    def _src(self) -> AsyncSource:
        if self._source is None:
            raise ClosedError("the worker is not running",
                              hint="use it inside `async with AsyncWorker(...)`")
        return self._source

    # --- consumers and puts ---------------------------------------------------------------

    @overload
    def consumer(self, tube: str, fn: AsyncConsumer, /, **options: Unpack[OptionsDict]
                 ) -> AsyncConsumer: ...
    @overload
    def consumer(self, tube: str, fn: None = None, /, **options: Unpack[OptionsDict]
                 ) -> Callable[[AsyncConsumer], AsyncConsumer]: ...

    def consumer(self, tube: str, fn: AsyncConsumer | None = None, /,
                 **options: Unpack[OptionsDict]
                 ) -> AsyncConsumer | Callable[[AsyncConsumer], AsyncConsumer]:
        """Run ``await fn(payload)`` on the jobs of ``tube`` (also as a decorator): see
        :meth:`k7core.workers.Worker.consumer`. On a running worker it starts at once."""
        def register(f: AsyncConsumer) -> AsyncConsumer:
            consumer = self._core.register(tube, f, options)
            if self._tg is not None and not self._stopping:
                self._spawn(consumer)
            return f
        return register if fn is None else register(fn)

    async def put(self, tube: str, payload: Any, *, priority: int | None = None,
                  delay: float = 0.0, ttr: float | None = None, key: str | None = None,
                  depends_on: Deps | None = None, group: str | None = None) -> int:
        """:meth:`k7core.workers.Worker.put`."""
        body, args = self._core.put_args(tube, payload, priority, delay, ttr, key, depends_on,
                                         group)
        return await self._src.put(body, **args)

    # --- running ----------------------------------------------------------------------------

    async def _slot(self, consumer: Consumer[AsyncConsumer]) -> None:
        tubes = (consumer.tube,)
        checkpoint = anyio.lowlevel.checkpoint
        left = SCHEDULE_EVERY  # jobs until the next schedule point (and cancel point)
        me = anyio.get_current_task()
        handle = self._handle
        try:
            while not self._stopping:
                session = self._src.session()
                where = (me, session)  # for the watch: the task's stack, and touches
                reserve = session.reserve
                try:
                    while not self._stopping:
                        job = await reserve(tubes, 0)
                        if job is None:  # wait, in a scope stop() cancels
                            left = SCHEDULE_EVERY  # waiting was a schedule point
                            with anyio.CancelScope() as scope:
                                self._waiting.add(scope)
                                try:
                                    job = await reserve(tubes, None)
                                finally:
                                    self._waiting.discard(scope)
                        if job is not None:
                            await handle(session, job, where=where)
                            left -= 1
                            if not left:  # a store call in flush mode never suspends
                                left = SCHEDULE_EVERY
                                await checkpoint()
                except Exception as exc:
                    if self._stopping:  # e.g. an outcome it was still trying to record
                        log.warning("worker of tube %r stops; its job source failed: %s",
                                    consumer.tube, exc)
                        break
                    log.exception("worker of tube %r: the job source failed; again in 1 s",
                                  consumer.tube)
                    await anyio.sleep(1.0)
                finally:
                    with anyio.CancelScope(shield=True):
                        await session.aclose()
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # a consumer's SystemExit: stop, visibly
            self._die(consumer.tube, exc)
        finally:
            self._slots -= 1
            if not self._slots and self._stopping:
                self._idle.set()

    def _die(self, tube: str, exc: BaseException) -> None:
        log.error("worker of tube %r stops: %s (raised again when the `async with` exits)",
                  tube, type(exc).__name__, exc_info=exc)
        if self._fatal is None:
            self._fatal = exc
        self._stopping = True
        if self._tg is not None:
            self._tg.start_soon(self.stop, name="k7-workers-stop")

    async def _handle(self, session: AsyncSession, job: JobView, *, gated: bool = True,
                      forced: bool = False, where: object = None) -> Handled:
        """:meth:`k7core.workers.Worker._handle`; ``where``: ``(task, session)``."""
        core = self._core
        step = core.start(job, gated=gated and not forced)
        if not isinstance(step, Run):
            core.done(job, step, await self._record(session, job, step), None)
            return step, None, None, None
        if where is None:
            where = (anyio.get_current_task(), session)
        if step.context:
            with core.context(step):
                return await self._run(session, job, step, forced, where)
        return await self._run(session, job, step, forced, where)

    async def _run(self, session: AsyncSession, job: JobView, step: Run, forced: bool,
                   where: object) -> Handled:
        core = self._core
        handle = core.begin(job, where)
        result, error = None, None
        try:
            result = await core.consumers[job.tube].fn(step.payload)
        except (anyio.get_cancelled_exc_class(), *STOPS):
            raise  # the job is released with its session
        except BaseException as exc:  # any other is the job's failure
            error = exc
        finally:
            took = core.end(handle)
        action = core.finish(job, error, bury=forced)
        if action is DELETE:
            try:
                await session.delete(job)
            except Exception as exc:
                await self._retry(session, job, action, exc)
            core.done(job, action, job.id, took)
        else:
            core.done(job, action, await self._record(session, job, action), took)
        return action, step, result, error

    async def _record(self, session: AsyncSession, job: JobView, action: Action) -> int:
        """:meth:`k7core.workers.Worker._record`: the same rule (``_core.Recorder``),
        waiting in a scope :meth:`stop` cancels."""
        try:
            return await apply(session, job, action)
        except Exception as exc:
            return await self._retry(session, job, action, exc)

    async def _retry(self, session: AsyncSession, job: JobView, action: Action,
                     error: Exception) -> int:
        """:meth:`k7core.workers.Worker._retry`."""
        rec = Recorder(job, action, error)
        while not await self._wait(rec.wait(await session.touch(job))):
            try:
                new_id = await apply(session, job, action)
            except Exception as exc:
                rec.failed(exc)
                continue
            return rec.recorded(new_id)
        raise rec.error

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the worker stops first; True if it stopped."""
        if not self._stopping:
            with anyio.CancelScope() as scope:
                self._waiting.add(scope)
                try:
                    await anyio.sleep(seconds)
                finally:
                    self._waiting.discard(scope)
        return self._stopping

    async def _watch(self) -> None:
        core = self._core
        next_check = time.monotonic()
        wait = WATCH_TICK
        while True:
            await anyio.sleep(wait)
            touch, slow, wait = core.due()
            for r in touch:
                _, session = cast(tuple[anyio.TaskInfo, AsyncSession], r.where)
                try:
                    core.touched(r, await session.touch(r.job))
                except Exception as exc:  # the job finished meanwhile
                    log.debug("touch of job %d: %s", r.job.id, exc)
            for r in slow:
                task, _ = cast(tuple[anyio.TaskInfo, AsyncSession], r.where)
                core.log_slow(r, task_stack(task))
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self._health_interval
                try:
                    await self.check_health()
                except Exception:
                    log.exception("health check failed")

    # --- the test mode and the REPL's tools ---------------------------------------------------

    async def consume(self, tube: str) -> Any:
        """:meth:`k7core.workers.Worker.consume`."""
        session = self._src.session()
        try:
            job = await session.reserve((tube,), 0)
            if job is None:
                raise NoJobError(f"no ready job in tube {tube!r}")
            return self._core.outcome(tube, await self._handle(session, job, gated=False))
        finally:
            with anyio.CancelScope(shield=True):
                await session.aclose()

    async def force_retry(self, tube: str) -> Any:
        """:meth:`k7core.workers.Worker.force_retry`."""
        fn, run = self._core.last(tube)
        with self._core.context(run):
            return await fn(run.payload)

    async def errors(self, tube: str) -> list[FailedJob]:
        """:meth:`k7core.workers.Worker.errors`."""
        return [self._core.failed_job(j) for j in await self._src.buried(tube)]

    async def retry_one_error(self, tube: str) -> Any:
        """:meth:`k7core.workers.Worker.retry_one_error`."""
        buried = await self._src.buried(tube)
        if not buried:
            return None
        session = self._src.session()
        try:
            job = await session.take(buried[0].id)
            return self._core.outcome(tube, await self._handle(session, job, forced=True))
        finally:
            with anyio.CancelScope(shield=True):
                await session.aclose()

    async def retry_errors(self, tube: str) -> int:
        """:meth:`k7core.workers.Worker.retry_errors`."""
        return await self._src.kick(tube, ALL)

    async def stats(self) -> dict[str, dict[str, int]]:
        """:meth:`k7core.workers.Worker.stats`."""
        return await self._src.counts()

    async def group_progress(self, tube: str, group: str) -> dict[str, int]:
        """:meth:`k7core.workers.Worker.group_progress`."""
        return await self._src.group_progress(tube, group)

    async def forget_group(self, tube: str, group: str) -> bool:
        """:meth:`k7core.workers.Worker.forget_group`."""
        return await self._src.forget_group(tube, group)

    def retry_stats(self) -> dict[str, dict[str, float]]:
        """:meth:`k7core.workers.Worker.retry_stats`."""
        return self._core.retry_stats()

    def processing_time_stats(self) -> dict[str, dict[str, float]]:
        """:meth:`k7core.workers.Worker.processing_time_stats`."""
        return self._core.processing_time_stats()

    async def check_health(self) -> bool:
        """:meth:`k7core.workers.Worker.check_health`."""
        core, source = self._core, self._src
        tubes = core.all_tubes(await source.counts())
        suspects = core.health_suspects({t: await source.buried(t, HEALTH_LIMIT)
                                         for t in tubes})
        return core.settle_health(suspects, [await source.exists(i) for _, i in suspects.jobs])

    def running(self) -> dict[str, int]:
        """:meth:`k7core.workers.Worker.running`."""
        return self._core.running_counts()

    def healthy(self) -> bool | None:
        """:meth:`k7core.workers.Worker.healthy`."""
        return self._core.healthy()

    def __repr__(self) -> str:
        return f"<k7async.AsyncWorker {sorted(self._core.consumers)!r}>"

