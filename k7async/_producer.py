"""Streams into a queue: ``sink`` (drain a receive stream) and ``producer_channel``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._bridge import Pace
from ._errors import StreamClosedError
from ._registry import QUEUES
from ._types import Payload, QueueSource, core_queue
from ._writer import MAX_BATCH_MESSAGES, Append, Writer

T_contra = TypeVar("T_contra", contravariant=True)


class Room:
    """Where the senders of a producer channel wait for room in its full buffer: one event
    for all of them, set each time the channel's pump takes items (or waits for some).

    anyio's own ``send`` parks each waiting sender with an event of its own, a full
    checkpoint and a hand-over of its item; with many senders and a small buffer that costs
    more than the messages do. Here a waiting sender tries again once there is room.
    """

    __slots__ = ("_event", "handover")

    def __init__(self, handover: bool = False) -> None:
        self._event: anyio.Event | None = None
        self.handover = handover
        """A buffer of 0: an item goes to the pump only while it waits to receive, so a
        sender waits as anyio's own ``send`` does (handed over, not tried again)."""

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


def drain_nowait(
    stream: MemoryObjectReceiveStream[Payload | Stop],
    batch: list[Payload],
    room: Room | None = None,
) -> bool:
    """Move what the stream holds now (buffer and blocked senders) into ``batch``; tell the
    senders waiting in ``room`` that there is room again.

    Returns True when the stream is over (a stop marker, or every sender closed).
    """
    over = False
    taken = len(batch)
    while True:
        try:
            item = stream.receive_nowait()
        except anyio.WouldBlock:
            break
        except anyio.EndOfStream:
            over = True
            break
        if isinstance(item, Stop):
            over = True  # keep draining: items sent before the stop was seen still count
        else:
            batch.append(item)
    if room is not None and len(batch) > taken:
        room.notify()
    return over


async def gather_batch(
    stream: MemoryObjectReceiveStream[Payload | Stop],
    batch: list[Payload],
    target: int,
    room: Room | None = None,
) -> bool:
    """Drain the stream into ``batch``; while senders keep it busy, go on for a few more
    scheduler passes (up to ``target`` items) so that one thread hop carries many messages.

    The batch is complete when it holds ``target`` items or after a few passes that brought
    nothing (a few: a scheduler may run this task before the senders within a pass).
    Returns True when the stream is over. Call it shielded: it holds items already taken.
    """
    over = drain_nowait(stream, batch, room)
    idle = 0
    while not over and len(batch) < target and idle < _IDLE_PASSES:
        had = len(batch)
        await anyio.lowlevel.checkpoint()
        over = drain_nowait(stream, batch, room)
        idle = idle + 1 if len(batch) == had else 0
    return over


async def take_batch(
    receive: MemoryObjectReceiveStream[Any],
    room: Room,
    target: int,
    idle: Callable[[], Awaitable[bool]] | None = None,
) -> tuple[list[Any], bool] | None:
    """A pump's next batch from its channel, and whether the channel is over (then closed);
    None when the channel ended with nothing more. When nothing is at hand, ``idle`` (if
    given) is awaited first: True means it did some work, so look again before waiting.
    Call it shielded: it holds items already taken."""
    while True:
        batch: list[Any] = []
        over = drain_nowait(receive, batch, room)
        if not batch and not over:  # nothing at hand
            if idle is not None and await idle():
                continue
            room.notify()  # (a buffer of 0: senders hand items to a waiting pump)
            try:
                first = await receive.receive()  # wait for a sender
            except anyio.EndOfStream:
                return None
            if isinstance(first, Stop):
                over = drain_nowait(receive, batch, room) or True
            else:
                batch.append(first)
        if batch and not over:
            over = await gather_batch(receive, batch, target, room)
        if over:
            # No checkpoint since the last receive_nowait: nothing can slip in between.
            receive.close()
        return batch, over


# ---------------------------------------------------------------------- sink


async def sink(queue: QueueSource, receive_stream: ObjectReceiveStream[Payload]) -> int:
    """Drain ``receive_stream`` into ``queue`` until the stream ends; return how many messages
    were enqueued.

    Items are handed to the queue's writer thread in batches: everything a memory object
    stream holds when the sink takes from it goes in one ``enqueue_many``. The sink does not
    close the stream. One sink per queue at a time: a second raises :class:`SinkBusyError`.

    Cancelling the sink never loses an item it has taken from the stream: the batch in hand
    is written first, then the cancellation propagates.
    """
    core = core_queue(queue)
    with QUEUES.sink(core):
        async with QUEUES.writing(core) as writer:
            return await _sink(writer, receive_stream)


async def _sink(writer: Writer, stream: ObjectReceiveStream[Payload]) -> int:
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
                over = await gather_batch(memory, batch, target)
        await writer.append(batch, shield=True)
        count += len(batch)
        if over:
            return count


# ---------------------------------------------------------------------- producer channel


class Stop:
    """Marker the channel's exit sends behind every item already sent."""

    __slots__ = ()


STOP = Stop()

_IDLE_PASSES = 3


class _Pump:
    """The task moving a producer channel's items to the writer thread, batch by batch.

    One batch is in the writer's hands at a time. While it is written, the pump gathers the
    next one from the stream (up to ``target`` items, then it waits for the writer), and
    senders fill the stream's buffer again: at most about three buffers of items are in
    memory, and a batch grows with the writer's latency (group commit).
    """

    def __init__(
        self,
        writer: Writer,
        receive: MemoryObjectReceiveStream[Payload | Stop],
        target: int,
        room: Room,
    ) -> None:
        self.target = target
        self.room = room
        self.writer = writer
        self.receive = receive
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
                self.room.notify()
                self.done.set()

    async def _run(self) -> None:
        inflight: tuple[Append, list[Payload]] | None = None

        async def settle() -> bool:  # nothing at hand: finish the batch in flight first
            nonlocal inflight
            if inflight is None:
                return False
            await self._settle(*inflight)
            inflight = None
            return True

        while True:
            got = await take_batch(self.receive, self.room, self.target, settle)
            if got is None:
                return
            batch, over = got
            if inflight is not None:
                await self._settle(*inflight)
                inflight = None
            if batch:
                inflight = (self.writer.submit(batch), batch)
            if over:
                if inflight is not None:
                    await self._settle(*inflight)
                return

    async def _settle(self, append: Append, batch: list[Payload]) -> None:
        """Wait for a batch handed to the writer; raise its error."""
        await append.wait(shield=True)
        error = append.error
        if isinstance(error, (TypeError, ValueError)) and len(batch) > 1:
            # Refused as a whole (an item that is not bytes-like, a message too large):
            # nothing was written. Write item by item so everything sent before the
            # culprit gets in, then fail at the culprit.
            for item in batch:
                await self.writer.append([item], shield=True)
        append.result()


_send_nowait = MemoryObjectSendStream.send_nowait  # anyio's, under the override below


@dataclass(eq=False)
class ChannelSendStream(MemoryObjectSendStream[T_contra]):
    """A producer channel's send stream: anyio's memory object send stream (same buffer,
    clones, closing and errors) whose ``send`` is paced by :class:`Pace`: a cancel point at
    every call, a schedule point at least every ``SCHEDULE_EVERY`` calls and whenever it
    waits for room, instead of a full checkpoint per message. Senders waiting for room in a
    full buffer wait together (:class:`Room`)."""

    _room: Room = field(default_factory=Room)  # shared by the clones
    _pace: Pace = field(init=False, default_factory=Pace)

    @classmethod
    def _over(cls, stream: MemoryObjectSendStream[T_contra]) -> ChannelSendStream[T_contra]:
        """A paced stream onto ``stream``'s buffer; ``stream`` is closed (this replaces it)."""
        paced = cls(_state=stream._state, _room=Room(stream.statistics().max_buffer_size == 0))
        stream.close()
        return paced

    async def send(self, item: T_contra) -> None:
        await self._pace.checkpoint()  # a cancel point; a schedule point now and then
        try:
            while True:
                try:
                    _send_nowait(self, item)  # or the stream's errors: closed, broken
                    return
                except anyio.WouldBlock:
                    if self._room.handover:
                        await super().send(item)  # a full checkpoint, then the hand-over
                        self._pace.scheduled()
                        return
                    await self._room.wait()  # cancellable: the item is not sent
                    self._pace.scheduled()
        except anyio.ClosedResourceError:
            raise StreamClosedError("this producer channel") from None

    def send_nowait(self, item: T_contra) -> None:
        try:
            _send_nowait(self, item)
        except anyio.ClosedResourceError:
            raise StreamClosedError("this producer channel") from None

    def clone(self) -> ChannelSendStream[T_contra]:
        if self._closed:
            raise StreamClosedError("this producer channel")
        return ChannelSendStream(_state=self._state, _room=self._room)

    def close(self) -> None:
        super().close()
        self._room.notify()  # a task waiting to send on this clone gets StreamClosedError


@asynccontextmanager
async def producer_channel(
    queue: QueueSource, max_buffer_size: float = 256
) -> AsyncIterator[MemoryObjectSendStream[bytes]]:
    """Yield a send stream whose items are enqueued in ``queue``, in order, in batches.

    Any number of tasks may send (give each its own ``send.clone()``). The stream buffers up
    to ``max_buffer_size`` items; when the buffer is full, senders wait (back-pressure). A
    task moves what the buffer holds to the queue's writer thread in one batch (one
    ``enqueue_many``) and waits for it before taking the next. ``send`` is a cancel point at
    every call and a schedule point at least every 64 calls (see :class:`ChannelSendStream`).

    On exit (normal, error or cancellation) every item whose ``send`` returned is in the queue
    (msync'd with ``fsync="sync"``) before this returns; senders still running afterwards get
    ``anyio.BrokenResourceError``. If the writer fails (for example an item that is not
    bytes-like), the channel closes, senders get ``BrokenResourceError`` and the exit raises
    the writer's error; the items sent before the failing one are written, the failing one
    and the items after it are not.
    """
    core = core_queue(queue)
    plain, receive = anyio.create_memory_object_stream[Payload | Stop](max_buffer_size)
    send = ChannelSendStream._over(plain)
    control = send.clone()
    pump: _Pump | None = None
    try:
        async with QUEUES.writing(core) as writer:
            pump = _Pump(
                writer, receive, max(1, int(min(max_buffer_size, MAX_BATCH_MESSAGES))), send._room
            )
            try:
                async with alongside(pump.run):
                    try:
                        yield send
                    finally:
                        with anyio.CancelScope(shield=True):
                            send.close()
                            # Broken: the pump already stopped (after a writer error).
                            with contextlib.suppress(
                                anyio.BrokenResourceError, anyio.ClosedResourceError
                            ):
                                await control.send(STOP)
                            control.close()
                            await pump.done.wait()
            finally:
                send.close()
                control.close()
                receive.close()
    finally:
        if pump is not None and pump.error is not None:
            raise pump.error


@asynccontextmanager
async def alongside(fn: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
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
