"""The writer thread of a queue: an :class:`Owner` of the :class:`k7core.Queue` whose batch
hook appends every pending write with one ``enqueue_many``.

``enqueue`` is single-writer in k7core, so every async write to a queue goes through one
thread. Concurrent awaiting producers therefore share kernel calls and, with
``fsync="sync"``, msyncs (group commit); a producer channel hands over a whole batch at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import k7core

from ._owner import Call, Command, Gather, Owner
from ._types import Payload

MAX_BATCH_MESSAGES = 65536
"""The writer stops adding writes to one ``enqueue_many`` once it holds this many messages
(a write is never split: a larger one is appended alone, in one call)."""


class Append(Gather[k7core.Queue, int]):
    """Messages to append as one unit (consecutive offsets, in order)."""

    __slots__ = ()

    def execute(self, queue: k7core.Queue) -> list[int]:
        return queue.enqueue_many(self.items) if self.items else []


class AppendGathered(Append):
    """Single messages of many awaiting tasks of one loop, appended as one unit: each task
    takes its offset by index (:meth:`Owner.gather`). The tasks checked their messages."""

    __slots__ = ()


class AppendOne(Command[k7core.Queue, int]):
    """One message to append (an awaited ``enqueue``)."""

    __slots__ = ("item",)

    def __init__(self, item: Payload) -> None:
        super().__init__()
        self.item = item

    def execute(self, queue: k7core.Queue) -> int:
        return queue.enqueue(self.item)


def as_batch(items: Iterable[Payload]) -> list[Payload]:
    """``items`` as a list the writer can merge, taken in the caller's task (a generator is
    consumed there, a list copied). What ``enqueue_many`` refuses as a whole (one bytes-like
    object, a str, a non-iterable) is passed on as it is, so that the writer raises
    ``enqueue_many``'s own error for it."""
    if isinstance(items, (bytes, bytearray, memoryview, str)):
        return items  # type: ignore[return-value]
    try:
        iterator = iter(items)
    except TypeError:
        return items  # type: ignore[return-value]
    return list(iterator)


class QueueWriter:
    """The writer thread of one :class:`k7core.Queue` (thread ``k7async-writer-<dir>``), as
    users see it: which queue, its counters, whether it runs.

    Obtained through :func:`k7async.queue_writer` or :attr:`k7async.AsyncQueue.writer`; it
    runs while any k7async object (producer channel, sink, AsyncQueue) uses the queue.
    ``batches`` counts the appending calls it made (with ``fsync="sync"``: msyncs),
    ``messages`` what they appended.
    """

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    @property
    def queue(self) -> k7core.Queue:
        return self._writer.queue

    @property
    def batches(self) -> int:
        """Appending calls made so far (with ``fsync="sync"``: msyncs)."""
        return self._writer.batches

    @property
    def messages(self) -> int:
        """Messages appended so far."""
        return self._writer.messages

    @property
    def running(self) -> bool:
        return self._writer.running

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<k7async.QueueWriter {str(self.queue.path)!r} {state} "
            f"batches={self.batches} messages={self.messages}>"
        )


class Writer:
    """The writer thread of one queue: an owner thread of the queue whose batch hook appends
    runs of pending writes with one ``enqueue_many`` each. Used by the producer channels,
    sinks and AsyncQueues of the queue (through :class:`QueueRegistry`); ``face`` is what
    users see of it."""

    def __init__(self, queue: k7core.Queue) -> None:
        self._queue = queue
        self._batches = 0
        self._messages = 0
        self._owner: Owner[k7core.Queue] = Owner(
            lambda: queue, name=f"k7async-writer-{queue.path.name}", batch=self._write
        )
        self.face = QueueWriter(self)

    @property
    def queue(self) -> k7core.Queue:
        return self._queue

    @property
    def batches(self) -> int:
        """Appending calls made so far (with ``fsync="sync"``: msyncs)."""
        return self._batches

    @property
    def messages(self) -> int:
        """Messages appended so far."""
        return self._messages

    @property
    def running(self) -> bool:
        return self._owner.running

    def submit(self, items: list[Payload]) -> Append:
        """Hand ``items`` over to be appended as one unit; await ``wait()`` on the result in
        this loop for the outcome (the offsets or the error)."""
        return self._owner.submit(Append(items))

    async def append(self, items: list[Payload], *, shield: bool = False) -> list[int]:
        """Append ``items`` as one unit; return their offsets once the queue's strategy holds
        them. See :meth:`Owner.call` for cancellation (and ``shield``)."""
        return await self._owner.call(Append(items), shield=shield)

    async def append_one(self, item: Payload) -> int:
        """Append one message; the awaiting tasks of one loop share one wake-up per batch.
        No cancellation check before the hand-over (the per-message path)."""
        return await self._owner.call(AppendOne(item), precheck=False)

    def submit_checked(self, item: bytes) -> tuple[AppendGathered, int]:
        """Hand over one message the caller has checked (bytes that fit a segment); await
        ``wait()`` on the command, then its offset is ``result()[index]``. The awaiting
        tasks of one loop share one command, one wake-up and one answer per batch."""
        return self._owner.gather(AppendGathered, item)

    async def drain(self) -> None:
        """Wait (shielded) until every write handed over before this call has completed."""
        barrier: Call[k7core.Queue, None] = Call(_nothing)
        self._owner.submit(barrier)  # the thread is FIFO: once it is done, all before it are
        await barrier.wait(shield=True)

    async def aclose(self) -> None:
        """Stop the thread once what was handed over is written, and join it."""
        await self._owner.aclose()

    # ------------------------------------------------------------------ the thread

    def _count(self, messages: int) -> None:
        self._batches += 1
        self._messages += messages

    def _write(
        self, queue: k7core.Queue, commands: list[Command[k7core.Queue, Any]]
    ) -> list[Command[k7core.Queue, Any]]:
        """Batch hook: runs of consecutive appends go in one ``enqueue_many`` each."""
        run: list[Append | AppendOne] = []
        size = 0
        for command in commands:
            if isinstance(command, AppendOne) or (
                isinstance(command, Append) and isinstance(command.items, list)
            ):
                n = len(command.items) if isinstance(command, Append) else 1
                if run and size + n > MAX_BATCH_MESSAGES:
                    self._append(queue, run)
                    run, size = [], 0
                run.append(command)
                size += n
            else:
                self._append(queue, run)
                run, size = [], 0
                command.run(queue)
        self._append(queue, run)
        return []

    def _append_alone(self, queue: k7core.Queue, command: Append | AppendOne) -> None:
        command.run(queue)
        if command.error is None:
            n = len(command.items) if isinstance(command, Append) else 1
            if n:
                self._count(n)

    def _append(self, queue: k7core.Queue, run: list[Append | AppendOne]) -> None:
        if len(run) <= 1:
            for command in run:
                self._append_alone(queue, command)
            return
        items: list[Payload] = []
        for command in run:
            if isinstance(command, AppendOne):
                items.append(command.item)
            else:
                items.extend(command.items)
        try:
            offsets = queue.enqueue_many(items)
        except (TypeError, ValueError):
            # k7core refuses such a batch as a whole before writing anything (an item that is
            # not bytes-like, a message too large): write one by one so only culprits fail.
            for command in run:
                self._append_alone(queue, command)
            return
        except BaseException as exc:  # storage error, closed queue: every write is affected
            for command in run:
                command.set_error(exc)
            return
        self._count(len(items))
        start = 0
        for command in run:
            if isinstance(command, AppendOne):
                command.set_result(offsets[start])
                start += 1
            else:
                end = start + len(command.items)
                command.set_result(offsets[start:end])
                start = end

    def __repr__(self) -> str:
        return f"<k7async writer of {str(self._queue.path)!r}>"


def _nothing(queue: k7core.Queue) -> None:
    return None
