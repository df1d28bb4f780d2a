"""The per-message checkpoints of the streams: ``send`` on a producer channel and ``receive``
on a consumer channel are cancel points at every call, and schedule points at least every
``SCHEDULE_EVERY`` calls (not at every message: that is what a message costs most)."""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel
import pytest

import k7async
import k7core
from k7async._bridge import SCHEDULE_EVERY
from tests._queuehelp import read_all

pytestmark = pytest.mark.anyio


def most_calls_between_turns(anyio_backend: str) -> int:
    """asyncio runs ready tasks first in, first out: another task gets a turn at each schedule
    point. trio shuffles each batch of ready tasks: between two turns of a task, another
    may pass two schedule points."""
    return SCHEDULE_EVERY if anyio_backend == "asyncio" else 2 * SCHEDULE_EVERY


class Ticker:
    """A task that counts its turns: how many calls of another task ran between two."""

    def __init__(self) -> None:
        self.calls = 0  # calls of the watched task since the ticker's last turn
        self.longest = 0  # the most calls in a row without a turn of the ticker
        self.turns = 0

    def call(self) -> None:
        self.calls += 1
        self.longest = max(self.longest, self.calls)

    async def run(self) -> None:
        while True:
            self.calls = 0
            self.turns += 1
            await anyio.lowlevel.checkpoint()


async def test_send_lets_other_tasks_run_every_few_calls(
    queue: k7core.Queue, anyio_backend: str
) -> None:
    ticker = Ticker()
    n = 10 * SCHEDULE_EVERY
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            while not ticker.turns:
                await anyio.lowlevel.checkpoint()
            async with k7async.producer_channel(queue, max_buffer_size=math.inf) as send:
                for i in range(n):
                    await send.send(b"%d" % i)
                    ticker.call()
            tg.cancel_scope.cancel()
    assert ticker.longest <= most_calls_between_turns(anyio_backend)
    assert ticker.turns >= n // SCHEDULE_EVERY
    assert len(read_all(queue)) == n


async def test_send_in_a_cancelled_scope_sends_nothing(queue: k7core.Queue) -> None:
    with anyio.fail_after(10):
        async with k7async.producer_channel(queue, max_buffer_size=math.inf) as send:
            await send.send(b"before")
            with anyio.CancelScope() as scope:
                scope.cancel()
                for _ in range(3):  # every call is a cancel point, not only every 64th
                    with pytest.raises(anyio.get_cancelled_exc_class()):
                        await send.send(b"never")
                await send.send(b"never")
            assert scope.cancelled_caught
            await send.send(b"after")
    assert read_all(queue) == [b"before", b"after"]


async def test_receive_lets_other_tasks_run_every_few_calls(
    queue: k7core.Queue, anyio_backend: str
) -> None:
    n = 10 * SCHEDULE_EVERY
    queue.enqueue_many([b"%d" % i for i in range(n)])
    ticker = Ticker()
    got = 0
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            while not ticker.turns:
                await anyio.lowlevel.checkpoint()
            async with k7async.consumer_group_channel(queue, "g", max_batch=4096) as stream:
                async for _ in stream:
                    ticker.call()
                    got += 1
                    if got == n:
                        break
            tg.cancel_scope.cancel()
    assert ticker.longest <= most_calls_between_turns(anyio_backend)
    assert ticker.turns >= n // SCHEDULE_EVERY


async def test_receive_in_a_cancelled_scope_takes_nothing(queue: k7core.Queue) -> None:
    queue.enqueue_many([b"a", b"b", b"c"])
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", auto_ack=False) as stream:
            first = await stream.receive()  # the whole batch is at hand now
            with anyio.CancelScope() as scope:
                scope.cancel()
                with pytest.raises(anyio.get_cancelled_exc_class()):
                    await stream.receive()
            second = await stream.receive()
    assert [bytes(first.payload), bytes(second.payload)] == [b"a", b"b"]
