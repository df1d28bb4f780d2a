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
import math
import random
import time
import traceback
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar, Unpack, cast, overload

import anyio
import anyio.abc
import anyio.lowlevel

from k7core import ClosedError, Fsync, K7Error
from k7core.jobs import JobOwner, JobStore
from k7core.workers import (
    FailedJob,
    JobView,
    MemorySource,
    NoJobError,
    Options,
    OptionsDict,
    Session,
    Source,
)
from k7core.workers._core import Consumer, Core, Handled, Run, make_options
from k7core.workers._monitor import Monitor
from k7core.workers._policy import Action, Defer, Delete, Retry
from k7core.workers._source import Deps, view

from ._bridge import Pace, post
from ._jobs import AsyncJobStore

log = logging.getLogger("k7core.workers")
T = TypeVar("T")

AsyncConsumer = Callable[[Any], Awaitable[Any]]


class AsyncSession(Protocol):
    """:class:`k7core.workers.Session`, awaitable."""

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None: ...
    async def delete(self, job: JobView) -> None: ...
    async def release(self, job: JobView, delay: float, error: str | None) -> int: ...
    async def bury(self, job: JobView, error: str) -> int: ...
    async def touch(self, job: JobView) -> None: ...
    async def take(self, job_id: int) -> JobView: ...
    async def aclose(self) -> None: ...


class AsyncSource(Protocol):
    """:class:`k7core.workers.Source`, awaitable."""

    def session(self) -> AsyncSession: ...
    async def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
                  key: str | None, depends_on: Deps) -> int: ...
    async def buried(self, tube: str) -> list[JobView]: ...
    async def kick(self, tube: str, bound: int) -> int: ...
    async def kick_job(self, job_id: int) -> None: ...
    async def counts(self) -> dict[str, dict[str, int]]: ...
    async def aclose(self) -> None: ...


# --- an in-process job store ---------------------------------------------------------------


class _StoreSession:
    def __init__(self, source: AsyncStoreSource, owner: JobOwner) -> None:
        self._source = source
        self._owner = owner

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            job = self._owner.reserve(tubes, timeout=0)
            if job is not None:
                return view(job)
            woken = self._source.woken  # taken before any await: no wake-up is missed
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with anyio.move_on_after(left):
                await woken.wait()

    async def delete(self, job: JobView) -> None:
        await self._source.call(lambda: self._owner.delete(job.id))

    async def release(self, job: JobView, delay: float, error: str | None) -> int:
        await self._source.call(lambda: self._owner.release(job.id, delay=delay, error=error))
        return job.id

    async def bury(self, job: JobView, error: str) -> int:
        await self._source.call(lambda: self._owner.bury(job.id, error=error))
        return job.id

    async def touch(self, job: JobView) -> None:
        self._owner.touch(job.id)  # not journaled: never waits

    async def take(self, job_id: int) -> JobView:
        return view(await self._source.call(lambda: self._owner.reserve_job(job_id)))

    async def aclose(self) -> None:
        self._owner.close()


class AsyncStoreSource:
    """An :class:`AsyncJobStore` as an :class:`AsyncSource` (make it in the event loop that
    uses it; :meth:`aclose` it there)."""

    def __init__(self, store: AsyncJobStore) -> None:
        self._astore = store
        self._store: JobStore = store.store
        self._sync = self._store.fsync is Fsync.SYNC
        self._token = anyio.lowlevel.current_token()
        self.woken = anyio.Event()
        """Set (and replaced) whenever jobs may have become ready."""
        self._posted = False
        self._store.add_ready_listener(self._listener)

    def _listener(self) -> None:  # any thread, the store's lock held
        if not self._posted:
            self._posted = True
            post(self._token, self._wake)

    def _wake(self) -> None:
        self._posted = False
        woken, self.woken = self.woken, anyio.Event()
        woken.set()

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` here under flush/async (microseconds), on the owner thread under sync
        (its msync shared with the other calls of the moment)."""
        if self._sync:
            return await self._astore.run(lambda _: fn())
        return fn()

    def session(self) -> _StoreSession:
        return _StoreSession(self, self._store.owner())

    async def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
                  key: str | None, depends_on: Deps) -> int:
        return await self._astore.put(body, tube=tube, priority=priority, delay=delay,
                                      ttr=ttr, key=key, depends_on=depends_on)

    async def buried(self, tube: str) -> list[JobView]:
        return [view(j) for j in self._store.errors(tube)]

    async def kick(self, tube: str, bound: int) -> int:
        return await self.call(lambda: self._store.kick(tube, bound))

    async def kick_job(self, job_id: int) -> None:
        await self.call(lambda: self._store.kick_job(job_id))

    async def counts(self) -> dict[str, dict[str, int]]:
        return {tube: {"ready": o.ready, "delayed": o.delayed, "reserved": o.reserved,
                       "buried": o.buried, "waiting": o.waiting}
                for tube, o in self._store.overview().items()}

    async def aclose(self) -> None:
        if not self._store.closed:
            self._store.remove_ready_listener(self._listener)


# --- a source whose calls never wait (the test mode's) ---------------------------------------


class _InlineSession:
    def __init__(self, session: Session) -> None:
        self._s = session

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None:
        return self._s.reserve(tubes, 0)

    async def delete(self, job: JobView) -> None:
        self._s.delete(job)

    async def release(self, job: JobView, delay: float, error: str | None) -> int:
        return self._s.release(job, delay, error)

    async def bury(self, job: JobView, error: str) -> int:
        return self._s.bury(job, error)

    async def touch(self, job: JobView) -> None:
        self._s.touch(job)

    async def take(self, job_id: int) -> JobView:
        return self._s.take(job_id)

    async def aclose(self) -> None:
        self._s.close()


class InlineSource:
    """A :class:`k7core.workers.Source` whose calls never wait (a MemorySource) as an
    :class:`AsyncSource`: its calls run in the event loop."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def session(self) -> _InlineSession:
        return _InlineSession(self.source.session())

    async def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
                  key: str | None, depends_on: Deps) -> int:
        return self.source.put(body, tube=tube, priority=priority, delay=delay, ttr=ttr,
                               key=key, depends_on=depends_on)

    async def buried(self, tube: str) -> list[JobView]:
        return self.source.buried(tube)

    async def kick(self, tube: str, bound: int) -> int:
        return self.source.kick(tube, bound)

    async def kick_job(self, job_id: int) -> None:
        self.source.kick_job(job_id)

    async def counts(self) -> dict[str, dict[str, int]]:
        return self.source.counts()

    async def aclose(self) -> None:
        self.source.close()


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
    :class:`AsyncJobStore`, a :class:`k7core.workers.MemorySource` (test mode: nothing runs
    by itself, :meth:`consume` runs one job), or an :class:`AsyncSource`."""

    def __init__(
        self,
        source: AsyncJobStore | MemorySource | AsyncSource,
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

    # --- life ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        spec = self._spec
        if isinstance(spec, AsyncJobStore):
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
            if self._tg is not None:
                await self.stop()
                return await self._tg.__aexit__(exc_type, exc, tb)
            return None
        finally:
            self._tg = None
            if self._source is not None:
                source, self._source = self._source, None
                with anyio.CancelScope(shield=True):
                    await source.aclose()

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
                  depends_on: Deps | None = None) -> int:
        """:meth:`k7core.workers.Worker.put`."""
        body, args = self._core.put_args(tube, payload, priority, delay, ttr, key, depends_on)
        return await self._src.put(body, **args)

    # --- running ----------------------------------------------------------------------------

    async def _slot(self, consumer: Consumer[AsyncConsumer]) -> None:
        tubes = (consumer.tube,)
        pace = Pace()
        me = anyio.get_current_task()
        try:
            while not self._stopping:
                session = self._src.session()
                try:
                    while not self._stopping:
                        job = await session.reserve(tubes, 0)
                        if job is None:  # wait, in a scope stop() cancels
                            with anyio.CancelScope() as scope:
                                self._waiting.add(scope)
                                try:
                                    job = await session.reserve(tubes, None)
                                finally:
                                    self._waiting.discard(scope)
                        if job is not None:
                            await self._handle(session, job, task=me)
                            await pace.checkpoint()
                except Exception:
                    log.exception("worker of tube %r: the job source failed; again in 1 s",
                                  consumer.tube)
                    await anyio.sleep(1.0)
                finally:
                    with anyio.CancelScope(shield=True):
                        await session.aclose()
        finally:
            self._slots -= 1
            if not self._slots and self._stopping:
                self._idle.set()

    async def _handle(self, session: AsyncSession, job: JobView, *, gated: bool = True,
                      forced: bool = False, task: anyio.TaskInfo | None = None) -> Handled:
        core = self._core
        step = core.start(job, gated=gated and not forced)
        if not isinstance(step, Run):
            core.done(job, step, await apply(session, job, step), None)
            return step, None, None, None
        fn = core.consumers[job.tube].fn
        with core.context(step):
            handle = core.begin(job, (task or anyio.get_current_task(), session))
            result, error = None, None
            try:
                result = await fn(step.payload)
            except Exception as exc:
                error = exc
            finally:
                took = core.end(handle)
            action = core.finish(job, error, bury=forced)
            core.done(job, action, await apply(session, job, action), took)
        return action, step, result, error

    async def _watch(self) -> None:
        core = self._core
        next_check = time.monotonic()
        while True:
            await anyio.sleep(0.5)
            touch, slow = core.due()
            for r in touch:
                _, session = cast(tuple[anyio.TaskInfo, AsyncSession], r.where)
                try:
                    await session.touch(r.job)
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
        return await self._src.kick(tube, 1 << 31)

    async def stats(self) -> dict[str, dict[str, int]]:
        """:meth:`k7core.workers.Worker.stats`."""
        return await self._src.counts()

    def retry_stats(self) -> dict[str, dict[str, float]]:
        """:meth:`k7core.workers.Worker.retry_stats`."""
        return self._core.retry_stats()

    def processing_time_stats(self) -> dict[str, dict[str, float]]:
        """:meth:`k7core.workers.Worker.processing_time_stats`."""
        return self._core.processing_time_stats()

    async def check_health(self) -> bool:
        """:meth:`k7core.workers.Worker.check_health`."""
        tubes = self._core.all_tubes(await self._src.counts())
        return self._core.check_health({t: await self._src.buried(t) for t in tubes})

    def running(self) -> dict[str, int]:
        """:meth:`k7core.workers.Worker.running`."""
        return self._core.running_counts()

    def healthy(self) -> bool | None:
        """:meth:`k7core.workers.Worker.healthy`."""
        return self._core.healthy()

    def __repr__(self) -> str:
        return f"<k7async.AsyncWorker {sorted(self._core.consumers)!r}>"

