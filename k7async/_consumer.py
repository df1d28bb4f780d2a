"""Streams out of a queue: ``consumer_group_channel`` and the reader thread behind it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from anyio.abc import ObjectReceiveStream

import k7core
from k7core import ConsumerGroup, Fsync, Message
from k7core._checks import check_count, check_seconds
from k7core._native._fast import message_offset

from ._bridge import core_queue, notify

if TYPE_CHECKING:
    from ._queue import AsyncQueue

_ACK = 0
_NACK = 1

_PREFETCH = 1
"""Polled batches that may wait for the consumer besides the one it is working through."""


class _Reader:
    """The thread that owns one consumer group, and the loop-side state it feeds.

    Thread side: the group (poll, ack, nack, seek and close run only there). Loop side
    (touched only in the event loop, by callbacks the thread runs there): the batches
    delivered and not yet received. Shared, under ``cond``: credits (back-pressure), the
    stop flag and the acks / nacks posted by the async side.
    """

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
        self.queue = queue
        self.group = group
        self.max_batch = max_batch
        self.timeout = timeout
        self.auto_ack = auto_ack
        self.cursor_fsync = cursor_fsync
        self.token = anyio.lowlevel.current_token()
        # shared with the thread, under cond
        self.cond = threading.Condition(threading.Lock())
        self.credits = _PREFETCH
        self.stopping = False
        self.idle = False
        self.controls: list[tuple[int, int]] = []
        # written by the thread before it tells the loop (ready / ended)
        self.opened = False
        self.error: BaseException | None = None
        # loop side
        self.current: deque[Message] = deque()
        self.inbox: deque[list[Message]] = deque()
        self.waiters: set[anyio.Event] = set()
        self.ended = False
        self.error_seen = False
        self.ready = anyio.Event()
        self.finished = anyio.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"k7async-reader-{queue.path.name}-{group}", daemon=True
        )

    # ------------------------------------------------------------------ thread side

    def _run(self) -> None:
        group: ConsumerGroup | None = None
        try:
            try:
                group = self.queue.consumer_group(self.group, cursor_fsync=self.cursor_fsync)
                self.opened = True
            finally:
                notify(self.token, self.ready.set)
            self._serve(group)
        except BaseException as exc:
            self.error = exc
        finally:
            if group is not None:
                try:
                    self._close(group)
                except BaseException as exc:
                    self.error = self.error or exc
            notify(self.token, self._on_ended)

    def _serve(self, group: ConsumerGroup) -> None:
        cond, poll, ack_many = self.cond, group.poll, group.ack_many
        max_batch, timeout, auto_ack, token = (
            self.max_batch, self.timeout, self.auto_ack, self.token,
        )
        while True:
            with cond:
                while not (self.stopping or self.controls or self.credits):
                    self.idle = True
                    cond.wait()
                    self.idle = False
                if self.stopping:
                    return
                controls, self.controls = self.controls, []
                may_poll = self.credits > 0
                if may_poll:
                    self.credits -= 1
            if controls:
                self._apply(group, controls)
            if not may_poll:
                continue
            batch = poll(max_batch, timeout)  # sleeps in C, GIL released, up to timeout
            if not batch:
                with cond:
                    self.credits += 1
                continue
            if auto_ack:
                ack_many(batch)  # before the hand-over: at-most-once, as k7
            if not notify(token, self._deliver, batch):
                return

    @staticmethod
    def _apply(group: ConsumerGroup, controls: list[tuple[int, int]]) -> None:
        for op, offset in controls:
            if op == _ACK:
                group.ack(offset)
            else:
                group.nack(offset)

    def _close(self, group: ConsumerGroup) -> None:
        try:
            with self.cond:
                controls, self.controls = self.controls, []
            self._apply(group, controls)
            if self.auto_ack and self.stopping:
                # Stopped on purpose, the stream is closed: what was acked on hand-over but
                # never received is handed back, so the next owner of the group gets it.
                first: list[int] = []
                notify(self.token, self._first_unreceived, first)
                if first:
                    group.seek(first[0])
        finally:
            group.close()

    # ------------------------------------------------------------------ loop side

    def _deliver(self, batch: list[Message]) -> None:
        self.inbox.append(batch)
        self.wake()

    def _on_ended(self) -> None:
        self.ended = True
        self.finished.set()
        self.wake()

    def _first_unreceived(self, out: list[int]) -> None:
        if self.current:
            out.append(self.current[0].offset)
            return
        for batch in self.inbox:
            if batch:
                out.append(batch[0].offset)
                return

    def wake(self) -> None:
        for event in self.waiters:
            event.set()
        self.waiters.clear()

    def take_batch(self) -> bool:
        """Move the next delivered batch into ``current``; False if none is there."""
        if not self.inbox:
            return False
        self.current.extend(self.inbox.popleft())
        with self.cond:
            self.credits += 1
            if self.idle:
                self.cond.notify()
        return True

    def post(self, op: int, offset: int) -> None:
        with self.cond:
            self.controls.append((op, offset))
            if self.idle:
                self.cond.notify()

    async def stop(self) -> None:
        """Tell the thread to stop and wait until it has closed the group and exited.

        Bounded by the poll timeout (the thread checks between polls), not by new data.
        """
        with self.cond:
            self.stopping = True
            self.cond.notify()
        with anyio.CancelScope(shield=True):
            await self.finished.wait()
        self.thread.join()


class MessageStream(ObjectReceiveStream[Message]):
    """The receive stream of :func:`consumer_group_channel`: ``async for msg in stream``.

    Messages arrive in the order the group delivers them (a nacked message comes back
    first). ``receive_batch()`` takes what is at hand in one call. With ``auto_ack=False``,
    ``await ack(msg)`` / ``await nack(msg)`` are routed to the reader thread, which applies
    them in order before its next poll and before it closes the group.
    """

    def __init__(self, reader: _Reader) -> None:
        self._r = reader
        self._closed = False

    @property
    def group(self) -> str:
        return self._r.group

    @property
    def auto_ack(self) -> bool:
        return self._r.auto_ack

    def _refill(self) -> None:
        r = self._r
        if self._closed:
            raise anyio.ClosedResourceError
        if r.current or r.take_batch():
            return
        if r.ended:
            if r.error is not None:
                r.error_seen = True
                raise r.error
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    def receive_nowait(self) -> Message:
        """The next message if one is at hand, else ``anyio.WouldBlock``."""
        self._refill()
        return self._r.current.popleft()

    def receive_batch_nowait(self) -> list[Message]:
        """Every message at hand (the rest of the current batch, or the next batch)."""
        self._refill()
        out = list(self._r.current)
        self._r.current.clear()
        return out

    async def receive(self) -> Message:
        await anyio.lowlevel.checkpoint()
        while True:
            try:
                return self.receive_nowait()
            except anyio.WouldBlock:
                await self._wait()

    async def receive_batch(self) -> list[Message]:
        """Wait for messages, then return every one at hand (at least one, in order)."""
        await anyio.lowlevel.checkpoint()
        while True:
            try:
                return self.receive_batch_nowait()
            except anyio.WouldBlock:
                await self._wait()

    async def _wait(self) -> None:
        event = anyio.Event()
        self._r.waiters.add(event)
        try:
            await event.wait()
        finally:
            self._r.waiters.discard(event)

    async def ack(self, msg: Message | int) -> None:
        """Acknowledge a message (or offset) received from this stream (``auto_ack=False``).

        Applied by the reader thread before its next poll (within ``timeout``) and always
        before the group closes. Returns at once.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post(_ACK, msg)

    async def nack(self, msg: Message | int) -> None:
        """Have a received message delivered again, before newer ones (``auto_ack=False``)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post(_NACK, msg)

    def _post(self, op: int, msg: Message | int) -> None:
        if self._r.auto_ack:
            raise RuntimeError(
                "this channel acks every message when it is handed over (auto_ack=True); "
                "open it with auto_ack=False to ack / nack yourself"
            )
        if self._closed:
            raise anyio.ClosedResourceError
        if self._r.ended:
            raise anyio.BrokenResourceError("the reader thread has stopped")
        self._r.post(op, message_offset(msg))  # a TypeError here, not in the thread

    async def aclose(self) -> None:
        """Stop the reader thread and close the group (waits at most about ``timeout``)."""
        if not self._closed:
            self._closed = True
            self._r.wake()
        await self._r.stop()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("ended" if self._r.ended else "open")
        return f"<k7async.MessageStream group={self._r.group!r} {state}>"


@asynccontextmanager
async def consumer_group_channel(
    queue: k7core.Queue | AsyncQueue,
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
    reader.thread.start()
    with anyio.CancelScope(shield=True):
        await reader.ready.wait()
    if not reader.opened:
        await reader.stop()
        assert reader.error is not None
        raise reader.error
    stream = MessageStream(reader)
    try:
        yield stream
    finally:
        await stream.aclose()
        if reader.error is not None and not reader.error_seen:
            reader.error_seen = True
            raise reader.error
