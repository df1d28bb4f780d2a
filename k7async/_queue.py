"""``open_queue`` and :class:`AsyncQueue`: awaitable writes with group commit."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from anyio.streams.memory import MemoryObjectSendStream

import k7core
from k7core import Fsync

from ._bridge import run_in_thread
from ._consumer import MessageStream, consumer_group_channel
from ._producer import producer_channel
from ._registry import QUEUES
from ._types import Payload
from ._writer import QueueWriter, Writer, as_batch


class AsyncQueue:
    """A :class:`k7core.Queue` for async code: ``await enqueue(...)`` returns the offset once
    the queue's strategy holds the message (with ``fsync="sync"``: once msync'd).

    Every write goes through the queue's writer thread, which appends everything pending in
    one ``enqueue_many``; concurrent awaiting tasks share kernel calls and msyncs (group
    commit). Obtained from :func:`open_queue`.
    """

    def __init__(self, queue: k7core.Queue, writer: Writer) -> None:
        self._queue = queue
        self._writer = writer
        self._closed = False
        self._max_message = queue.options.max_message_size

    @property
    def queue(self) -> k7core.Queue:
        """The underlying queue (for ``end``, ``read_columnar``, ...; do not close it)."""
        return self._queue

    @property
    def writer(self) -> QueueWriter:
        """The writer thread serving this queue (``batches`` / ``messages`` counters)."""
        return self._writer.face

    @property
    def path(self) -> Path:
        return self._queue.path

    @property
    def fsync(self) -> Fsync:
        return self._queue.fsync

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise k7core.ClosedError(
                f"async queue {self._queue.path} is closed", path=self._queue.path
            )

    async def enqueue(self, data: Payload) -> int:
        """Append one message; return its global offset once the strategy holds it.

        If the awaiting task is cancelled (even before the call), the message may still be
        written (it was handed to the writer thread); only its offset is unknown. The
        awaiting tasks of one event loop share one wake-up per batch.
        """
        self._check_open()
        if type(data) is bytes and len(data) <= self._max_message:
            command, index = self._writer.submit_checked(data)  # no cancellation check first
            await command.wait()
            return command.result()[index]
        return await self._writer.append_one(data)  # k7core's own checks and errors

    async def enqueue_many(self, items: Iterable[Payload]) -> list[int]:
        """Append a batch as one unit (consecutive, in order); return the offsets."""
        self._check_open()
        return await self._writer.append(as_batch(items))

    def producer_channel(
        self, max_buffer_size: float = 256
    ) -> AbstractAsyncContextManager[MemoryObjectSendStream[bytes]]:
        """:func:`k7async.producer_channel` on this queue (shares its writer thread)."""
        return producer_channel(self, max_buffer_size)

    def consumer_group_channel(
        self,
        group: str,
        *,
        max_batch: int = 64,
        timeout: float = 0.005,
        auto_ack: bool = True,
        cursor_fsync: str | Fsync = "async",
    ) -> AbstractAsyncContextManager[MessageStream]:
        """:func:`k7async.consumer_group_channel` on this queue."""
        return consumer_group_channel(
            self, group, max_batch=max_batch, timeout=timeout, auto_ack=auto_ack,
            cursor_fsync=cursor_fsync,
        )

    def __repr__(self) -> str:
        return f"<k7async.AsyncQueue {str(self._queue.path)!r} {self._queue.fsync.value}>"


@asynccontextmanager
async def open_queue(
    path: str | os.PathLike[str] | k7core.Queue, **opts: Any
) -> AsyncIterator[AsyncQueue]:
    """Open (create or recover) a queue for async code; close it on exit.

    ``opts`` are :class:`k7core.Queue`'s keyword arguments (``fsync``, ``segment_size``,
    ``commit_interval``, ``readonly``, ``writers="shared"`` for several writing processes).
    Opening (recovery) and closing (final msync) run in a short-lived thread, not in the
    event loop. Given an open :class:`k7core.Queue` instead of a path, it is used as it is
    (no ``opts``) and left open on exit.

    On exit, every write already handed over completes first, even when the exit is a
    cancellation; ``enqueue`` afterwards raises :class:`k7core.ClosedError`.
    """
    if isinstance(path, k7core.Queue):
        if opts:
            raise TypeError("open_queue(queue) takes no options: the queue is already open")
        async with _serve(path) as aqueue:
            yield aqueue
        return
    queue = await run_in_thread(lambda: k7core.Queue(path, **opts), "k7async-open")
    try:
        async with _serve(queue) as aqueue:
            yield aqueue
    finally:
        await run_in_thread(queue.close, "k7async-close")


@asynccontextmanager
async def _serve(queue: k7core.Queue) -> AsyncIterator[AsyncQueue]:
    async with QUEUES.writing(queue) as writer:
        aqueue = AsyncQueue(queue, writer)
        try:
            yield aqueue
        finally:
            aqueue._closed = True
            await writer.drain()  # writes handed over (by tasks cancelled since) complete
