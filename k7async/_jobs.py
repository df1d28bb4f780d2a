"""``open_jobs`` and :class:`AsyncJobStore`: a :class:`k7core.jobs.JobStore` for async code.

The store's writes go through an owner thread (``k7async-jobs-<dir>``) that runs every
pending call of every task as one batch inside ``JobStore.batch()``: under ``fsync="sync"``
the calls of one batch share one msync, and each task gets its answer once its call is
durable. A reserve that has to wait runs in a worker thread of its own (anyio's), so waiting
reservers never hold up the owner thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from k7core.jobs import Job, JobOwner, JobStore

from ._bridge import run_in_thread
from ._owner import Call, Command, Gather, Owner

T = TypeVar("T")

_PutArgs = tuple[bytes, str, int, float, float, "str | None", tuple[int | tuple[str, str], ...],
                 "tuple[str, int] | None", bool, "str | None"]


class _Puts(Gather[JobStore, "int | BaseException"]):
    """The awaited puts of many tasks of one loop, run as one command (:meth:`Owner.gather`):
    one object, one round entry and one answer for the group instead of one per put. Each
    put's outcome is its own: its id, or the exception it raised (a bad argument, a missing
    dependency), which only its task raises."""

    __slots__ = ()

    def execute(self, store: JobStore) -> list[int | BaseException]:
        put = store.put
        out: list[int | BaseException] = []
        for body, tube, priority, delay, ttr, key, deps, mark, remember, group in self.items:
            try:
                out.append(put(body, tube=tube, priority=priority, delay=delay, ttr=ttr,
                               key=key, depends_on=deps, mark=mark, remember=remember,
                               group=group))
            except Exception as exc:  # the put's own failure, for its own task
                out.append(exc)
        return out


class _Notified(Call[JobStore, Any]):
    """A call answered by a callback on the owner thread once what it stored is durable
    (:meth:`AsyncJobStore.submit`), not through a round: for callers that are not tasks
    (a protocol's callbacks), which post the answer to their loop themselves."""

    __slots__ = ("notify",)

    def __init__(self, fn: Callable[[JobStore], Any],
                 notify: Callable[[Callable[[], Any]], object]) -> None:
        super().__init__(fn)
        self.notify = notify


def _in_one_batch(store: JobStore, commands: list[Command[JobStore, Any]]) -> list[Any]:
    """The batch hook: every pending call in one ``JobStore.batch()`` (one msync wait)."""
    try:
        with store.batch():
            for command in commands:
                command.run(store)
    except BaseException as exc:  # the msync failed: nothing of the batch is durable
        for command in commands:
            if type(command) is _Notified:
                command.set_error(exc)
                command.notify(command.result)
        raise
    for command in commands:
        if type(command) is _Notified:
            command.notify(command.result)
    return []


class AsyncJobStore:
    """Awaitable writes to a :class:`k7core.jobs.JobStore` (from :func:`open_jobs`); the
    reads (``peek``, ``stats``...) are quick and are called on :attr:`store` directly."""

    def __init__(self, store: JobStore, owner: Owner[JobStore]) -> None:
        self._store = store
        self._owner = owner

    @property
    def store(self) -> JobStore:
        """The store, for its reads (do not close it)."""
        return self._store

    @property
    def path(self) -> Path:
        return self._store.path

    async def run(self, fn: Callable[[JobStore], T]) -> T:
        """Run ``fn(store)`` on the owner thread, with the other calls of the moment (under
        ``"sync"`` they share one msync), and return its result once what it stored is
        durable. ``fn`` must not block (a reserve that waits belongs elsewhere). A task
        cancelled while it waits gets the cancellation at once; the call was handed over and
        still runs (only its result is lost), as with ``AsyncQueue.enqueue``."""
        return await self._owner.call(Call(fn), precheck=False)

    def submit(self, fn: Callable[[JobStore], T],
               notify: Callable[[Callable[[], T]], object]) -> None:
        """Run ``fn(store)`` on the owner thread, with the other calls of the moment, and
        call ``notify(result)`` on that thread once what it stored is durable (``result()``
        returns ``fn``'s value or raises its error). For code that is not
        a task (``notify`` posts to its loop); never blocks. Raises ClosedError once the
        store is closing."""
        self._owner.submit(_Notified(fn, notify), answer=False)

    async def put(
        self,
        body: bytes,
        *,
        tube: str = "default",
        priority: int = 1024,
        delay: float = 0.0,
        ttr: float = 60.0,
        key: str | None = None,
        depends_on: Iterable[int | tuple[str, str]] = (),
        mark: tuple[str, int] | None = None,
        remember: bool = False,
        group: str | None = None,
    ) -> int:
        """:meth:`JobStore.put` (``mark``, ``remember`` and ``group`` too): returns the id once the
        store's strategy holds the job. If the task is cancelled while it waits, the job may
        still be stored (its id is then unknown: use ``key`` to make a retried put safe)."""
        args: _PutArgs = (body, tube, priority, delay, ttr, key,
                          tuple(depends_on) if depends_on else (), mark, remember, group)
        command, index = self._owner.gather(_Puts, args)
        await command.wait()
        outcome = command.result()[index]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def delete(self, job_id: int) -> None:
        """:meth:`JobStore.delete`."""
        await self.run(lambda s: s.delete(job_id))

    async def forget(self, tube: str, keys: Iterable[str]) -> int:
        """:meth:`JobStore.forget`."""
        return await self.run(lambda s: s.forget(tube, keys))

    async def group_progress(self, tube: str, group: str) -> dict[str, int]:
        """:meth:`JobStore.group_progress`."""
        return await self.run(lambda s: s.group_progress(tube, group))

    async def forget_group(self, tube: str, group: str) -> bool:
        """:meth:`JobStore.forget_group`."""
        return await self.run(lambda s: s.forget_group(tube, group))

    async def kick(self, tube: str, bound: int) -> int:
        """:meth:`JobStore.kick`."""
        return await self.run(lambda s: s.kick(tube, bound))

    async def kick_job(self, job_id: int) -> None:
        """:meth:`JobStore.kick_job`."""
        await self.run(lambda s: s.kick_job(job_id))

    @asynccontextmanager
    async def owner(self) -> AsyncIterator[AsyncJobOwner]:
        """An owner of reservations (:meth:`JobStore.owner`), closed on exit: what it still
        holds is ready again at once."""
        jobs_owner = self._store.owner()
        try:
            yield AsyncJobOwner(self, jobs_owner)
        finally:
            jobs_owner.close()

    def __repr__(self) -> str:
        return f"<k7async.AsyncJobStore {str(self._store.path)!r}>"


class AsyncJobOwner:
    """Awaitable calls of one :class:`k7core.jobs.JobOwner` (from
    :meth:`AsyncJobStore.owner`)."""

    def __init__(self, store: AsyncJobStore, owner: JobOwner) -> None:
        self._store = store
        self._owner = owner

    @property
    def owner(self) -> JobOwner:
        return self._owner

    async def reserve(
        self, tubes: Iterable[str] = ("default",), timeout: float | None = None
    ) -> Job | None:
        """:meth:`JobOwner.reserve`. A reserve that must wait does so in a worker thread; if
        the task is cancelled meanwhile, a job that thread still reserves is released."""
        names = (tubes,) if isinstance(tubes, str) else tuple(tubes)
        job = self._owner.reserve(names, timeout=0)  # at once when a job is ready
        if job is not None or timeout == 0:
            return job
        lock = threading.Lock()
        cancelled = False

        def wait() -> Job | None:
            got = self._owner.reserve(names, timeout=timeout)
            with lock:
                if cancelled and got is not None:
                    self._owner.release(got.id)  # nobody is left to take it
                    return None
            return got

        try:
            return await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with lock:
                cancelled = True
            raise

    async def delete(self, job_id: int) -> None:
        await self._store.run(lambda s: self._owner.delete(job_id))

    async def release(
        self, job_id: int, *, priority: int | None = None, delay: float = 0.0,
        error: str | None = None,
    ) -> None:
        await self._store.run(
            lambda s: self._owner.release(job_id, priority=priority, delay=delay, error=error))

    async def bury(
        self, job_id: int, *, priority: int | None = None, error: str | None = None
    ) -> None:
        await self._store.run(
            lambda s: self._owner.bury(job_id, priority=priority, error=error))

    async def touch(self, job_id: int) -> None:
        await self._store.run(lambda s: self._owner.touch(job_id))


@asynccontextmanager
async def open_jobs(path: str | os.PathLike[str], **opts: Any) -> AsyncIterator[AsyncJobStore]:
    """Open a :class:`k7core.jobs.JobStore` (``opts`` are its keyword arguments) for async
    code; close it on exit, after the calls already handed over. Opening (which replays the
    journal) and closing run in a short-lived thread, not in the event loop."""
    store = await run_in_thread(lambda: JobStore(path, **opts), "k7async-open")
    owner: Owner[JobStore] = Owner(lambda: store, name=f"k7async-jobs-{store.path.name}",
                                   batch=_in_one_batch)
    try:
        yield AsyncJobStore(store, owner)
    finally:
        try:
            await owner.aclose()
        finally:
            await run_in_thread(store.close, "k7async-close")
