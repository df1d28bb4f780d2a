"""Where an :class:`AsyncWorker`'s jobs come from: the awaitable twins of
:class:`k7core.workers.Source` and ``Session``, and the sources: an :class:`AsyncJobStore`
of this process, a source whose calls never wait (the test mode's MemorySource), and a
beanstalkd server (the steps of ``k7core.workers._beanstalk``, driven on an
:class:`AsyncClient`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio
import anyio.lowlevel

from k7core import Fsync
from k7core.jobs import JobOwner, JobStore
from k7core.workers import JobView, Session, Source
from k7core.workers._beanstalk import (
    Steps,
    buried_steps,
    bury_steps,
    counts_steps,
    exists_steps,
    kick_steps,
    no_store_feature,
    put_steps,
    release_steps,
    reserve_steps,
    take_steps,
    touch_steps,
    watch_steps,
)
from k7core.workers._source import Deps, kick_buried, store_counts, view

from ._bridge import post
from ._jobs import AsyncJobStore
from .beanstalk import AsyncClient, connect

T = TypeVar("T")


class AsyncSession(Protocol):
    """:class:`k7core.workers.Session`, awaitable."""

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None: ...
    async def delete(self, job: JobView) -> None: ...
    async def release(self, job: JobView, delay: float, error: str | None) -> int: ...
    async def bury(self, job: JobView, error: str) -> int: ...
    async def touch(self, job: JobView) -> float: ...
    async def take(self, job_id: int) -> JobView: ...
    async def aclose(self) -> None: ...


class AsyncSource(Protocol):
    """:class:`k7core.workers.Source`, awaitable."""

    def session(self) -> AsyncSession: ...
    async def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
                  key: str | None, depends_on: Deps, group: str | None = None) -> int: ...
    async def buried(self, tube: str, limit: int | None = None) -> list[JobView]: ...
    async def kick(self, tube: str, bound: int) -> int: ...
    async def exists(self, job_id: int) -> bool: ...
    async def counts(self) -> dict[str, dict[str, int]]: ...
    async def group_progress(self, tube: str, group: str) -> dict[str, int]: ...
    async def forget_group(self, tube: str, group: str) -> bool: ...
    async def aclose(self) -> None: ...


# --- an in-process job store ---------------------------------------------------------------


class _StoreSession:
    def __init__(self, source: AsyncStoreSource, owner: JobOwner) -> None:
        self._source = source
        self._owner = owner

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None:
        job = self._owner.reserve(tubes, 0)
        if job is not None:  # a ready job: no clock, no wait
            return view(job)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            woken = self._source.woken  # taken before any await: no wake-up is missed
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with anyio.move_on_after(left):
                await woken.wait()
            job = self._owner.reserve(tubes, 0)
            if job is not None:
                return view(job)

    async def delete(self, job: JobView) -> None:
        if self._source.inline:  # flush or async: microseconds, here
            self._owner.delete(job.id)
        else:
            await self._source.call(lambda: self._owner.delete(job.id))

    async def release(self, job: JobView, delay: float, error: str | None) -> int:
        await self._source.call(lambda: self._owner.release(job.id, delay=delay, error=error))
        return job.id

    async def bury(self, job: JobView, error: str) -> int:
        await self._source.call(lambda: self._owner.bury(job.id, error=error))
        return job.id

    async def touch(self, job: JobView) -> float:
        self._owner.touch(job.id)  # not journaled: never waits
        return job.ttr

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
        self.inline = not self._sync
        """The store's calls run in the event loop (not ``"sync"``): see :meth:`call`."""
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
                  key: str | None, depends_on: Deps, group: str | None = None) -> int:
        return await self._astore.put(body, tube=tube, priority=priority, delay=delay,
                                      ttr=ttr, key=key, depends_on=depends_on, group=group)

    async def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return [view(j) for j in self._store.errors(tube)[:limit]]

    async def kick(self, tube: str, bound: int) -> int:
        return await self.call(lambda: kick_buried(self._store, tube, bound))

    async def exists(self, job_id: int) -> bool:
        return self._store.peek(job_id) is not None

    async def counts(self) -> dict[str, dict[str, int]]:
        return store_counts(self._store)

    async def group_progress(self, tube: str, group: str) -> dict[str, int]:
        return self._store.group_progress(tube, group)

    async def forget_group(self, tube: str, group: str) -> bool:
        return await self.call(lambda: self._store.forget_group(tube, group))

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

    async def touch(self, job: JobView) -> float:
        return self._s.touch(job)

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
                  key: str | None, depends_on: Deps, group: str | None = None) -> int:
        return self.source.put(body, tube=tube, priority=priority, delay=delay, ttr=ttr,
                               key=key, depends_on=depends_on, group=group)

    async def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return self.source.buried(tube, limit)

    async def kick(self, tube: str, bound: int) -> int:
        return self.source.kick(tube, bound)

    async def exists(self, job_id: int) -> bool:
        return self.source.exists(job_id)

    async def counts(self) -> dict[str, dict[str, int]]:
        return self.source.counts()

    async def group_progress(self, tube: str, group: str) -> dict[str, int]:
        return self.source.group_progress(tube, group)

    async def forget_group(self, tube: str, group: str) -> bool:
        return self.source.forget_group(tube, group)

    async def aclose(self) -> None:
        self.source.close()


# --- a beanstalkd server -----------------------------------------------------------------------


async def drive(client: AsyncClient, steps: Steps[T]) -> T:
    """Run ``steps`` (``k7core.workers._beanstalk``) on an async client."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = steps.send(result) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            result, error = await client.call(call), None
        except Exception as exc:
            result, error = None, exc


class _BeanstalkSession:
    def __init__(self, source: AsyncBeanstalkSource) -> None:
        self._source = source
        self._client: AsyncClient | None = None
        self._watching: tuple[str, ...] = ("default",)

    async def _connected(self) -> AsyncClient:
        if self._client is None:
            self._client = await connect(self._source.address, timeout=self._source.timeout)
        return self._client

    async def reserve(self, tubes: tuple[str, ...], timeout: float | None
                      ) -> JobView | None:
        client = await self._connected()
        if tubes != self._watching:
            self._watching = await drive(client, watch_steps(self._watching, tubes))
        return await drive(client, reserve_steps(tubes, timeout, self._source.clock))

    async def delete(self, job: JobView) -> None:
        await (await self._connected()).delete(job.id)

    async def release(self, job: JobView, delay: float, error: str | None) -> int:
        return await drive(await self._connected(), release_steps(job, delay, error))

    async def bury(self, job: JobView, error: str) -> int:
        return await drive(await self._connected(), bury_steps(job, error))

    async def touch(self, job: JobView) -> float:
        return await drive(await self._connected(), touch_steps(job))

    async def take(self, job_id: int) -> JobView:
        return await drive(await self._connected(), take_steps(job_id, self._source.clock))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class AsyncBeanstalkSource:
    """A beanstalkd server (ours or beanstalkd itself) at ``address``: a connection per
    consumer slot (made at its first call), one more for puts and questions. ``timeout``:
    seconds a reply may take beyond what the server holds it for."""

    def __init__(self, address: str, *, timeout: float | None = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.address = address
        self.timeout = timeout
        self.clock = clock
        self._client: AsyncClient | None = None
        self._lock = anyio.Lock()

    def session(self) -> _BeanstalkSession:
        return _BeanstalkSession(self)

    async def _run(self, steps: Steps[T]) -> T:
        async with self._lock:  # a procedure's use() holds until its last call
            if self._client is None or self._client.closed:
                self._client = await connect(self.address, timeout=self.timeout)
            return await drive(self._client, steps)

    async def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
                  key: str | None, depends_on: Deps, group: str | None = None) -> int:
        return await self._run(put_steps(body, tube, priority, delay, ttr, key, depends_on,
                                         group))

    async def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return await self._run(buried_steps(tube, limit, self.clock))

    async def kick(self, tube: str, bound: int) -> int:
        return await self._run(kick_steps(tube, bound))

    async def exists(self, job_id: int) -> bool:
        return await self._run(exists_steps(job_id))

    async def counts(self) -> dict[str, dict[str, int]]:
        return await self._run(counts_steps())

    async def group_progress(self, tube: str, group: str) -> dict[str, int]:
        raise no_store_feature()

    async def forget_group(self, tube: str, group: str) -> bool:
        raise no_store_feature()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
