"""Reading from async code: consumer_group_channel, acks, stop, errors, payload lifetime."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

import k7async
import k7core
from tests.k7async._asynchelp import k7async_threads

pytestmark = pytest.mark.anyio


def fill(q: k7core.Queue, n: int, size: int = 0) -> list[bytes]:
    items = [(b"msg-%d-" % i).ljust(size, b".") for i in range(n)]
    q.enqueue_many(items)
    return items


def committed(q: k7core.Queue, group: str) -> int:
    with q.consumer_group(group) as g:
        return g.committed


async def test_consumer_channel_delivers_all(queue: k7core.Queue) -> None:
    items = fill(queue, 1000)
    got: list[bytes] = []
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", max_batch=64) as stream:
            async for msg in stream:
                assert isinstance(msg, k7core.Message)
                got.append(bytes(msg.payload))
                if len(got) == len(items):
                    break
    assert got == items
    assert committed(queue, "g") == queue.end  # auto_ack: everything received is acked
    assert k7async_threads() == []


async def test_consumer_channel_sees_messages_enqueued_later(queue: k7core.Queue) -> None:
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g") as stream:
            async with k7async.producer_channel(queue) as send:
                for i in range(50):
                    await send.send(b"%d" % i)
            got = [bytes((await stream.receive()).payload) for _ in range(50)]
    assert got == [b"%d" % i for i in range(50)]


async def test_receive_batch(queue: k7core.Queue) -> None:
    fill(queue, 100)
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", max_batch=16) as stream:
            first = await stream.receive()
            rest = await stream.receive_batch()  # what is left of the first poll
            assert 1 <= len(rest) <= 15
            assert rest[0].offset > first.offset
            total = 1 + len(rest)
            while total < 100:
                batch = await stream.receive_batch()
                assert 1 <= len(batch) <= 16
                total += len(batch)
    assert total == 100


@pytest.mark.parametrize("how", ["scope exit", "cancellation"])
async def test_stop_is_prompt_on_an_empty_queue(queue: k7core.Queue, how: str) -> None:
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with k7async.consumer_group_channel(queue, "g", timeout=0.005) as stream:
                assert len(k7async_threads()) == 1
                if how == "cancellation":
                    scope.cancel()
                    start = time.perf_counter()
                    await stream.receive()  # cancelled: nothing will ever arrive
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream.receive)  # waits for data that never comes
                    await anyio.wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
                start = time.perf_counter()
        elapsed = time.perf_counter() - start
    assert scope.cancelled_caught == (how == "cancellation")
    assert elapsed < 1.0  # bounded by the poll timeout (5 ms) plus thread wake-ups
    assert k7async_threads() == []
    with queue.consumer_group("g"):  # the group's lock was released
        pass


async def test_stop_by_closing_the_stream(queue: k7core.Queue) -> None:
    items = fill(queue, 20)
    offsets = queue.read_columnar(0, 100).offsets
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", max_batch=8) as stream:
            got = [await stream.receive() for _ in range(5)]
            await stream.aclose()
            # the reader has stopped and the group is closed: another owner may take it
            assert k7async_threads() == []
            with queue.consumer_group("g") as g:
                # auto_ack acked the whole first batch of 8 on hand-over; closing handed
                # back the 3 that were never received
                assert [m.offset for m in got] == list(offsets[:5])
                assert g.committed == offsets[5]
                again = g.poll(max_batch=100, timeout=0.1)
                assert [bytes(m.payload) for m in again] == items[5:]
            with pytest.raises(k7async.StreamClosedError):
                await stream.receive()
            await stream.aclose()  # idempotent


async def test_auto_ack_acks_before_the_hand_over(queue: k7core.Queue) -> None:
    fill(queue, 20)
    offsets = queue.read_columnar(0, 100).offsets
    cursor = queue.path / "cursor-g.k7"
    with anyio.fail_after(10):
        channel = k7async.consumer_group_channel(queue, "g", max_batch=8, cursor_fsync="flush")
        async with channel as stream:
            first = await stream.receive()
            # a crash now would lose the rest of this batch, never deliver it twice
            stored = int.from_bytes(cursor.read_bytes()[:8], "big")
            assert first.offset == offsets[0]
            # the first batch is acked; the next one (prefetched) may be, in part or whole
            assert offsets[8] <= stored <= offsets[16]


async def test_at_least_once_redelivery_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with k7core.Queue(path, fsync="flush") as q:
        items = fill(q, 10)
        with anyio.fail_after(10):
            async with k7async.consumer_group_channel(q, "g", auto_ack=False) as stream:
                got = [await stream.receive() for _ in range(10)]
                for msg in got[:4]:
                    await stream.ack(msg)
                with pytest.raises(RuntimeError, match="auto_ack"):
                    async with k7async.consumer_group_channel(q, "other") as auto:
                        await auto.ack(got[0])
        assert committed(q, "g") == got[4].offset
    with k7core.Queue(path, fsync="flush") as q:  # a restart: new process, same directory
        with anyio.fail_after(10):
            async with k7async.consumer_group_channel(q, "g", auto_ack=False) as stream:
                again = [await stream.receive() for _ in range(6)]
                assert [bytes(m.payload) for m in again] == items[4:]
                for msg in again:
                    await stream.ack(msg.offset)  # offsets work too
        assert committed(q, "g") == q.end


async def test_nack_redelivers_first(queue: k7core.Queue) -> None:
    items = fill(queue, 10)
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", auto_ack=False) as stream:
            got = [await stream.receive() for _ in range(10)]
            await stream.nack(got[3])
            for msg in got[:3] + got[4:]:
                await stream.ack(msg)
            redelivered = await stream.receive()
            assert redelivered.offset == got[3].offset
            assert bytes(redelivered.payload) == items[3]
            assert redelivered is not got[3]  # a new Message onto the same bytes
            await stream.ack(redelivered)
            fill(queue, 1)
            newer = await stream.receive()
            assert bytes(newer.payload) == b"msg-0-"
            await stream.ack(newer)
    assert committed(queue, "g") == queue.end


async def test_reader_errors_reach_the_consumer(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        fill(q, 5, size=32)
        with q.consumer_group("busy"), pytest.raises(k7core.GroupBusyError):  # owned elsewhere
            async with k7async.consumer_group_channel(q, "busy"):
                pytest.fail("entered")
        with pytest.raises(k7core.InvalidNameError):
            async with k7async.consumer_group_channel(q, "../escape"):
                pytest.fail("entered")
        assert k7async_threads() == []

        # corrupt the payload of the third message on disk (below the visible end)
        third = q.read_columnar(0, 5).offsets[2]
        seg = next(q.path.glob("seg-*.k7"))
        with open(seg, "r+b") as f:
            f.seek(third + 10)
            f.write(b"X")
        with anyio.fail_after(10):
            async with k7async.consumer_group_channel(q, "g") as stream:
                first = await stream.receive()
                second = await stream.receive()
                with pytest.raises(k7core.CorruptFrameError) as info:
                    await stream.receive()
                assert info.value.offset == third
                with pytest.raises(k7core.CorruptFrameError):  # it stays broken
                    await stream.receive()
        assert (first.offset, second.offset) < (third, third)
    assert k7async_threads() == []


async def test_payload_stays_valid_while_held(tmp_path: Path) -> None:
    # small segments: later polls move the reader to new segments (and unmap old ones)
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
        items = fill(q, 300, size=100)
        with anyio.fail_after(10):
            async with k7async.consumer_group_channel(q, "g", max_batch=4) as stream:
                held = await stream.receive()
                assert bytes(held.payload) == items[0]
                rest = [await stream.receive() for _ in range(299)]
                assert rest[-1].offset > 4 * 4096  # several segments later
                assert bytes(held.payload) == items[0]
                assert held.payload.readonly
        assert [bytes(m.payload) for m in rest] == items[1:]
    # the channel exited, the group and the queue are closed: the held views still read
    assert bytes(held.payload) == items[0]
    assert bytes(rest[150].payload) == items[151]


async def test_concurrent_acloses_hand_back_once(queue: k7core.Queue) -> None:
    """Two tasks closing the stream at once: both return once the group is closed, and the
    messages acked on hand-over but never received are handed back (once)."""
    items = fill(queue, 8)
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", max_batch=8) as stream:
            first = await stream.receive()  # 7 more at hand; the next poll waits for data
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream.aclose)
                tg.start_soon(stream.aclose)
            assert k7async_threads() == []
    assert bytes(first.payload) == items[0]
    with queue.consumer_group("g") as g:
        assert g.committed == first.offset + k7core.frame_size(len(items[0]))
