"""The k7async cases: what a message costs when it crosses threads through the anyio bridges.

Each ``run()`` is one ``anyio.run`` (asyncio; trio as well in the full run):

- references: a bare anyio memory object stream, 1 sender task, 1 receiver task, no queue
  (the same per-message ``await send`` / ``async for`` with nothing behind it); and a bare
  loop of ``anyio.lowlevel.checkpoint()``, what one full checkpoint per message costs;
- producer channel: N messages sent by 1 task, then by 100 tasks (clones), fsync="flush";
  the clock stops when the channel's context has exited (everything is in the queue);
- consumer channel: N prefilled messages received one by one (``async for``), auto-ack and
  at-least-once (one ``await ack`` per message), then auto-ack with ``receive_batch()``;
  max_batch=64; a new group per run; the clock stops at the last message;
- awaited enqueue: 100 tasks each awaiting ``enqueue`` in a loop on an fsync="sync" queue
  (group commit); also reports messages per writer batch (one msync per batch);
- the batched form of writing: one task awaiting ``AsyncQueue.enqueue_many`` of 1,000
  messages, fsync="flush" (what ``receive_batch()`` is to the consumer channel).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel

import k7async
import k7core

from ._harness import PAYLOAD, Case, Run, Samples

SEGMENT = 256 << 20


@dataclass(frozen=True)
class Sizes:
    messages: int  # per run: producer and consumer channels, memory stream
    sync_tasks: int  # awaited enqueue [sync]: tasks
    sync_per_task: int  # awaited enqueue [sync]: enqueues awaited by each task per run
    backends: tuple[str, ...]


QUICK = Sizes(messages=20_000, sync_tasks=100, sync_per_task=20, backends=("asyncio", "trio"))
FULL = Sizes(messages=200_000, sync_tasks=100, sync_per_task=100, backends=("asyncio", "trio"))


async def memory_stream(n: int) -> float:
    """Seconds to pass ``n`` items through an anyio memory object stream (no queue)."""
    send, receive = anyio.create_memory_object_stream[bytes](256)

    async def consume() -> None:
        async with receive:
            async for _ in receive:
                pass

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        async with send:
            for _ in range(n):
                await send.send(PAYLOAD)
    return time.perf_counter() - t0


async def checkpoints(n: int) -> float:
    """Seconds for ``n`` calls of ``anyio.lowlevel.checkpoint()`` in one task."""
    t0 = time.perf_counter()
    for _ in range(n):
        await anyio.lowlevel.checkpoint()
    return time.perf_counter() - t0


async def produce(q: k7core.Queue, per_task: int, tasks: int, buffer: int) -> float:
    """Seconds for ``tasks`` tasks to send ``per_task`` messages each through one producer
    channel (``max_buffer_size=buffer``), until the channel's context has exited."""

    async def producer(send: anyio.abc.ObjectSendStream[bytes]) -> None:
        async with send:
            for _ in range(per_task):
                await send.send(PAYLOAD)

    t0 = time.perf_counter()
    async with (k7async.producer_channel(q, max_buffer_size=buffer) as send,
                anyio.create_task_group() as tg):
        for _ in range(tasks):
            tg.start_soon(producer, send.clone())
    return time.perf_counter() - t0


async def consume(q: k7core.Queue, group: str, total: int, auto_ack: bool,
                  batches: bool = False) -> float:
    """Seconds for a new consumer group channel to deliver ``total`` messages."""
    t0 = time.perf_counter()
    async with k7async.consumer_group_channel(q, group, auto_ack=auto_ack) as stream:
        got = 0
        if batches:
            while got < total:
                got += len(await stream.receive_batch())
        else:
            async for msg in stream:
                if not auto_ack:
                    await stream.ack(msg)
                got += 1
                if got == total:
                    break
        return time.perf_counter() - t0


async def awaited_enqueue(q: k7core.Queue, tasks: int, per_task: int) -> tuple[float, int]:
    """Seconds for ``tasks`` tasks to await ``per_task`` enqueues each, and the writer
    batches (``enqueue_many`` calls; msyncs with fsync="sync") they took."""
    async with k7async.open_queue(q) as aq:
        start = aq.writer.batches

        async def producer() -> None:
            for _ in range(per_task):
                await aq.enqueue(PAYLOAD)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(producer)
        elapsed = time.perf_counter() - t0
        return elapsed, aq.writer.batches - start


def _memory_stream_case(n: int, backend: str) -> Case:
    name = f"baseline: anyio memory object stream, 1 sender 1 receiver ({backend})"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield lambda: {name: ("msg/s", n / anyio.run(memory_stream, n, backend=backend))}

    return Case(name, "baseline", setup, {"messages": n, "backend": backend, "buffer": 256})


def _checkpoint_case(n: int, backend: str) -> Case:
    name = f"baseline: anyio.lowlevel.checkpoint() per message, 1 task ({backend})"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        yield lambda: {name: ("msg/s", n / anyio.run(checkpoints, n, backend=backend))}

    return Case(name, "baseline", setup, {"messages": n, "backend": backend})


def _producer_case(n: int, tasks: int, backend: str, buffer: int = 256) -> Case:
    """The default buffer (256) unless ``buffer`` says otherwise (then named in the case)."""
    sized = "" if buffer == 256 else f" max_buffer_size={buffer}"
    name = f"k7async producer_channel {tasks} task{'s' if tasks > 1 else ''}{sized} ({backend})"
    per_task = n // tasks

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "prod", fsync="flush", segment_size=SEGMENT) as q:

            def run() -> Samples:
                elapsed = anyio.run(produce, q, per_task, tasks, buffer, backend=backend)
                return {name: ("msg/s", per_task * tasks / elapsed)}

            yield run

    return Case(name, "k7", setup, {"payload": 32, "messages": per_task * tasks, "tasks": tasks,
                                    "max_buffer_size": buffer, "fsync": "flush",
                                    "backend": backend})


def _consumer_case(n: int, auto_ack: bool, batches: bool, backend: str) -> Case:
    kind = "auto-ack" if auto_ack else "at-least-once"
    name = f"k7async consumer channel {kind}{' receive_batch' if batches else ''} ({backend})"
    total = max(n // 1000, 1) * 1000

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "cons", fsync="flush", segment_size=SEGMENT) as q:
            for _ in range(total // 1000):
                q.enqueue_many([PAYLOAD] * 1000)
            groups = (f"g{i}" for i in itertools.count())  # a new group (from 0) per run

            def run() -> Samples:
                elapsed = anyio.run(consume, q, next(groups), total, auto_ack, batches,
                                    backend=backend)
                return {name: ("msg/s", total / elapsed)}

            yield run

    return Case(name, "k7", setup, {"payload": 32, "messages": total, "max_batch": 64,
                                    "ack": "auto" if auto_ack else "await ack per message",
                                    "backend": backend})


async def awaited_batches(q: k7core.Queue, total: int, size: int) -> float:
    """Seconds for one task to await ``enqueue_many`` of ``size`` messages until ``total``."""
    batch = [PAYLOAD] * size
    async with k7async.open_queue(q) as aq:
        t0 = time.perf_counter()
        for _ in range(total // size):
            await aq.enqueue_many(batch)
        return time.perf_counter() - t0


def _awaited_batch_case(n: int, size: int, backend: str) -> Case:
    name = f"k7async awaited enqueue_many({size}) 1 task ({backend})"
    total = max(n // size, 1) * size

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "many", fsync="flush", segment_size=SEGMENT) as q:
            yield lambda: {name: ("msg/s", total / anyio.run(awaited_batches, q, total, size,
                                                             backend=backend))}

    return Case(name, "k7", setup, {"payload": 32, "messages": total, "fsync": "flush",
                                    "backend": backend})


def _awaited_sync_case(tasks: int, per_task: int, backend: str) -> Case:
    base = f"k7async awaited enqueue [sync] {tasks} tasks ({backend})"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "sync", fsync="sync", segment_size=SEGMENT) as q:

            def run() -> Samples:
                elapsed, batches = anyio.run(awaited_enqueue, q, tasks, per_task,
                                             backend=backend)
                total = tasks * per_task
                return {base: ("msg/s", total / elapsed),
                        f"{base} messages per msync": ("msg/msync", total / max(batches, 1))}

            yield run

    return Case(base, "k7", setup, {"payload": 32, "messages": tasks * per_task, "tasks": tasks,
                                    "fsync": "sync", "backend": backend})


def cases(s: Sizes) -> list[Case]:
    out: list[Case] = []
    for backend in s.backends:
        out += [
            _producer_case(s.messages, 1, backend),
            _producer_case(s.messages, 100, backend),
            _producer_case(s.messages, 100, backend, buffer=1024),
            _consumer_case(s.messages, True, False, backend),
            _consumer_case(s.messages, False, False, backend),
            _consumer_case(s.messages, True, True, backend),
            _awaited_sync_case(s.sync_tasks, s.sync_per_task, backend),
            _awaited_batch_case(s.messages, 1000, backend),
            _memory_stream_case(s.messages, backend),
            _checkpoint_case(s.messages, backend),
        ]
    return out
