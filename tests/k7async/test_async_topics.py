"""Topics from async code: open_topic / AsyncTopic, topic_producer_channel,
topic_consumer_stream; back-pressure awaited (never blocking a thread), rebalances while a
task is slow, close and cancellation."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import k7async
import k7core
from k7core.topics import (
    BackPressure,
    BackPressureError,
    MemberBusyError,
    ProducerRecord,
    Record,
    Topic,
    TopicError,
    TopicLockTimeoutError,
    TopicStats,
)
from tests._childproc import Child
from tests.k7async._asynchelp import k7async_threads

pytestmark = pytest.mark.anyio

# "flush": what is sent is visible at once, so the lag counts it at once
SMALL: dict[str, Any] = {"fsync": "flush", "segment_size": 1 << 20}


def pressure(on_high: str = "block", timeout: float | None = 30.0) -> BackPressure:
    """Pause from a lag of 4 messages of group "g", resume at 1."""
    return BackPressure(high=4, low=1, unit="messages", group="g", on_high=on_high,
                        timeout=timeout, interval=0.002)


def ends(stats: TopicStats) -> list[int]:
    return [p.next_offset for p in stats.partitions]


async def until_waiting(topic: k7async.AsyncTopic) -> None:
    """Until a send of ``topic`` waits out back-pressure (it does so in its own task)."""
    while topic.waiting == 0:
        await anyio.wait_all_tasks_blocked()


async def until(done: Callable[[], bool], *streams: k7async.RecordStream) -> None:
    """Until ``done()``, re-checked at every change of the streams' assignments."""
    while not done():
        async with anyio.create_task_group() as tg:

            async def one(stream: k7async.RecordStream) -> None:
                if not done():  # no checkpoint between this check and the wait
                    await stream.assignment_changed()
                tg.cancel_scope.cancel()

            for stream in streams:
                tg.start_soon(one, stream)


@asynccontextmanager
async def stalled(
    path: Path, bp: BackPressure
) -> AsyncIterator[tuple[k7async.AsyncTopic, k7async.RecordStream, list[Record], list[int]]]:
    """A topic paused by group "g": 4 records sent, received and not acked. Yields the
    topic, the group's stream, the records it holds and the partitions' ends."""
    async with k7async.open_topic(path, partitions=2, back_pressure=bp, **SMALL) as topic, \
            topic.consumer_stream("g", auto_ack=False) as stream:
        await topic.send_many([b"s0", b"s1", b"s2", b"s3"])
        held = [await stream.receive() for _ in range(4)]
        assert await topic.paused()
        assert await topic.throttle_ratio() == 1.0
        yield topic, stream, held, ends(await topic.stats())


# ---------------------------------------------------------------------- round trip


async def test_round_trip_keys_headers_timestamps(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with k7async.open_topic(tmp_path / "t", partitions=3, **SMALL) as topic:
            assert (topic.name, topic.partitions, topic.partitioner) == ("t", 3, "kafka")
            assert topic.back_pressure is None and not await topic.paused()
            assert await topic.throttle_ratio() == 0.0 and await topic.pressure_stats() is None
            one = await topic.send(b"v1", key="user-1", headers={"trace": "abc"}, timestamp=1234)
            two = await topic.send("v2", key=b"user-1", headers=[("h", b"1"), ("h", "2")])
            many = await topic.send_many([ProducerRecord(b"v3", key="user-2", timestamp=99),
                                          b"v4", "v5"])
            async with topic.producer_channel() as send:
                await send.send(ProducerRecord(b"v6", key="user-1", headers={"c": b"x"}))
                await send.send(b"v7")
            stats = await topic.stats()
            assert sum(len(g.partitions) for g in stats.groups) == 0
            async with k7async.topic_consumer_stream(topic.path, "g", max_batch=2) as stream:
                assert stream.group == "g" and stream.assignment == (0, 1, 2)
                records = [await stream.receive() for _ in range(7)]
        assert k7async_threads() == []
    by_value = {r.value: r for r in records}
    assert len(by_value) == 7
    assert by_value[b"v1"] == Record(*one, b"user-1", b"v1", (("trace", b"abc"),), 1234)
    assert by_value[b"v2"][:2] == two and by_value[b"v2"].headers == (("h", b"1"), ("h", b"2"))
    assert [by_value[v][:2] for v in (b"v3", b"v4", b"v5")] == many
    assert by_value[b"v3"].timestamp == 99 and by_value[b"v4"].key is None
    assert by_value[b"v6"].headers == (("c", b"x"),)
    with Topic(tmp_path / "t", readonly=True) as sync:  # the topic's own key placement
        assert {one[0], two[0], by_value[b"v6"].partition} == {sync.partition_for("user-1")}
        assert many[0][0] == sync.partition_for("user-2")
    # one key, one partition, in the order sent
    same = sorted((r for r in records if r.key == b"user-1"), key=lambda r: r.offset)
    assert [r.value for r in same] == [b"v1", b"v2", b"v6"]


# ---------------------------------------------------------------------- groups


def split(a: k7async.RecordStream, b: k7async.RecordStream, n: int) -> bool:
    sa, sb = set(a.assignment), set(b.assignment)
    return bool(sa) and bool(sb) and not sa & sb and sa | sb == set(range(n))


async def test_two_streams_split_the_partitions_then_one_takes_all(tmp_path: Path) -> None:
    opts = {"auto_ack": False, "heartbeat": 0.02}
    with anyio.fail_after(30):
        async with k7async.open_topic(tmp_path / "t", partitions=4, **SMALL) as topic, \
                topic.consumer_stream("g", "a", **opts) as a, \
                topic.consumer_stream("g", "b", **opts) as b:
            await until(lambda: split(a, b, 4), a, b)
            sent = await topic.send_many(
                [ProducerRecord(b"v%d" % i, key=b"k%d" % i) for i in range(40)]
            )
            got: dict[str, list[Record]] = {"a": [], "b": []}
            done = anyio.Event()

            async def consume(name: str, stream: k7async.RecordStream) -> None:
                async for record in stream:
                    got[name].append(record)
                    await stream.ack(record)
                    if len(got["a"]) + len(got["b"]) == len(sent):
                        done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(consume, "a", a)
                tg.start_soon(consume, "b", b)
                await done.wait()
                tg.cancel_scope.cancel()
            # each record once, each from the member that holds its partition
            assert sorted(r[:2] for r in got["a"] + got["b"]) == sorted(sent)
            assert got["a"] and got["b"]
            assert {r.partition for r in got["a"]} <= set(a.assignment)
            assert {r.partition for r in got["b"]} <= set(b.assignment)

            await a.aclose()  # leaves the group: b takes every partition
            assert a.assignment == ()
            assert len([t for t in k7async_threads() if "reader" in t.name]) == 1
            await until(lambda: b.assignment == (0, 1, 2, 3), b)
            more = await topic.send_many([b"w%d" % i for i in range(20)])
            again = [await b.receive() for _ in range(20)]
            for record in again:
                await b.ack(record)
            assert sorted(r[:2] for r in again) == sorted(more)
            assert {r.partition for r in again} == {0, 1, 2, 3}
            stats = await b.stats()
            assert stats.members == ("b",) and stats.assigned == (0, 1, 2, 3)
        assert k7async_threads() == []


async def test_a_slow_stream_still_hands_over_partitions(tmp_path: Path) -> None:
    """The member that holds a batch and receives nothing more keeps beating: a member that
    joins gets its partitions (without it the reader thread would sleep, and never see it)."""
    with anyio.fail_after(30):
        async with k7async.open_topic(tmp_path / "t", partitions=4, **SMALL) as topic:
            await topic.send_many([b"r%d" % i for i in range(40)])
            async with topic.consumer_stream("g", "slow", max_batch=4, heartbeat=0.02) as slow:
                await slow.receive()  # it has a batch in hand and the next one read: no polls
                assert slow.assignment == (0, 1, 2, 3)
                async with topic.consumer_stream("g", "new", heartbeat=0.02) as new:
                    await until(lambda: split(slow, new, 4), slow, new)
                    # the newcomer reads its partitions (auto_ack: the slow one's batches
                    # were acked on hand-over, so it starts after them)
                    record = await new.receive()
                    assert record.partition in new.assignment


# ---------------------------------------------------------------------- back-pressure


async def test_awaited_send_waits_out_back_pressure(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with stalled(tmp_path / "t", pressure()) as (topic, group, held, before):
            assert topic.back_pressure == pressure()  # as given (on_high="block")
            sent = anyio.Event()
            where: list[tuple[int, int]] = []

            async def sender() -> None:
                where.append(await topic.send(b"late", key="k"))
                sent.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(sender)
                await until_waiting(topic)  # the sender waits in its task
                bystander_ran = anyio.Event()

                async def bystander() -> None:
                    bystander_ran.set()

                tg.start_soon(bystander)
                await bystander_ran.wait()  # the event loop runs other tasks meanwhile
                assert not sent.is_set() and topic.waiting == 1
                stats = await topic.stats()  # and the owner thread serves other calls
                assert stats.back_pressure is not None and stats.back_pressure.paused
                assert ends(stats) == before  # nothing written while paused
                await group.ack_many(held)  # the group catches up: sends resume
                await sent.wait()
            record = await group.receive()
            assert (record.value, record[:2]) == (b"late", where[0])
            await group.ack(record)
            stats = await topic.stats()
            assert stats.back_pressure is not None
            assert not stats.back_pressure.paused and stats.back_pressure.pauses == 1
            assert stats.back_pressure.blocked_seconds > 0  # the time the send waited
            assert topic.waiting == 0


async def test_producer_channel_waits_out_back_pressure(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with stalled(tmp_path / "t", pressure()) as (topic, group, held, before):
            # 4: the lag climbs back to the high mark with the last one (nobody consumes)
            items = [ProducerRecord(b"c%d" % i, key="one") for i in range(4)]
            sent = anyio.Event()
            async with topic.producer_channel(max_buffer_size=1) as send:

                async def sender() -> None:
                    for item in items:
                        await send.send(item)
                    sent.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender)
                    await until_waiting(topic)  # the channel holds a batch, paused
                    bystander_ran = anyio.Event()

                    async def bystander() -> None:
                        bystander_ran.set()

                    tg.start_soon(bystander)
                    await bystander_ran.wait()
                    # the pump holds a batch (1 or 2 items), the buffer 1 more: the
                    # sender waits for room, asynchronously
                    assert not sent.is_set() and topic.waiting == 1
                    assert ends(await topic.stats()) == before
                    await group.ack_many(held)
                    await sent.wait()
            # the exit has written every item sent, in order
            got = [await group.receive() for _ in items]
            assert [r.value for r in got] == [i.value for i in items]
            await group.ack_many(got)
        assert k7async_threads() == []


async def test_on_high_raise_reaches_the_sender(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with stalled(tmp_path / "t", pressure("raise")) as (topic, _, _, before):
            with pytest.raises(BackPressureError) as info:
                await topic.send(b"x")
            assert info.value.lag == 4 and topic.waiting == 0
            with pytest.raises(BackPressureError):  # the exit raises it too
                async with topic.producer_channel(max_buffer_size=1) as send:
                    with pytest.raises(BackPressureError) as info:
                        while True:  # accepted until the channel's first batch fails
                            await send.send(b"y")
                    assert info.value.lag == 4
            assert ends(await topic.stats()) == before  # nothing written


async def test_block_gives_up_after_the_timeout(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with stalled(tmp_path / "t", pressure(timeout=0.05)) as (topic, _, _, before):
            with pytest.raises(BackPressureError, match=r"waited 0\.05 s") as info:
                await topic.send(b"x")
            assert info.value.lag == 4 and topic.waiting == 0
            with pytest.raises(BackPressureError, match="waited"):
                async with topic.producer_channel() as send:
                    await send.send(b"y")
            assert ends(await topic.stats()) == before


async def test_cancelling_a_paused_send_or_channel_returns(tmp_path: Path) -> None:
    """A cancellation ends a wait for back-pressure (nothing written), even in a channel's
    exit, which otherwise writes everything sent."""
    with anyio.fail_after(30):
        async with stalled(tmp_path / "t", pressure(timeout=None)) as (topic, _, _, before):
            async with anyio.create_task_group() as tg:
                tg.start_soon(topic.send, b"never")
                await until_waiting(topic)
                tg.cancel_scope.cancel()
            assert topic.waiting == 0
            with anyio.CancelScope() as scope:
                async with topic.producer_channel() as send:
                    await send.send(b"never either")
                    await until_waiting(topic)
                    scope.cancel()
            assert scope.cancelled_caught and topic.waiting == 0
            assert ends(await topic.stats()) == before
        assert k7async_threads() == []


# ---------------------------------------------------------------------- acks, seek, hand-back


async def test_nack_and_seek(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with k7async.open_topic(tmp_path / "t", partitions=1, **SMALL) as topic:
            sent = await topic.send_many([b"m%d" % i for i in range(6)])
            async with topic.consumer_stream("g", auto_ack=False, max_batch=2) as stream:
                with pytest.raises(k7async.AutoAckError):
                    async with topic.consumer_stream("h") as auto:
                        await auto.ack(await auto.receive())
                first = [await stream.receive() for _ in range(3)]
                await stream.nack(first[1])
                await stream.ack(first[0])
                after = [await stream.receive()]
                while after[-1][:2] != sent[1]:
                    after.append(await stream.receive())
                # the nacked one comes after what the stream already held (the rest of a
                # batch, and the next one if the thread had read it), before anything newer
                assert [r[:2] for r in after[:-1]] == sent[3:3 + len(after) - 1]
                assert len(after) <= 4
                # seek back: what the stream holds of the partition is dropped
                await stream.seek(0, sent[0][1])
                again = [await stream.receive() for _ in range(6)]
                assert [r[:2] for r in again] == sent
                await stream.ack_many(again)
                with pytest.raises(k7core.topics.NotAssignedError):
                    await stream.seek(1, 0)
                with pytest.raises(TypeError):
                    await stream.ack(b"m0")  # type: ignore[arg-type]
            async with topic.consumer_stream("g") as stream:  # everything was acked
                assert (await stream.stats()).topic_group.lag_messages == 0  # type: ignore[union-attr]


async def test_auto_ack_hands_back_what_was_not_received(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with k7async.open_topic(tmp_path / "t", partitions=2, **SMALL) as topic:
            sent = await topic.send_many([b"a%d" % i for i in range(20)])
            async with topic.consumer_stream("g", max_batch=4) as stream:
                got = [await stream.receive() for _ in range(3)]
            async with topic.consumer_stream("g", max_batch=4) as stream:
                rest = [await stream.receive() for _ in range(17)]
    assert sorted(r[:2] for r in got + rest) == sorted(sent)


# ---------------------------------------------------------------------- lifetime and errors


async def test_close_is_idempotent_and_joins_the_threads(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with k7async.open_topic(tmp_path / "t", partitions=2, **SMALL) as topic:
            async with topic.consumer_stream("g") as stream:
                assert len(k7async_threads()) == 2
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream.aclose)
                    tg.start_soon(stream.aclose)
                await stream.aclose()
                assert [t.name for t in k7async_threads()] == ["k7async-topic-t"]
                assert stream.assignment == ()
                with pytest.raises(k7async.StreamClosedError):
                    await stream.receive()
                with pytest.raises(k7async.StreamClosedError):
                    await stream.stats()
            async with topic.consumer_stream("g") as stream:  # the member left: join again
                pass
            async with topic.producer_channel() as send:
                await send.send(b"x")
            with pytest.raises(k7async.StreamClosedError):
                await send.send(b"after")
            async with anyio.create_task_group() as tg:
                tg.start_soon(topic.aclose)
                tg.start_soon(topic.aclose)
            assert topic.closed and k7async_threads() == []
            await topic.aclose()
            with pytest.raises(k7core.ClosedError):
                await topic.send(b"y")
            with pytest.raises(k7core.ClosedError):
                async with topic.producer_channel():
                    pass
        await topic.aclose()
    with Topic(tmp_path / "t", readonly=True) as sync:
        assert [r.value for r in sync.read(0, 0) + sync.read(1, 0)] == [b"x"]


async def test_open_errors_are_raised_on_entry(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, **SMALL):
        pass
    with anyio.fail_after(20):
        with pytest.raises(TopicError):
            async with k7async.open_topic(tmp_path / "t", partitions=3):
                pytest.fail("entered")
        assert k7async_threads() == []
        async with k7async.open_topic(tmp_path / "t") as topic:
            assert topic.partitions == 2
            async with topic.consumer_stream("g", "m1"):
                with pytest.raises(MemberBusyError):
                    async with topic.consumer_stream("g", "m1"):
                        pytest.fail("entered")
            with pytest.raises(k7core.InvalidNameError):
                async with topic.consumer_stream("../escape"):
                    pytest.fail("entered")
            with pytest.raises(TypeError):
                async with k7async.topic_consumer_stream(42, "g"):  # type: ignore[arg-type]
                    pytest.fail("entered")
            with pytest.raises(TypeError):
                async with k7async.topic_producer_channel(topic.path):  # type: ignore[arg-type]
                    pytest.fail("entered")
            with pytest.raises(TypeError):  # an item that is not a record: the exit says so
                async with topic.producer_channel() as send:
                    await send.send(b"good")
                    await send.send(42)  # type: ignore[arg-type]
            assert len(k7async_threads()) == 1
        with Topic(tmp_path / "t", readonly=True) as sync:
            assert [r.value for r in sync.read(0, 0) + sync.read(1, 0)] == [b"good"]
    assert k7async_threads() == []


async def test_a_join_names_a_frozen_lock_holder(tmp_path: Path) -> None:
    """The stream's join waits ``lock_timeout`` for a group lock held by a stopped process,
    then raises TopicLockTimeoutError naming it; a stream already in keeps receiving."""
    with Topic(tmp_path / "t", partitions=2, **SMALL) as t:
        for i in range(4):
            t.send(b"v%d" % i, partition=i % 2)
    with anyio.fail_after(60):
        async with k7async.open_topic(tmp_path / "t") as topic, \
                topic.consumer_stream("g", "in", max_poll_interval=5.0) as stream:
            lock = tmp_path / "t" / "k7py-groups" / "g" / "k7py-group.lock"
            with Child("freeze-in-lock", str(lock),
                       program="tests.k7core.topics._group_children") as frozen:
                try:
                    assert frozen.line() == b"held"
                    with pytest.raises(TopicLockTimeoutError) as info:
                        async with topic.consumer_stream("g", "late", lock_timeout=0.1):
                            pytest.fail("entered")
                    assert info.value.pid == frozen.proc.pid
                    got = [await stream.receive() for _ in range(4)]
                    assert sorted(r.value for r in got) == [b"v0", b"v1", b"v2", b"v3"]
                finally:
                    frozen.proc.send_signal(signal.SIGCONT)
                assert frozen.wait() == 0
