"""Which k7async services each :class:`k7core.Queue` has: its shared writer, its sink."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import k7core

from ._errors import SinkBusyError
from ._types import QueueSource, core_queue
from ._writer import QueueWriter, Writer


class QueueRegistry:
    """The writer thread serving each queue, and which queues have a running sink.

    Every k7async object writing to one :class:`k7core.Queue` (producer channels, sinks,
    AsyncQueues, from any event loops and threads) shares one writer: the first one to use
    the queue starts it, the last one to leave stops and joins it: an entry lives exactly as
    long as some k7async object uses its queue. k7async keeps one registry for the process
    (:data:`QUEUES`): a queue object exists once in a process, so do its services.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[k7core.Queue, tuple[Writer, int]] = {}  # writer, users
        self._sinks: set[k7core.Queue] = set()

    def writer(self, queue: k7core.Queue) -> QueueWriter | None:
        """The writer serving ``queue`` now, or None when no k7async object uses it."""
        with self._lock:
            entry = self._writers.get(queue)
        return entry[0].face if entry else None

    @asynccontextmanager
    async def writing(self, queue: k7core.Queue) -> AsyncIterator[Writer]:
        """Use the queue's writer (starting it if it has none) for the block's duration.

        Leaving the last block stops the writer once what it was handed is written, and
        joins its thread. Each user waits for its own writes before it leaves, so a writer
        started meanwhile never writes while the old one still does.
        """
        writer = self._acquire(queue)
        try:
            yield writer
        finally:
            if self._release(writer):
                await writer.aclose()

    def _acquire(self, queue: k7core.Queue) -> Writer:
        with self._lock:
            entry = self._writers.get(queue)
            if entry is None:
                entry = (Writer(queue), 0)
            self._writers[queue] = (entry[0], entry[1] + 1)
            return entry[0]

    def _release(self, writer: Writer) -> bool:
        """Drop a reference; True if it was the last one (the caller closes the writer)."""
        with self._lock:
            _, refs = self._writers[writer.queue]
            if refs > 1:
                self._writers[writer.queue] = (writer, refs - 1)
                return False
            del self._writers[writer.queue]
            return True

    @contextmanager
    def sink(self, queue: k7core.Queue) -> Iterator[None]:
        """Hold ``queue``'s sink for the block; raise :class:`SinkBusyError` if one runs."""
        with self._lock:
            if queue in self._sinks:
                raise SinkBusyError(
                    f"queue {queue.path} already has a running sink",
                    path=queue.path,
                    hint="one sink per queue: send into the running sink's stream instead",
                )
            self._sinks.add(queue)
        try:
            yield
        finally:
            with self._lock:
                self._sinks.discard(queue)


QUEUES = QueueRegistry()
"""The process's registry (lives as long as the interpreter; each entry as its users)."""


def queue_writer(queue: QueueSource) -> QueueWriter | None:
    """The writer thread currently serving ``queue``, or None when no k7async object uses it."""
    return QUEUES.writer(core_queue(queue))
