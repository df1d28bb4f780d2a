"""Writing from async code: sink, producer_channel, AsyncQueue (group commit), errors."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import anyio
import pytest

import k7async
import k7core
from tests._queuehelp import read_all
from tests.k7async._asynchelp import GatedQueue, k7async_threads

pytestmark = pytest.mark.anyio


def parse(payloads: list[bytes]) -> dict[int, list[int]]:
    """``b"task:seq"`` payloads -> {task: [seq, ...]} in queue order."""
    out: dict[int, list[int]] = defaultdict(list)
    for p in payloads:
        task, seq = p.split(b":")
        out[int(task)].append(int(seq))
    return out


# ---------------------------------------------------------------------- sink


async def test_sink_delivers(queue: k7core.Queue) -> None:
    send, receive = anyio.create_memory_object_stream[bytes](16)
    items = [b"item-%d" % i for i in range(500)]

    async def feed() -> None:
        async with send:
            for item in items:
                await send.send(item)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            with receive:
                count = await k7async.sink(queue, receive)
    assert count == 500
    assert read_all(queue) == items


async def test_sink_stops_when_the_channel_closes(queue: k7core.Queue) -> None:
    send, receive = anyio.create_memory_object_stream[bytes](0)
    result: list[int] = []

    async def run_sink() -> None:
        with receive:
            result.append(await k7async.sink(queue, receive))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_sink)
            await send.send(b"a")  # buffer 0: returns once the sink has taken it
            await send.send(b"b")
            await send.aclose()
    assert result == [2]
    assert read_all(queue) == [b"a", b"b"]


async def test_second_sink_is_refused(queue: k7core.Queue) -> None:
    send, receive = anyio.create_memory_object_stream[bytes](0)
    send2, receive2 = anyio.create_memory_object_stream[bytes](0)
    result: list[int] = []

    async def run_sink() -> None:
        with receive:
            result.append(await k7async.sink(queue, receive))

    with anyio.fail_after(10), send2, receive2:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_sink)
            await send.send(b"a")  # the first sink is running
            with pytest.raises(k7async.SinkBusyError) as info:
                await k7async.sink(queue, receive2)
            assert isinstance(info.value, k7core.K7Error)
            assert "already has a running sink" in str(info.value)
            await send.aclose()
        # once the first one is done, a new sink may start
        await send2.aclose()
        assert await k7async.sink(queue, receive2) == 0
    assert result == [1]


async def test_cancelled_sink_loses_nothing_it_took(gated: GatedQueue) -> None:
    send, receive = anyio.create_memory_object_stream[bytes](1000)
    items = [b"s-%d" % i for i in range(300)]
    with anyio.fail_after(10), send, receive:
        for item in items[:1]:
            await send.send(item)
        gated.arm()
        async with anyio.create_task_group() as tg:
            tg.start_soon(k7async.sink, gated, receive)
            await gated.entered.wait()  # writer thread is mid-batch with the sink's items
            for item in items[1:]:
                await send.send(item)
            tg.cancel_scope.cancel()
            gated.release()
        left = []
        while True:
            try:
                left.append(receive.receive_nowait())
            except anyio.WouldBlock:
                break
    written = read_all(gated)
    assert written + left == items  # written in order, the rest is still in the stream


# ---------------------------------------------------------------------- producer channel


@pytest.mark.parametrize("n", [2, 100])
async def test_producer_channel_delivers(queue: k7core.Queue, n: int) -> None:
    items = [b"m%d" % i for i in range(n)]
    with anyio.fail_after(10):
        async with k7async.producer_channel(queue) as send:
            for item in items:
                await send.send(item)
    assert read_all(queue) == items  # all in the queue once the context has exited


async def test_producer_channel_custom_buffer_applies_back_pressure(gated: GatedQueue) -> None:
    with anyio.fail_after(10):
        async with k7async.producer_channel(gated, max_buffer_size=4) as send:
            gated.arm()
            await send.send(b"0")
            await gated.entered.wait()  # the writer holds item 0; the buffer is empty
            accepted = 0
            with pytest.raises(anyio.WouldBlock):
                while True:
                    send.send_nowait(b"%d" % (accepted + 1))
                    accepted += 1
            assert accepted == 4  # a full buffer refuses more: senders wait
            assert send.statistics().max_buffer_size == 4
            gated.release()
            await send.send(b"5")
    assert read_all(gated) == [b"%d" % i for i in range(6)]


@pytest.mark.parametrize("size", [0, 1, math.inf])
async def test_producer_channel_buffer_sizes(queue: k7core.Queue, size: float) -> None:
    items = [b"b%d" % i for i in range(50)]
    with anyio.fail_after(10):
        async with k7async.producer_channel(queue, max_buffer_size=size) as send:
            assert send.statistics().max_buffer_size == size
            for item in items:
                await send.send(item)
    assert read_all(queue) == items
    with pytest.raises(ValueError):
        async with k7async.producer_channel(queue, max_buffer_size=-1):
            pass


async def test_producer_channel_many_tasks_keep_order(queue: k7core.Queue) -> None:
    tasks, per_task = 1000, 100

    async def producer(i: int, send: anyio.abc.ObjectSendStream[bytes]) -> None:
        async with send:
            for j in range(per_task):
                await send.send(b"%d:%d" % (i, j))

    with anyio.fail_after(30):
        async with k7async.producer_channel(queue) as send, anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(producer, i, send.clone())
        assert k7async.queue_writer(queue) is None  # the writer thread has stopped
    seen = parse(read_all(queue))
    assert len(seen) == tasks
    assert all(seen[i] == list(range(per_task)) for i in range(tasks))


async def test_producer_channels_share_one_writer(queue: k7core.Queue) -> None:
    with anyio.fail_after(10):
        async with k7async.producer_channel(queue) as a, k7async.producer_channel(queue) as b:
            writer = k7async.queue_writer(queue)
            assert writer is not None and writer.running
            async with k7async.open_queue(queue) as aq:
                assert aq.writer is writer is k7async.queue_writer(aq)
            assert len([t for t in k7async_threads() if "writer" in t.name]) == 1
            await a.send(b"a")
            await b.send(b"b")
        assert k7async.queue_writer(queue) is None
    assert not writer.running
    assert sorted(read_all(queue)) == [b"a", b"b"]


async def test_cancellation_mid_batch_loses_nothing_sent(gated: GatedQueue) -> None:
    sent: dict[int, list[int]] = defaultdict(list)

    async def producer(i: int, send: anyio.abc.ObjectSendStream[bytes]) -> None:
        async with send:
            for j in range(100_000):
                await send.send(b"%d:%d" % (i, j))
                sent[i].append(j)  # reported as sent

    async def channel() -> None:
        cm = k7async.producer_channel(gated, max_buffer_size=8)
        async with cm as send, anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(producer, i, send.clone())

    with anyio.fail_after(10):
        gated.arm()  # the writer's first batch will stop half-way
        async with anyio.create_task_group() as tg:
            tg.start_soon(channel)
            await gated.entered.wait()
            tg.cancel_scope.cancel()  # cancels the producers and the channel mid-batch
            gated.release()
    written = parse(read_all(gated))
    for i in range(20):
        got, reported = written[i], sent[i]
        assert got[: len(reported)] == reported  # everything reported as sent, in order
        assert got == list(range(len(got)))  # no gap, no duplicate
        assert len(got) - len(reported) <= 1  # at most the send that was cancelled late


async def test_producer_channel_body_exception_is_not_wrapped(queue: k7core.Queue) -> None:
    with anyio.fail_after(10), pytest.raises(KeyError):
        async with k7async.producer_channel(queue) as send:
            await send.send(b"x")
            raise KeyError("mine")
    assert read_all(queue) == [b"x"]


async def test_producer_channel_writer_error_reaches_the_producers(queue: k7core.Queue) -> None:
    with anyio.fail_after(10), pytest.raises(TypeError, match="bytes-like"):
        async with k7async.producer_channel(queue) as send:
            await send.send(b"good")
            with pytest.raises(anyio.BrokenResourceError):
                await send.send("not bytes")  # type: ignore[arg-type]
                while True:  # the pump stops after the writer's error: senders are told
                    await send.send(b"after")
    assert read_all(queue) == [b"good"]  # what was sent before the bad item is written
    assert k7async_threads() == []


# ---------------------------------------------------------------------- AsyncQueue


async def test_open_queue_enqueue_and_enqueue_many(tmp_path: Path) -> None:
    with anyio.fail_after(10):
        async with k7async.open_queue(tmp_path / "q", fsync="flush") as q:
            first = await q.enqueue(b"one")
            rest = await q.enqueue_many([b"two", bytearray(b"three"), memoryview(b"four")])
            assert first < rest[0] < rest[1] < rest[2]
            assert await q.enqueue_many([]) == []
            assert q.writer.messages == 4
            assert read_all(q.queue) == [b"one", b"two", b"three", b"four"]
        assert q.closed and q.queue.closed
        with pytest.raises(k7core.ClosedError):
            await q.enqueue(b"late")


async def test_open_queue_on_an_open_queue_leaves_it_open(queue: k7core.Queue) -> None:
    async with k7async.open_queue(queue) as q:
        assert q.queue is queue
        await q.enqueue(b"x")
    assert not queue.closed
    assert read_all(queue) == [b"x"]
    with pytest.raises(TypeError):
        async with k7async.open_queue(queue, fsync="sync"):
            pass


async def test_group_commit_shares_msyncs(tmp_path: Path) -> None:
    tasks, per_task = 100, 20
    offsets: dict[int, list[int]] = defaultdict(list)

    async def producer(q: k7async.AsyncQueue, i: int) -> None:
        for j in range(per_task):
            offsets[i].append(await q.enqueue(b"%d:%d" % (i, j)))

    with anyio.fail_after(30):
        async with k7async.open_queue(tmp_path / "q", fsync="sync") as q:
            async with anyio.create_task_group() as tg:
                for i in range(tasks):
                    tg.start_soon(producer, q, i)
            batches = q.writer.batches
            assert q.writer.messages == tasks * per_task
            payloads = read_all(q.queue)
            batch = q.queue.read_columnar(0, 2 * tasks * per_task)
            at = {batch.offsets[k]: bytes(batch.payload(k)) for k in range(len(batch))}
    # one enqueue_many (one msync with "sync") per batch: far fewer than one per message
    assert batches <= tasks * per_task // 10, batches
    seen = parse(payloads)
    assert all(seen[i] == list(range(per_task)) for i in range(tasks))
    assert all(o == sorted(o) for o in offsets.values())
    assert len({o for v in offsets.values() for o in v}) == tasks * per_task
    # every awaited offset is where that task's message is (shared jobs index correctly)
    assert all(at[o] == b"%d:%d" % (i, j) for i, v in offsets.items() for j, o in enumerate(v))


async def test_cancelled_enqueue_mid_batch(tmp_path: Path) -> None:
    with GatedQueue(tmp_path / "q", fsync="flush") as gq:
        results: dict[int, int] = {}

        async def producer(q: k7async.AsyncQueue, i: int) -> None:
            results[i] = await q.enqueue(b"e%d" % i)

        with anyio.fail_after(10):
            async with k7async.open_queue(gq) as q:
                await q.enqueue(b"first")
                gq.arm()
                async with anyio.create_task_group() as tg:
                    for i in range(50):
                        tg.start_soon(producer, q, i)
                    await gq.entered.wait()  # some enqueues are mid-batch in the writer
                    tg.cancel_scope.cancel()
                    gq.release()
                await q.enqueue(b"last")  # the queue still works
        payloads = read_all(gq)
        assert payloads[0] == b"first" and payloads[-1] == b"last"
        by_payload = dict(zip(payloads, range(len(payloads)), strict=True))
        for i in results:  # every enqueue that returned an offset is there
            assert b"e%d" % i in by_payload
        assert len(set(payloads)) == len(payloads)


async def test_writer_errors_reach_the_awaiting_task(tmp_path: Path) -> None:
    with anyio.fail_after(10):
        async with k7async.open_queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
            with pytest.raises(TypeError, match="bytes-like"):
                await q.enqueue("not bytes")  # type: ignore[arg-type]
            with pytest.raises(k7core.MessageTooLargeError):
                await q.enqueue(b"x" * 5000)

            # in a shared batch, only the culprit fails
            outcomes: dict[int, object] = {}

            async def one(i: int, data: object) -> None:
                try:
                    outcomes[i] = await q.enqueue(data)  # type: ignore[arg-type]
                except TypeError as exc:
                    outcomes[i] = exc

            async with anyio.create_task_group() as tg:
                for i in range(30):
                    tg.start_soon(one, i, "bad" if i == 7 else b"ok%d" % i)
            assert isinstance(outcomes.pop(7), TypeError)
            assert all(isinstance(v, int) for v in outcomes.values())
            assert len(read_all(q.queue)) == 29

            q.queue.close()  # the underlying queue closed under the writer's feet
            with pytest.raises(k7core.ClosedError):
                await q.enqueue(b"y")
            with pytest.raises(k7core.ClosedError):
                await q.enqueue_many([b"y", b"z"])
    assert k7async_threads() == []
