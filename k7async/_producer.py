"""Streams into a queue: ``sink`` (drain a receive stream) and ``producer_channel``."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import k7core

from ._bridge import Payload, core_queue
from ._errors import SinkBusyError
from ._writer import MAX_BATCH_MESSAGES, Job, QueueWriter, acquire_writer, release_writer

if TYPE_CHECKING:
    from ._queue import AsyncQueue

_sinks_lock = threading.Lock()
_sinks: weakref.WeakSet[k7core.Queue] = weakref.WeakSet()


def _drain_nowait(
    stream: MemoryObjectReceiveStream[Payload | _Stop], batch: list[Payload]
) -> bool:
    """Move what the stream holds now (buffer and blocked senders) into ``batch``.

    Returns True when the stream is over (a stop marker, or every sender closed).
    """
    over = False
    while True:
        try:
            item = stream.receive_nowait()
        except anyio.WouldBlock:
            return over
        except anyio.EndOfStream:
            return True
        if isinstance(item, _Stop):
            over = True  # keep draining: items sent before the stop was seen still count
        else:
            batch.append(item)


async def _gather(
    stream: MemoryObjectReceiveStream[Payload | _Stop], batch: list[Payload], target: int
) -> bool:
    """Drain the stream into ``batch``; while senders keep it busy, go on for a few more
    scheduler passes (up to ``target`` items) so that one thread hop carries many messages.

    The batch is complete when it holds ``target`` items or after a few passes that brought
    nothing (a few: a scheduler may run this task before the senders within a pass).
    Returns True when the stream is over. Call it shielded: it holds items already taken.
    """
    over = _drain_nowait(stream, batch)
    idle = 0
    while not over and len(batch) < target and idle < _IDLE_PASSES:
        had = len(batch)
        await anyio.lowlevel.checkpoint()
        over = _drain_nowait(stream, batch)
        idle = idle + 1 if len(batch) == had else 0
    return over


# ---------------------------------------------------------------------- sink


async def sink(
    queue: k7core.Queue | AsyncQueue, receive_stream: ObjectReceiveStream[Payload]
) -> int:
    """Drain ``receive_stream`` into ``queue`` until the stream ends; return how many messages
    were enqueued.

    Items are handed to the queue's writer thread in batches: everything a memory object
    stream holds when the sink takes from it goes in one ``enqueue_many``. The sink does not
    close the stream. One sink per queue at a time: a second raises :class:`SinkBusyError`.

    Cancelling the sink never loses an item it has taken from the stream: the batch in hand
    is written first, then the cancellation propagates.
    """
    core = core_queue(queue)
    with _sinks_lock:
        if core in _sinks:
            raise SinkBusyError(
                f"queue {core.path} already has a running sink",
                path=core.path,
                hint="one sink per queue: send into the running sink's stream instead",
            )
        _sinks.add(core)
    try:
        writer = acquire_writer(core)
        try:
            return await _sink(writer, receive_stream)
        finally:
            await release_writer(writer)
    finally:
        with _sinks_lock:
            _sinks.discard(core)


async def _sink(writer: QueueWriter, stream: ObjectReceiveStream[Payload]) -> int:
    memory = stream if isinstance(stream, MemoryObjectReceiveStream) else None
    target = 1
    if memory is not None:
        target = max(1, int(min(memory.statistics().max_buffer_size, MAX_BATCH_MESSAGES)))
    count = 0
    while True:
        try:
            first = await stream.receive()
        except anyio.EndOfStream:
            return count
        batch = [first]
        over = False
        if memory is not None:
            with anyio.CancelScope(shield=True):  # items taken are written, cancelled or not
                over = await _gather(memory, batch, target)
        job = Job(batch)
        writer.submit(job)
        await job.wait_shielded()
        count += len(batch)
        if over:
            return count


# ---------------------------------------------------------------------- producer channel


class _Stop:
    """Marker the channel's exit sends behind every item already sent."""

    __slots__ = ()


_STOP = _Stop()

_IDLE_PASSES = 3


class _Pump:
    """The task moving a producer channel's items to the writer thread, batch by batch."""

    def __init__(
        self,
        writer: QueueWriter,
        receive: MemoryObjectReceiveStream[Payload | _Stop],
        target: int,
    ) -> None:
        self.writer = writer
        self.receive = receive
        self.target = target
        self.done = anyio.Event()
        self.error: BaseException | None = None

    async def run(self) -> None:
        # Shielded: the pump ends when the channel's exit says so (the stop marker), never
        # because the surrounding scope was cancelled, so every sent item is written.
        with anyio.CancelScope(shield=True):
            try:
                await self._run()
            except BaseException as exc:
                self.error = exc
            finally:
                self.receive.close()  # senders still running get BrokenResourceError
                self.done.set()

    async def _run(self) -> None:
        receive = self.receive
        while True:
            batch: list[Payload] = []
            try:
                first = await receive.receive()
            except anyio.EndOfStream:
                return
            if isinstance(first, _Stop):
                _drain_nowait(receive, batch)
                over = True
            else:
                batch.append(first)
                over = await _gather(receive, batch, self.target)
            if over:
                # No checkpoint since the last receive_nowait: nothing can slip in between.
                receive.close()
            if batch:
                await self._write(batch)
            if over:
                return

    async def _write(self, batch: list[Payload]) -> None:
        job = Job(batch)
        self.writer.submit(job)
        try:
            await job.wait_shielded()
        except (TypeError, ValueError):
            # Refused as a whole (an item that is not bytes-like, a message too large):
            # nothing was written. Write item by item so everything sent before the
            # culprit gets in, then fail at the culprit.
            if len(batch) == 1:
                raise
            for item in batch:
                await self._write([item])
            raise  # pragma: no cover - one of the items failed above


@asynccontextmanager
async def producer_channel(
    queue: k7core.Queue | AsyncQueue, max_buffer_size: float = 256
) -> AsyncIterator[MemoryObjectSendStream[bytes]]:
    """Yield a send stream whose items are enqueued in ``queue``, in order, in batches.

    Any number of tasks may send (give each its own ``send.clone()``). The stream buffers up
    to ``max_buffer_size`` items; when the buffer is full, senders wait (back-pressure). A
    task moves what the buffer holds to the queue's writer thread in one batch (one
    ``enqueue_many``) and waits for it before taking the next.

    On exit (normal, error or cancellation) every item whose ``send`` returned is in the queue
    (msync'd with ``fsync="sync"``) before this returns; senders still running afterwards get
    ``anyio.BrokenResourceError``. If the writer fails (for example an item that is not
    bytes-like), the channel closes, senders get ``BrokenResourceError`` and the exit raises
    the writer's error; the items sent before the failing one are written, the failing one
    and the items after it are not.
    """
    core = core_queue(queue)
    send, receive = anyio.create_memory_object_stream[Payload | _Stop](max_buffer_size)
    control = send.clone()
    writer = acquire_writer(core)
    target = max(1, int(min(max_buffer_size, MAX_BATCH_MESSAGES)))
    pump = _Pump(writer, receive, target)
    try:
        async with _alongside(pump.run):
            try:
                yield send
            finally:
                with anyio.CancelScope(shield=True):
                    send.close()
                    # Broken: the pump already stopped (after a writer error).
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await control.send(_STOP)
                    control.close()
                    await pump.done.wait()
    finally:
        send.close()
        control.close()
        receive.close()
        await release_writer(writer)
        if pump.error is not None:
            raise pump.error


@asynccontextmanager
async def _alongside(fn: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run ``fn`` in a task while the block runs, leaving the block's own exception as it is.

    A task group would wrap an exception raised in the block in an ExceptionGroup; the user's
    code inside ``async with producer_channel(...)`` should see its own exceptions unchanged.
    ``fn`` must not raise.
    """
    body_error: BaseException | None = None
    unwrapped: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(fn)
            try:
                yield
            except BaseException as exc:
                body_error = exc
                raise
    except BaseExceptionGroup as group:
        only_body = len(group.exceptions) == 1 and group.exceptions[0] is body_error
        if body_error is None or not only_body:
            raise
        unwrapped = body_error
    if unwrapped is not None:
        raise unwrapped  # outside the except block: keeps the exception's own __context__
