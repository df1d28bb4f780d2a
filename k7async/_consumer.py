"""Streams out of a queue: ``consumer_group_channel``, served by a reader thread (an
:class:`Owner` of the consumer group)."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream

import k7core
from k7core import ConsumerGroup, Fsync, Message
from k7core._checks import check_count, check_seconds
from k7core._native._fast import message_offset

from ._bridge import Pace
from ._errors import AutoAckError, StreamClosedError
from ._owner import Call, Command, Owner
from ._types import QueueSource, core_queue

T = TypeVar("T")


class _Poll(Command[ConsumerGroup, list[Message]]):
    """A request for the next batch. The reader thread keeps it (parked, polling again after
    applying the acks posted meanwhile) until messages come or the stream asks it back."""

    __slots__ = ("stop",)

    def __init__(self) -> None:
        super().__init__()
        self.stop = False  # set in the loop: hand it back (empty) at the next chance


class _Control(Command[ConsumerGroup, None]):
    """An ack or a nack posted by the stream (no answer: applied before the next poll)."""

    __slots__ = ("nack", "offset")

    def __init__(self, offset: int, *, nack: bool) -> None:
        super().__init__()
        self.offset = offset
        self.nack = nack

    def execute(self, group: ConsumerGroup) -> None:
        if self.nack:
            group.nack(self.offset)
        else:
            group.ack(self.offset)


def _opened(group: ConsumerGroup) -> None:
    return None


def _close(group: ConsumerGroup) -> None:
    group.close()


class _Reader:
    """The thread that owns one consumer group (thread ``k7async-reader-<dir>-<group>``): it
    opens, polls, acks, nacks, seeks and closes it; no other thread touches the group."""

    def __init__(
        self,
        queue: k7core.Queue,
        group: str,
        *,
        max_batch: int,
        timeout: float,
        auto_ack: bool,
        cursor_fsync: str | Fsync,
    ) -> None:
        self.group = group
        self.max_batch = max_batch
        self.timeout = timeout
        self.auto_ack = auto_ack
        self.failure: BaseException | None = None  # an ack or nack failed (thread side)
        self.owner: Owner[ConsumerGroup] = Owner(
            lambda: queue.consumer_group(group, cursor_fsync=cursor_fsync),
            name=f"k7async-reader-{queue.path.name}-{group}",
            batch=self._serve,
            finish=_close,
        )

    def _serve(
        self, group: ConsumerGroup, commands: list[Command[ConsumerGroup, Any]]
    ) -> list[Command[ConsumerGroup, Any]]:
        """Batch hook: acks and nacks first (in order), then the poll, if one is asked for."""
        polls: list[_Poll] = []
        for command in commands:
            if isinstance(command, _Poll):
                polls.append(command)
                continue
            command.run(group)
            if isinstance(command, _Control) and command.error is not None:
                self.failure = self.failure or command.error
        parked: list[Command[ConsumerGroup, Any]] = []
        for poll in polls:
            if self.failure is not None:
                poll.set_error(self.failure)
            elif poll.stop or self.owner.closing:
                poll.set_result([])
            else:
                try:
                    batch = group.poll(self.max_batch, self.timeout)  # sleeps in C, no GIL
                    if batch and self.auto_ack:
                        group.ack_many(batch)  # before the hand-over: at-most-once, as k7
                except BaseException as exc:
                    poll.set_error(exc)
                    continue
                if batch:
                    poll.set_result(batch)
                else:
                    parked.append(poll)  # nothing yet: poll again, after what was posted
        return parked


class PolledStream(ObjectReceiveStream[T]):
    """The receiving half of a stream fed by a reader thread in batches, one batch asked for
    ahead (``MessageStream``, ``k7async.RecordStream``): subclasses say how a batch is asked
    for (``_ask``) and what a finished one holds (``_accept``).

    ``receive()`` is a cancel point at every call and a schedule point at least every 64
    calls and whenever it waits (not at every item: see docs/async.md);
    ``receive_batch()`` takes what is at hand in one call.
    """

    _what = "this stream"  # for StreamClosedError

    def __init__(self, owner: Owner[Any]) -> None:
        self._owner = owner
        self._current: deque[T] = deque()  # received from the thread, not handed out
        self._poll: Command[Any, Any] | None = None  # the batch asked for (one ahead)
        self._error: BaseException | None = None
        self._error_seen = False
        self._closed = False
        self._stopped: anyio.Event | None = None  # set once aclose() has finished
        self._pace = Pace()
        self._ask()

    def _ask(self) -> None:
        raise NotImplementedError

    def _accept(self, result: Any) -> Iterable[T]:
        """The items of a finished batch (``result``: what the poll command returned)."""
        raise NotImplementedError

    def _refill(self) -> None:
        """Fill ``_current`` from the batch that came in, or raise why it cannot be."""
        if self._closed:
            raise StreamClosedError(self._what)
        poll = self._poll
        if poll is not None and poll.done:
            self._poll = None
            if poll.error is not None:
                self._error = poll.error
            else:
                self._current.extend(self._accept(poll.result()))
                self._ask()  # the next batch is read while this one is worked through
            if self._current:
                return
        if self._error is not None:
            self._error_seen = True
            raise self._error
        if self._poll is None:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    def receive_nowait(self) -> T:
        """The next item if one is at hand, else ``anyio.WouldBlock``."""
        if self._closed or not self._current:
            self._refill()
        return self._current.popleft()

    def receive_batch_nowait(self) -> list[T]:
        """Every item at hand (the rest of the current batch, or the next batch)."""
        if self._closed or not self._current:
            self._refill()
        out = list(self._current)
        self._current.clear()
        return out

    async def receive(self) -> T:
        await self._pace.checkpoint()
        if self._current and not self._closed:
            return self._current.popleft()
        return await self._receive_waiting()

    async def __anext__(self) -> T:
        # receive() inlined: ``async for`` is the per-item path, one frame less counts
        await self._pace.checkpoint()
        if self._current and not self._closed:
            return self._current.popleft()
        try:
            return await self._receive_waiting()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def _receive_waiting(self) -> T:
        while True:
            try:
                return self.receive_nowait()
            except anyio.WouldBlock:
                await self._wait()

    async def receive_batch(self) -> list[T]:
        """Wait for items, then return every one at hand (at least one, in order)."""
        await anyio.lowlevel.checkpoint()
        while True:
            try:
                return self.receive_batch_nowait()
            except anyio.WouldBlock:
                await self._wait()

    async def _wait(self) -> None:
        assert self._poll is not None  # WouldBlock: a batch is asked for
        await self._poll.wait()
        self._pace.scheduled()


class MessageStream(PolledStream[Message]):
    """The receive stream of :func:`consumer_group_channel`: ``async for msg in stream``.

    Messages arrive in the order the group delivers them (a nacked message comes back
    first); receiving is :class:`PolledStream`'s. With ``auto_ack=False``, ``await
    ack(msg)`` / ``await nack(msg)`` are routed to the reader thread, which applies them in
    order before its next poll and before it closes the group.
    """

    _what = "this message stream"

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        super().__init__(reader.owner)

    @property
    def group(self) -> str:
        return self._reader.group

    @property
    def auto_ack(self) -> bool:
        return self._reader.auto_ack

    def _ask(self) -> None:
        self._poll = self._owner.submit(_Poll())

    def _accept(self, result: Any) -> Iterable[Message]:
        messages: list[Message] = result
        return messages

    async def ack(self, msg: Message | int) -> None:
        """Acknowledge a message (or offset) received from this stream (``auto_ack=False``).

        Applied by the reader thread before its next poll (within ``timeout``) and always
        before the group closes. Returns at once.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post(msg, nack=False)

    async def nack(self, msg: Message | int) -> None:
        """Have a received message delivered again, before newer ones (``auto_ack=False``)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post(msg, nack=True)

    def _post(self, msg: Message | int, *, nack: bool) -> None:
        if self._reader.auto_ack:
            raise AutoAckError(
                "this channel acks every message when it is handed over (auto_ack=True)",
                hint="open it with auto_ack=False to ack / nack yourself",
            )
        if self._closed:
            raise StreamClosedError("this message stream")
        if self._reader.failure is not None:
            raise anyio.BrokenResourceError("the reader thread failed to apply an ack or nack")
        offset = message_offset(msg)  # a TypeError here, not in the thread
        self._owner.submit(_Control(offset, nack=nack), answer=False)

    async def aclose(self) -> None:
        """Stop the reader thread and close the group (waits at most about ``timeout``).

        With ``auto_ack=True``, the messages acked on hand-over that were never received are
        handed back first (``seek`` to the first of them), so the group's next owner gets
        them.
        """
        if self._stopped is not None:  # closed, or closing in another task: wait for it
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()
            return
        self._stopped = anyio.Event()
        self._closed = True
        try:
            try:
                await self._hand_back()
            finally:
                await self._owner.aclose()  # applies the posted acks, closes the group, joins
        finally:
            self._stopped.set()

    async def _hand_back(self) -> None:
        poll, self._poll = self._poll, None
        if poll is not None:
            assert isinstance(poll, _Poll)
            poll.stop = True
            await poll.wait(shield=True)  # the thread hands it back within ``timeout``
            if poll.error is None:
                self._current.extend(poll.result())
            elif self._error is None:
                self._error = poll.error
        if self._reader.auto_ack and self._current:
            first = self._current[0].offset
            seek: Call[ConsumerGroup, None] = Call(lambda group: group.seek(first))
            await self._owner.call(seek, shield=True)
        self._current.clear()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._error else "open")
        return f"<k7async.MessageStream group={self._reader.group!r} {state}>"


@asynccontextmanager
async def consumer_group_channel(
    queue: QueueSource,
    group: str,
    *,
    max_batch: int = 64,
    timeout: float = 0.005,
    auto_ack: bool = True,
    cursor_fsync: str | Fsync = "async",
) -> AsyncIterator[MessageStream]:
    """Yield a :class:`MessageStream` of the messages of consumer group ``group``.

    A dedicated thread (``k7async-reader-*``) opens the group, polls it (``max_batch``,
    ``timeout``), hands each batch to the stream in one hop, and applies acks. It stays at
    most one batch ahead of the consumer (back-pressure).

    - ``auto_ack=True``: each batch is acked as it is handed over (acked first: at-most-once,
      as k7). Leaving the context hands back, with ``seek``, the messages that were acked but
      never received, so they are delivered again to the group's next owner.
    - ``auto_ack=False``: at-least-once. ``await stream.ack(msg)`` / ``await
      stream.nack(msg)``; whatever is not acked when the group closes is delivered again
      after a restart.

    Leaving the context (or cancelling it, or ``await stream.aclose()``) stops the thread
    within about ``timeout`` even if no data arrives, closes the group and joins the thread.
    An error in the thread (opening the group, a corrupt frame, a cursor msync) is raised by
    ``receive`` after the messages delivered before it, or else by the context's exit.
    """
    core = core_queue(queue)
    max_batch = check_count(max_batch, "max_batch")
    # bounded: the thread checks between polls whether to stop
    seconds = check_seconds(timeout, "timeout", 60, positive=True)
    reader = _Reader(
        core, group, max_batch=max_batch, timeout=seconds, auto_ack=auto_ack,
        cursor_fsync=cursor_fsync,
    )
    try:
        await reader.owner.call(Call(_opened), shield=True)  # the group's open error, if any
    except BaseException:
        await reader.owner.aclose()
        raise
    stream = MessageStream(reader)
    try:
        yield stream
    finally:
        await stream.aclose()
        if stream._error is not None and not stream._error_seen:
            stream._error_seen = True
            raise stream._error
