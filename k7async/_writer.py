"""The writer thread: one per queue, shared by every k7async user of that queue.

``enqueue`` is single-writer in k7core, so every async write to a queue goes through one
plain ``threading.Thread``. Users hand it *jobs* (a list of payloads plus an event to set);
the thread takes every job pending at once, appends them with **one** ``enqueue_many`` call
(one kernel call per segment; with ``fsync="sync"`` one msync), then resolves all of them
with one callback per event loop. Concurrent awaiting producers therefore share kernel calls
and msyncs (group commit).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from itertools import chain
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

import k7core

from ._bridge import Payload, core_queue, notify, post

if TYPE_CHECKING:
    from ._queue import AsyncQueue

MAX_BATCH_MESSAGES = 65536
"""The writer stops adding jobs to a batch once it holds this many messages (jobs are never
split: a larger job is written alone, in one call)."""


class Job:
    """Payloads handed to the writer, and the outcome it reports back (offsets or an error).

    Created in the event loop that awaits it; ``event`` is set in that loop once ``offsets``
    or ``error`` is final.
    """

    __slots__ = ("error", "event", "items", "offsets", "shared", "thread", "token")

    def __init__(
        self, items: list[Payload], token: EventLoopToken | None = None, *, shared: bool = False
    ) -> None:
        self.items = items
        self.token: EventLoopToken = token or anyio.lowlevel.current_token()
        self.shared = shared  # single messages of several tasks, appended while pending
        self.thread = threading.get_ident()  # the thread of the loop that awaits it
        self.event = anyio.Event()
        self.offsets: list[int] | None = None
        self.error: BaseException | None = None

    def result(self) -> list[int]:
        if self.error is not None:
            raise self.error
        assert self.offsets is not None
        return self.offsets

    async def wait(self) -> list[int]:
        """Wait for the outcome (cancellable: the job is still written if it gets there)."""
        await self.event.wait()
        return self.result()

    async def wait_shielded(self) -> list[int]:
        """Wait for the outcome even if cancelled (the caller must know what was written)."""
        with anyio.CancelScope(shield=True):
            await self.event.wait()
        return self.result()


def _set_events(jobs: list[Job]) -> None:
    for job in jobs:
        job.event.set()


class QueueWriter:
    """The dedicated writer thread of one :class:`k7core.Queue` (thread ``k7async-writer-*``).

    Obtained through :func:`k7async.queue_writer` or :attr:`k7async.AsyncQueue.writer`; it
    runs while any k7async object (producer channel, sink, AsyncQueue) uses the queue.
    ``batches`` counts the ``enqueue_many`` calls it made, ``messages`` what they appended.
    """

    def __init__(self, queue: k7core.Queue) -> None:
        self.queue = queue
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[Job] = deque()
        self._idle = False
        self._stopping = False
        self._exited = False
        self._on_exit: tuple[EventLoopToken, anyio.Event] | None = None
        self._refs = 0
        self._batches = 0
        self._messages = 0
        self._thread = threading.Thread(
            target=self._run, name=f"k7async-writer-{queue.path.name}", daemon=True
        )

    @property
    def batches(self) -> int:
        """``enqueue_many`` calls made so far (with ``fsync="sync"``: msyncs)."""
        return self._batches

    @property
    def messages(self) -> int:
        """Messages appended so far."""
        return self._messages

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        """Queue a job for the thread (never blocks; back-pressure is the caller's job)."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("this QueueWriter has stopped")
            self._pending.append(job)
            if self._idle:
                self._cond.notify()

    def submit_one(self, item: Payload) -> tuple[Job, int]:
        """Add one message to the shared job of the calling loop that still waits for the
        thread (or start one); return the job and the message's index in it.

        Awaiting writers of one loop thus cost one job, one event and one wake-up of the
        thread per batch instead of one each. A thread runs one event loop at a time, and a
        loop's jobs complete before its AsyncQueue closes, so a pending shared job of this
        thread belongs to the running loop. The caller has validated ``item``, so the job can
        only fail as a whole (a storage error, a closed queue).
        """
        tid = threading.get_ident()
        with self._cond:
            if self._stopping:
                raise RuntimeError("this QueueWriter has stopped")
            pending = self._pending
            if pending:
                job = pending[-1]
                if job.shared and job.thread == tid and len(job.items) < MAX_BATCH_MESSAGES:
                    job.items.append(item)
                    return job, len(job.items) - 1
        job = Job([item], shared=True)  # outside the lock: it looks the loop up
        self.submit(job)
        return job, 0

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        cond, pending = self._cond, self._pending
        try:
            while True:
                with cond:
                    while not pending:
                        if self._stopping:
                            return
                        self._idle = True
                        cond.wait()
                        self._idle = False
                    jobs = [pending.popleft()]
                    n = len(jobs[0].items)
                    while pending and n < MAX_BATCH_MESSAGES:
                        job = pending.popleft()
                        jobs.append(job)
                        n += len(job.items)
                self._write(jobs)
                self._resolve(jobs)
        finally:
            with cond:
                self._exited = True
                on_exit = self._on_exit
            if on_exit is not None:
                notify(on_exit[0], on_exit[1].set)

    def _enqueue(self, items: list[Payload]) -> list[int]:
        offsets = self.queue.enqueue_many(items)
        self._batches += 1
        self._messages += len(items)
        return offsets

    def _write_one(self, job: Job) -> None:
        try:
            job.offsets = self._enqueue(job.items) if job.items else []
        except BaseException as exc:
            job.error = exc

    def _write(self, jobs: list[Job]) -> None:
        if len(jobs) == 1:
            self._write_one(jobs[0])
            return
        items = list(chain.from_iterable(job.items for job in jobs))
        try:
            offsets = self._enqueue(items) if items else []
        except (TypeError, ValueError):
            # k7core refuses such a batch as a whole before writing anything (an item that is
            # not bytes-like, a message too large): write job by job so only culprits fail.
            for job in jobs:
                self._write_one(job)
            return
        except BaseException as exc:  # storage error, closed queue: every job is affected
            for job in jobs:
                job.error = exc
            return
        start = 0
        for job in jobs:
            end = start + len(job.items)
            job.offsets = offsets[start:end]
            start = end

    def _resolve(self, jobs: list[Job]) -> None:
        if len(jobs) == 1:
            post(jobs[0].token, _set_events, jobs)
            return
        by_loop: dict[EventLoopToken, list[Job]] = {}
        for job in jobs:
            by_loop.setdefault(job.token, []).append(job)
        for token, group in by_loop.items():
            post(token, _set_events, group)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<k7async.QueueWriter {str(self.queue.path)!r} {state} "
            f"batches={self._batches} messages={self._messages}>"
        )


# ---------------------------------------------------------------------- registry

_registry_lock = threading.Lock()
_writers: weakref.WeakKeyDictionary[k7core.Queue, QueueWriter] = weakref.WeakKeyDictionary()


def queue_writer(queue: k7core.Queue | AsyncQueue) -> QueueWriter | None:
    """The writer thread currently serving ``queue``, or None when no k7async object uses it."""
    core = core_queue(queue)
    with _registry_lock:
        return _writers.get(core)


def acquire_writer(queue: k7core.Queue) -> QueueWriter:
    """Take a reference to the queue's writer, starting its thread if it has none."""
    with _registry_lock:
        writer = _writers.get(queue)
        if writer is None:
            writer = QueueWriter(queue)
            writer._thread.start()
            _writers[queue] = writer
        writer._refs += 1
        return writer


async def release_writer(writer: QueueWriter) -> None:
    """Drop a reference; the last one stops the thread and waits until it has exited.

    Callers release only after their own jobs completed, so the thread is idle by then.
    """
    with _registry_lock:
        writer._refs -= 1
        if writer._refs:
            return
        if _writers.get(writer.queue) is writer:
            del _writers[writer.queue]
        stopped = anyio.Event()
        with writer._cond:
            writer._stopping = True
            if writer._exited:
                stopped.set()
            else:
                writer._on_exit = (anyio.lowlevel.current_token(), stopped)
                writer._cond.notify()
    with anyio.CancelScope(shield=True):
        await stopped.wait()
    writer._thread.join()
