"""Topics in async code: ``open_topic`` (:class:`AsyncTopic`), ``topic_producer_channel`` and
``topic_consumer_stream`` (:class:`RecordStream`), on owner threads (``_owner.Owner``).

- An :class:`AsyncTopic` is a :class:`k7core.topics.Topic` that lives on an owner thread of its
  own (``k7async-topic-<dir>``): it opens the topic, runs every send, stats and close on it.
- A consumer stream has a reader thread (``k7async-topic-reader-<dir>-<group>``) that opens a
  read-only ``Topic`` of its own on the same directory and its ``TopicConsumer``, and keeps the
  membership alive (rebalances happen inside ``poll``/``beat``) while the task works.

Back-pressure never blocks a thread: the owner thread's ``Topic`` gets the caller's
``BackPressure`` with ``on_high="raise"``, so a paused send fails at once on the thread
without writing anything; with ``on_high="block"`` the task then waits asynchronously
(re-reading the lag every ``interval`` seconds, up to ``timeout``) and tries again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, cast

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import k7core
from k7core import Fsync
from k7core._checks import check_count, check_seconds
from k7core.topics import (
    LOCK_TIMEOUT,
    BackPressure,
    BackPressureError,
    ConsumerStats,
    PressureStats,
    ProducerRecord,
    Record,
    Topic,
    TopicConsumer,
    TopicStats,
)

from ._bridge import post
from ._consumer import PolledStream
from ._errors import AutoAckError, StreamClosedError
from ._owner import Call, Command, Owner
from ._producer import STOP, ChannelSendStream, Room, alongside, take_batch

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

TopicItem: TypeAlias = ProducerRecord | bytes | str
"""What a topic producer channel carries: a ``ProducerRecord``, or a bare value."""

Headers: TypeAlias = "Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]] | None"
"""A record's headers: a mapping, or ``(name, value)`` pairs (names may repeat)."""

_BUSY_BEAT = 0.01  # heartbeat of an idle reader while partitions move (TopicConsumer's own)


# ---------------------------------------------------------------------- AsyncTopic


class _Paused:
    """An attempt that found the topic paused (nothing written): wait, then try again."""

    __slots__ = ("lag",)

    def __init__(self, lag: int) -> None:
        self.lag = lag


class _Attempt(Call[Topic, Any]):
    """A send that reports a pause instead of raising it (``on_high="block"``)."""

    __slots__ = ()

    def execute(self, topic: Topic) -> Any:
        try:
            return self.fn(topic)
        except BackPressureError as exc:  # raised before anything was written
            return _Paused(exc.lag)


def _pressure(topic: Topic) -> PressureStats:
    stats = topic.pressure_stats()  # re-reads the watched lag
    assert stats is not None  # only asked for with back_pressure
    return stats


def _info(topic: Topic) -> tuple[int, str]:
    return topic.partitions, topic.partitioner


class AsyncTopic:
    """A :class:`k7core.topics.Topic` for async code (from :func:`open_topic`): ``await
    send(...)`` returns ``(partition, offset)`` once the topic's ``fsync`` holds the record.

    Every call runs on the topic's owner thread, in the order the tasks made them. With
    ``back_pressure`` and ``on_high="block"`` a paused send waits in its task (other tasks
    run on), re-reading the lag every ``interval`` seconds; after ``timeout`` it raises
    :class:`k7core.topics.BackPressureError` (nothing written). With ``on_high="raise"`` it
    raises at once.
    """

    def __init__(
        self,
        owner: Owner[Topic],
        path: Path,
        partitions: int,
        partitioner: str,
        back_pressure: BackPressure | None,
    ) -> None:
        self._owner = owner
        self._path = path
        self._partitions = partitions
        self._partitioner = partitioner
        self._bp = back_pressure
        self._closed = False
        self._waiting = 0
        self._waited = 0.0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def name(self) -> str:
        return self._path.name

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def partitioner(self) -> str:
        return self._partitioner

    @property
    def back_pressure(self) -> BackPressure | None:
        """The ``BackPressure`` the topic was opened with (``on_high`` as given)."""
        return self._bp

    @property
    def waiting(self) -> int:
        """How many sends and channel batches are waiting out back-pressure now."""
        return self._waiting

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise k7core.ClosedError(f"async topic {self._path} is closed", path=self._path)

    # ------------------------------------------------------------------ sending

    async def send(
        self,
        value: bytes | str,
        key: bytes | str | None = None,
        headers: Headers = None,
        timestamp: int | None = None,
    ) -> tuple[int, int]:
        """:meth:`k7core.topics.Topic.send`: append one record, return ``(partition,
        offset)``. A task cancelled while it waits out back-pressure sends nothing; once the
        record is handed to the thread, it is written even if the task is cancelled."""
        return await self._write(lambda topic: topic.send(value, key, headers, timestamp))

    async def send_many(self, records: Iterable[TopicItem]) -> list[tuple[int, int]]:
        """:meth:`k7core.topics.Topic.send_many`: ``ProducerRecord`` items or bare values,
        checked before anything is written; returns each one's ``(partition, offset)``."""
        items = list(records)
        return await self._write(lambda topic: topic.send_many(items))

    async def _write(self, fn: Callable[[Topic], T], give_up: anyio.Event | None = None) -> T:
        """Run a send on the owner thread; while the topic is paused (``on_high="block"``),
        wait here and try again. ``give_up`` set: stop waiting (raise)."""
        self._check_open()
        bp = self._bp
        if bp is None or bp.on_high != "block":
            return await self._owner.call(Call(fn))  # BackPressureError as the thread raised it
        deadline: float | None = None
        while True:
            outcome = await self._owner.call(_Attempt(fn))
            if not isinstance(outcome, _Paused):
                return outcome  # type: ignore[no-any-return]
            if deadline is None:
                timeout = math.inf if bp.timeout is None else bp.timeout
                deadline = anyio.current_time() + timeout
            await self._wait_out(bp, deadline, outcome.lag, give_up)

    async def _wait_out(
        self, bp: BackPressure, deadline: float, lag: int, give_up: anyio.Event | None
    ) -> None:
        """Wait until the topic is no longer paused (asynchronously: the lag is re-read on
        the owner thread every ``interval`` seconds)."""
        self._waiting += 1
        start = anyio.current_time()
        try:
            while True:
                left = deadline - anyio.current_time()
                if left <= 0:
                    raise self._pressure_error(bp, lag, f"waited {bp.timeout:g} s")
                if give_up is None:
                    await anyio.sleep(min(bp.interval, left))
                else:
                    with anyio.move_on_after(min(bp.interval, left)):
                        await give_up.wait()
                    if give_up.is_set():
                        raise self._pressure_error(bp, lag, "the producer channel was cancelled")
                stats = await self._owner.call(Call(_pressure))
                lag = stats.lag
                if not stats.paused:
                    return
        finally:
            self._waiting -= 1
            self._waited += anyio.current_time() - start

    def _pressure_error(self, bp: BackPressure, lag: int, why: str) -> BackPressureError:
        who = f"group {bp.group!r}" if bp.group is not None else "the slowest group"
        return BackPressureError(
            f"topic {self._path}: {who} lags {lag} {bp.unit}, over the high watermark "
            f"{bp.high} (sends resume at {bp.low_mark}); {why}; nothing was written", lag=lag,
            hint="consume faster, raise the watermarks or the timeout",
        )

    # ------------------------------------------------------------------ reading the state

    async def paused(self) -> bool:
        """:meth:`k7core.topics.Topic.paused` (re-reads the watched lag)."""
        self._check_open()
        return await self._owner.call(Call(Topic.paused))

    async def throttle_ratio(self) -> float:
        """:meth:`k7core.topics.Topic.throttle_ratio` (re-reads the watched lag)."""
        self._check_open()
        return await self._owner.call(Call(Topic.throttle_ratio))

    async def pressure_stats(self) -> PressureStats | None:
        """:meth:`k7core.topics.Topic.pressure_stats`; ``blocked_seconds`` is the time this
        topic's sends spent waiting out back-pressure."""
        self._check_open()
        stats = await self._owner.call(Call(Topic.pressure_stats))
        return self._with_waits(stats)

    async def stats(self) -> TopicStats:
        """:meth:`k7core.topics.Topic.stats` (partitions, groups, lag, back-pressure)."""
        self._check_open()
        stats = await self._owner.call(Call(Topic.stats))
        return dataclasses.replace(stats, back_pressure=self._with_waits(stats.back_pressure))

    def _with_waits(self, stats: PressureStats | None) -> PressureStats | None:
        if stats is None:
            return None
        return dataclasses.replace(stats, blocked_seconds=self._waited)

    # ------------------------------------------------------------------ channels

    def producer_channel(
        self, max_buffer_size: float = 256, *, max_batch: int = 1024
    ) -> AbstractAsyncContextManager[MemoryObjectSendStream[TopicItem]]:
        """:func:`k7async.topic_producer_channel` on this topic."""
        return topic_producer_channel(self, max_buffer_size, max_batch=max_batch)

    def consumer_stream(
        self, group: str, member: str | None = None, **options: Any
    ) -> AbstractAsyncContextManager[RecordStream]:
        """:func:`k7async.topic_consumer_stream` on this topic (a reader thread of its own)."""
        return topic_consumer_stream(self, group, member, **options)

    # ------------------------------------------------------------------ lifetime

    async def aclose(self) -> None:
        """Run what was handed over, close the topic and join its thread. Idempotent."""
        self._closed = True
        await self._owner.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<k7async.AsyncTopic {str(self._path)!r} {self._partitions} partitions {state}>"


@asynccontextmanager
async def open_topic(
    path: str | os.PathLike[str],
    partitions: int | None = None,
    partitioner: str | None = None,
    **topic_options: Any,
) -> AsyncIterator[AsyncTopic]:
    """Open (or create) a topic for async code on an owner thread of its own; close it on exit.

    The arguments are :class:`k7core.topics.Topic`'s (``fsync``, ``segment_size``,
    ``back_pressure``, ``readonly``...). Opening and closing run on the thread, not in the
    event loop; an error opening it is raised here. On exit (even a cancellation) the calls
    already handed to the thread complete, then the topic is closed and the thread joined.
    """
    bp = topic_options.get("back_pressure")
    if isinstance(bp, BackPressure) and bp.on_high == "block":
        # the thread's Topic never sleeps: a paused send raises there, the task waits
        topic_options["back_pressure"] = dataclasses.replace(bp, on_high="raise")
    owner: Owner[Topic] = Owner(
        lambda: Topic(path, partitions, partitioner, **topic_options),
        name=f"k7async-topic-{Path(path).name}",
        finish=Topic.close,
    )
    try:
        n, placement = await owner.call(Call(_info), shield=True)  # the open error, if any
    except BaseException:
        await owner.aclose()
        raise
    kept = bp if isinstance(bp, BackPressure) else None
    topic = AsyncTopic(owner, Path(path), n, placement, kept)
    try:
        yield topic
    finally:
        await topic.aclose()


# ---------------------------------------------------------------------- producer channel


class _Failure:
    """Where a channel's pump leaves the error it stopped with (shared by the clones)."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None


def _passed_on(error: BaseException | None) -> BackPressureError | None:
    """The error a sender gets for a pump stopped by back-pressure (a copy: the exit raises
    the pump's own)."""
    if isinstance(error, BackPressureError):
        return BackPressureError(str(error), lag=error.lag)
    return None


@dataclass(eq=False)
class _TopicSendStream(ChannelSendStream[T_contra]):
    """A topic producer channel's send stream: a :class:`ChannelSendStream` whose senders get
    the ``BackPressureError`` that stopped the channel rather than ``BrokenResourceError``."""

    _failure: _Failure = field(default_factory=_Failure)

    async def send(self, item: T_contra) -> None:
        try:
            await super().send(item)
        except anyio.BrokenResourceError:
            error = _passed_on(self._failure.error)
            if error is not None:
                raise error from None
            raise

    def send_nowait(self, item: T_contra) -> None:
        try:
            super().send_nowait(item)
        except anyio.BrokenResourceError:
            error = _passed_on(self._failure.error)
            if error is not None:
                raise error from None
            raise

    def clone(self) -> _TopicSendStream[T_contra]:
        if self._closed:
            raise StreamClosedError("this producer channel")
        return _TopicSendStream(_state=self._state, _room=self._room, _failure=self._failure)


def _sender(batch: list[Any]) -> Callable[[Topic], list[tuple[int, int]]]:
    return lambda topic: topic.send_many(batch)


class _TopicPump:
    """The task moving a topic producer channel's items to ``send_many`` on the topic's owner
    thread, batch by batch (one at a time). While the topic is paused it waits with the batch
    in hand; the buffer fills and the senders wait, asynchronously."""

    def __init__(
        self,
        topic: AsyncTopic,
        receive: MemoryObjectReceiveStream[Any],
        target: int,
        max_batch: int,
        room: Room,
        failure: _Failure,
    ) -> None:
        self.topic = topic
        self.receive = receive
        self.target = target
        self.max_batch = max_batch
        self.room = room
        self.failure = failure
        self.give_up = anyio.Event()  # set: a back-pressure wait fails at once (cancelled exit)
        self.done = anyio.Event()

    async def run(self) -> None:
        # Shielded: the pump ends when the channel's exit says so (the stop marker), so every
        # sent item is written; only a wait for back-pressure can be given up.
        with anyio.CancelScope(shield=True):
            try:
                await self._run()
            except BaseException as exc:
                self.failure.error = exc
            finally:
                self.receive.close()  # senders still running get the error
                self.room.notify()
                self.done.set()

    async def _run(self) -> None:
        while True:
            got = await take_batch(self.receive, self.room, self.target)
            if got is None:
                return
            batch, over = got
            for i in range(0, len(batch), self.max_batch):
                await self._write(batch[i:i + self.max_batch])
            if over:
                return

    async def _write(self, batch: list[Any]) -> None:
        topic, give_up = self.topic, self.give_up
        try:
            await topic._write(_sender(batch), give_up)
        except (TypeError, ValueError):
            if len(batch) == 1:
                raise
            # Refused as a whole (an item that is not a record, one too large): nothing was
            # written. Write item by item so that what came before the culprit gets in.
            for item in batch:
                await topic._write(_sender([item]), give_up)
            raise


@asynccontextmanager
async def topic_producer_channel(
    topic: AsyncTopic, max_buffer_size: float = 256, *, max_batch: int = 1024
) -> AsyncIterator[MemoryObjectSendStream[TopicItem]]:
    """Yield a send stream whose items (``k7core.topics.ProducerRecord``, or bare values)
    are sent to ``topic`` in order, in batches of at most ``max_batch`` (``Topic.send_many``
    on the topic's owner thread).

    As :func:`k7async.producer_channel`: any number of tasks may send (each with its own
    ``send.clone()``); up to ``max_buffer_size`` items wait in the stream, then senders wait.
    While the topic is paused by back-pressure (``on_high="block"``), the channel waits
    asynchronously with its batch in hand: the buffer fills, senders wait, the event loop
    and the owner thread stay free. If the topic stays paused past the ``BackPressure``
    timeout (or at once with ``on_high="raise"``), the channel stops: senders get
    :class:`k7core.topics.BackPressureError`, and so does the exit; the batches before are
    written, that batch and the items after it are not.

    On exit every item whose ``send`` returned is written before this returns. A cancelled
    exit writes them too, but gives up a wait for back-pressure: the items it held are not
    written (the senders still running get ``BackPressureError``).
    """
    if not isinstance(topic, AsyncTopic):
        raise TypeError(f"expected a k7async.AsyncTopic, not {type(topic).__name__}")
    topic._check_open()
    max_batch = check_count(max_batch, "max_batch")
    plain, receive = anyio.create_memory_object_stream[Any](max_buffer_size)
    send = cast("_TopicSendStream[TopicItem]", _TopicSendStream._over(plain))
    control = ChannelSendStream.clone(send)  # plain errors (the stop marker's sender)
    target = max(1, int(min(max_buffer_size, max_batch)))
    pump = _TopicPump(topic, receive, target, max_batch, send._room, send._failure)
    try:
        async with alongside(pump.run):
            try:
                yield send
            finally:
                with anyio.CancelScope(shield=True):
                    send.close()
                await _stop(pump, control)
    finally:
        send.close()
        control.close()
        receive.close()
        error = pump.failure.error
        given_up = pump.give_up.is_set() and isinstance(error, BackPressureError)
        if error is not None and not given_up:  # (given up: the cancellation goes on)
            raise error


async def _stop(pump: _TopicPump, control: MemoryObjectSendStream[Any]) -> None:
    """Send the stop marker behind every sent item and wait for the pump. Cancellable: a
    cancellation makes the pump give up waiting out back-pressure, then waits (shielded)."""
    broken = (anyio.BrokenResourceError, anyio.ClosedResourceError)
    try:
        with contextlib.suppress(*broken):  # broken: the pump already stopped
            await control.send(STOP)  # may wait for room while the topic is paused
        await pump.done.wait()
    except BaseException:
        pump.give_up.set()
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(*broken):
                await control.send(STOP)
            await pump.done.wait()
        raise
    finally:
        control.close()


# ---------------------------------------------------------------------- consumer stream


class _Poll(Command[TopicConsumer, tuple[int, list[Record]]]):
    """A request for the next batch, kept (parked) by the reader thread until records come
    or the stream asks it back; answered with ``(serial, records)``."""

    __slots__ = ("stop",)

    def __init__(self) -> None:
        super().__init__()
        self.stop = False  # set in the loop: hand it back (empty) at the next chance


class _Control(Command[TopicConsumer, None]):
    """Acks or a nack posted by the stream (no answer: applied before the next poll)."""

    __slots__ = ("nack", "records")

    def __init__(self, records: list[Record], *, nack: bool) -> None:
        super().__init__()
        self.records = records
        self.nack = nack

    def execute(self, consumer: TopicConsumer) -> None:
        if self.nack:
            for r in self.records:
                consumer.nack(r)
        elif len(self.records) == 1:
            consumer.ack(self.records[0])
        else:
            consumer.ack_many(self.records)


class _Keepalive(Command[TopicConsumer, None]):
    """Parked for the stream's whole life: the reader thread never sleeps on its queue of
    commands, so it keeps beating (and rebalancing) while the stream holds a batch."""

    __slots__ = ()


class _Reader:
    """The thread that owns a read-only ``Topic`` and its ``TopicConsumer`` (thread
    ``k7async-topic-reader-<dir>-<group>``); no other thread touches them.

    Loop-side state (``assignment``, ``changed``) is written only in the stream's event loop,
    by callbacks the thread posts there."""

    def __init__(
        self,
        path: Path,
        group: str,
        member: str | None,
        *,
        max_batch: int,
        timeout: float,
        auto_ack: bool,
        consumer_options: dict[str, Any],
    ) -> None:
        self.path = path
        self.group = group
        self.max_batch = max_batch
        self.timeout = timeout
        self.auto_ack = auto_ack
        self.failure: BaseException | None = None  # an ack, nack or beat failed (thread side)
        self.stopping = False  # set in the loop: hand polls back, stop beating, let it close
        self.serial = 0  # batches handed over (thread side)
        self.wake = threading.Event()  # the stream handed over a command
        self._member = member
        self._options = consumer_options
        self._topic: Topic | None = None
        self._published: tuple[int, ...] | None = None
        self._next_beat = 0.0
        # loop side
        self.token = anyio.lowlevel.current_token()
        self.assignment: tuple[int, ...] = ()
        self.changed = anyio.Event()
        self.keepalive = _Keepalive()
        self.owner: Owner[TopicConsumer] = Owner(
            self._open,
            name=f"k7async-topic-reader-{path.name}-{group}",
            batch=self._serve,
            finish=self._finish,
        )
        self.owner.submit(self.keepalive, answer=False)

    # ------------------------------------------------------------------ loop side

    def nudge(self) -> None:
        """Wake the thread if it waits while the stream holds a batch."""
        self.wake.set()

    async def call(self, fn: Callable[[TopicConsumer], T], *, shield: bool = False) -> T:
        """Run ``fn(consumer)`` on the thread (woken if it waits) and return its result."""
        if not shield:
            await anyio.lowlevel.checkpoint_if_cancelled()
        command = self.owner.submit(Call(fn))
        self.nudge()
        await command.wait(shield=shield)
        return command.result()

    def _assigned(self, partitions: tuple[int, ...]) -> None:
        """In the loop: the member's partitions changed."""
        self.assignment = partitions
        event, self.changed = self.changed, anyio.Event()
        event.set()

    # ------------------------------------------------------------------ thread side

    def _open(self) -> TopicConsumer:
        topic = self._topic = Topic(self.path, readonly=True)
        try:
            consumer = topic.consumer(self.group, self._member, **self._options)
        except BaseException:
            topic.close()
            raise
        self._publish(consumer)
        return consumer

    def _finish(self, consumer: TopicConsumer) -> None:
        try:
            consumer.close()  # leaves the group: the others take its partitions
        finally:
            assert self._topic is not None
            self._topic.close()

    def _publish(self, consumer: TopicConsumer) -> None:
        partitions = () if consumer.closed else consumer.assignment
        if partitions != self._published:
            self._published = partitions
            post(self.token, self._assigned, partitions)

    def _serve(
        self, consumer: TopicConsumer, commands: list[Command[TopicConsumer, Any]]
    ) -> list[Command[TopicConsumer, Any]]:
        """Batch hook: acks, nacks and calls first (in order), then the poll if one is asked
        for; else keep the membership alive without fetching (the stream holds a batch)."""
        polls: list[_Poll] = []
        for command in commands:
            if isinstance(command, _Poll):
                polls.append(command)
            elif command is not self.keepalive:
                command.run(consumer)
                if isinstance(command, _Control) and command.error is not None:
                    self.failure = self.failure or command.error
        closing = self.stopping or self.owner.closing
        parked: list[Command[TopicConsumer, Any]] = []
        for poll in polls:
            if self.failure is not None:
                poll.set_error(self.failure)
            elif poll.stop or closing:
                poll.set_result((self.serial, []))
            else:
                try:
                    records = consumer.poll(self.max_batch, self.timeout)  # beats as it waits
                    if records and self.auto_ack:
                        consumer.ack_many(records)  # before the hand-over: at-most-once
                except BaseException as exc:
                    poll.set_error(exc)
                    continue
                if records:
                    self.serial += 1
                    poll.set_result((self.serial, records))
                else:
                    parked.append(poll)  # nothing yet: poll again, after what was posted
        if not polls and not closing:
            self._idle(consumer)
        self._publish(consumer)
        if not closing:
            parked.append(self.keepalive)
        return parked

    def _idle(self, consumer: TopicConsumer) -> None:
        """The stream holds a batch: beat when due (rebalances go on: partitions are taken
        and handed over), and wait until the next beat or a command."""
        now = time.monotonic()
        if now >= self._next_beat:
            try:
                consumer.beat()
            except BaseException as exc:
                self.failure = self.failure or exc
            settled = consumer.assigned == consumer.assignment and not consumer.in_flight
            beat = consumer.heartbeat if settled else min(consumer.heartbeat, _BUSY_BEAT)
            self._next_beat = now + beat
        self.wake.wait(max(0.0, self._next_beat - time.monotonic()))
        self.wake.clear()  # after the wait: a command handed over meanwhile is not missed


class RecordStream(PolledStream[Record]):
    """The receive stream of :func:`topic_consumer_stream`: ``async for record in stream``
    gives :class:`k7core.topics.Record` objects of this member's partitions.

    Receiving is :class:`k7async.MessageStream`'s (``PolledStream``). With
    ``auto_ack=False``, ``await ack(record)`` / ``await nack(record)`` are applied by the
    reader thread, in order, before its next poll and before it leaves the group.
    ``assignment`` is the member's partitions as last reported by the thread; ``await
    assignment_changed()`` waits for the next change (a rebalance).
    """

    _what = "this record stream"

    def __init__(self, reader: _Reader, member: str) -> None:
        self._reader = reader
        self._member = member
        self._current_serial = 0  # the batch ``_current`` came from
        self._stale: dict[int, int] = {}  # partition -> serial of the last batch before a seek
        super().__init__(reader.owner)

    @property
    def group(self) -> str:
        return self._reader.group

    @property
    def member(self) -> str:
        """This member's id in the group."""
        return self._member

    @property
    def auto_ack(self) -> bool:
        return self._reader.auto_ack

    @property
    def assignment(self) -> tuple[int, ...]:
        """The partitions this member delivers from (as the reader thread last reported;
        ``()`` once the stream is closed)."""
        return self._reader.assignment

    async def assignment_changed(self) -> tuple[int, ...]:
        """Wait until :attr:`assignment` changes (a rebalance, or the stream closing); return
        the new one."""
        await self._reader.changed.wait()
        return self._reader.assignment

    # ------------------------------------------------------------------ receiving

    def _ask(self) -> None:
        self._poll = self._owner.submit(_Poll())
        self._reader.nudge()

    def _accept(self, result: Any) -> Iterable[Record]:
        serial, records = result
        self._current_serial = serial
        return self._fresh(serial, records)

    def _fresh(self, serial: int, records: list[Record]) -> list[Record]:
        """Leave out the records of partitions sought after this batch was read."""
        stale = self._stale
        if not stale:
            return records
        out = [r for r in records if stale.get(r.partition, 0) < serial]
        for p in [p for p, s in stale.items() if s < serial]:
            del stale[p]  # batches from now on were read after the seek
        return out

    # ------------------------------------------------------------------ acks and calls

    async def ack(self, record: Record) -> None:
        """Acknowledge a record received from this stream (``auto_ack=False``); applied by
        the reader thread before its next poll (within ``timeout``). Returns at once."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post([record], nack=False)

    async def ack_many(self, records: Iterable[Record]) -> None:
        """Acknowledge several records (one cursor store per partition)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post(list(records), nack=False)

    async def nack(self, record: Record) -> None:
        """Have a received record delivered again, before newer ones of its partition (by
        the partition's next owner if it moves meanwhile)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._post([record], nack=True)

    def _post(self, records: list[Record], *, nack: bool) -> None:
        if self._reader.auto_ack:
            raise AutoAckError(
                "this stream acks every record when it is handed over (auto_ack=True)",
                hint="open it with auto_ack=False to ack / nack yourself",
            )
        if self._closed:
            raise StreamClosedError("this record stream")
        if self._reader.failure is not None:
            raise anyio.BrokenResourceError("the reader thread failed to apply an ack or nack")
        for r in records:
            if not isinstance(r, Record):
                raise TypeError(f"expected a k7core.topics.Record, not {type(r).__name__}")
        self._owner.submit(_Control(records, nack=nack), answer=False)
        self._reader.nudge()

    async def _call(self, fn: Callable[[TopicConsumer], T]) -> T:
        if self._closed:
            raise StreamClosedError("this record stream")
        return await self._reader.call(fn)

    async def seek(self, partition: int, offset: int) -> None:
        """Move the group's cursor of one of this member's partitions (persisted); the
        records of that partition the stream holds are dropped, and the next ones come from
        ``offset``. ``k7core.topics.NotAssignedError`` if the partition is not this member's."""
        reader = self._reader

        def seek(consumer: TopicConsumer) -> int:
            consumer.seek(partition, offset)
            return reader.serial

        serial = await self._call(seek)
        self._stale[partition] = max(serial, self._stale.get(partition, 0))
        if self._current_serial <= serial:
            kept = [r for r in self._current if r.partition != partition]
            self._current.clear()
            self._current.extend(kept)

    async def stats(self) -> ConsumerStats:
        """:meth:`k7core.topics.TopicConsumer.stats` (generation, members, partitions, lag)."""
        return await self._call(TopicConsumer.stats)

    # ------------------------------------------------------------------ lifetime

    async def aclose(self) -> None:
        """Leave the group and stop the reader thread (within about ``timeout``); join it.
        Idempotent.

        With ``auto_ack=True``, the records acked on hand-over that were never received are
        handed back first (``seek`` on each partition still this member's), so the group's
        next owner of that partition gets them.
        """
        if self._stopped is not None:  # closed, or closing in another task: wait for it
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()
            return
        self._stopped = anyio.Event()
        self._closed = True
        self._reader.stopping = True  # the thread stops beating: closing it is prompt
        self._reader.nudge()
        try:
            try:
                await self._hand_back()
            finally:
                await self._owner.aclose()  # applies what was posted, leaves, joins
                self._reader._assigned(())
        finally:
            self._stopped.set()

    async def _hand_back(self) -> None:
        poll, self._poll = self._poll, None
        if poll is not None:
            assert isinstance(poll, _Poll)
            poll.stop = True
            await poll.wait(shield=True)  # the thread hands it back within ``timeout``
            if poll.error is None:
                self._current.extend(self._accept(poll.result()))
            elif self._error is None:
                self._error = poll.error
        if self._reader.auto_ack and self._current:
            first: dict[int, int] = {}
            for r in self._current:
                first.setdefault(r.partition, r.offset)

            def hand_back(consumer: TopicConsumer) -> None:
                for p, offset in first.items():
                    if p in consumer.assignment:  # else it moved on: at-most-once
                        consumer.seek(p, offset)

            await self._reader.call(hand_back, shield=True)
        self._current.clear()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._error else "open")
        return (f"<k7async.RecordStream group={self._reader.group!r} member={self._member!r} "
                f"{state}>")


TopicSource: TypeAlias = "AsyncTopic | Topic | str | os.PathLike[str]"


def _topic_path(topic: TopicSource) -> Path:
    if isinstance(topic, (AsyncTopic, Topic)):
        return topic.path
    if isinstance(topic, (str, os.PathLike)):
        return Path(topic)
    raise TypeError(
        f"expected a k7async.AsyncTopic, a k7core.topics.Topic or a path, not "
        f"{type(topic).__name__}"
    )


@asynccontextmanager
async def topic_consumer_stream(
    topic: AsyncTopic | Topic | str | os.PathLike[str],
    group: str,
    member: str | None = None,
    *,
    max_batch: int = 64,
    timeout: float = 0.005,
    auto_ack: bool = True,
    strategy: str = "sticky",
    heartbeat: float = 0.1,
    revoke_timeout: float = 10.0,
    cursor_fsync: str | Fsync = "async",
    on_data_loss: str = "raise",
    lock_timeout: float = LOCK_TIMEOUT,
    max_poll_interval: float | None = None,
) -> AsyncIterator[RecordStream]:
    """Join consumer group ``group`` of a topic as ``member`` (None: a unique id) and yield a
    :class:`RecordStream` of the records of the member's partitions.

    ``topic`` is an :class:`AsyncTopic`, a :class:`k7core.topics.Topic` or a topic's path:
    only its directory is used. A reader thread opens the topic read-only, joins the group
    (``strategy``, ``heartbeat``, ``revoke_timeout``, ``cursor_fsync``, ``on_data_loss``,
    ``lock_timeout``, ``max_poll_interval``: as :meth:`k7core.topics.Topic.consumer`), polls
    (``max_batch``, ``timeout``) and hands each batch over in one hop, staying at most one
    batch ahead. While the stream holds a batch it fetches no more but keeps beating, so
    members that join or leave get their partitions even while this task is slow (and a
    slow task does not count as a member that stopped polling).

    - ``auto_ack=True``: each batch is acked as it is handed over (at-most-once); leaving
      hands back, with ``seek``, the records never received (of the partitions still held).
    - ``auto_ack=False``: at-least-once; ``await stream.ack(record)`` / ``nack(record)``.

    Leaving the context (or ``await stream.aclose()``, or a cancellation) applies what was
    posted, leaves the group (its partitions go to the other members), closes the topic and
    joins the thread. An error of the thread (joining: ``MemberBusyError``, a bad name) is
    raised on entry; one while reading by ``receive``, or else by the exit.
    """
    path = _topic_path(topic)
    max_batch = check_count(max_batch, "max_batch")
    seconds = check_seconds(timeout, "timeout", 60, positive=True)
    reader = _Reader(
        path, group, member, max_batch=max_batch, timeout=seconds, auto_ack=auto_ack,
        consumer_options={
            "strategy": strategy, "heartbeat": heartbeat, "revoke_timeout": revoke_timeout,
            "cursor_fsync": cursor_fsync, "on_data_loss": on_data_loss,
            "lock_timeout": lock_timeout, "max_poll_interval": max_poll_interval,
        },
    )
    try:
        name = await reader.call(lambda c: c.member, shield=True)
    except BaseException:
        await reader.owner.aclose()
        raise
    stream = RecordStream(reader, name)
    try:
        yield stream
    finally:
        await stream.aclose()
        if stream._error is not None and not stream._error_seen:
            stream._error_seen = True
            raise stream._error
