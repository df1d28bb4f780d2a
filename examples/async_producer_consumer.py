"""Many async producers, an auto-ack consumer and an at-least-once consumer on one queue.

    python examples/async_producer_consumer.py [--trio] [DIR]

Runs under asyncio, or under trio with ``--trio``. Uses a fresh temporary directory unless
DIR is given. Checks what it prints: every message arrives, in order per producer, and what
an at-least-once consumer did not ack comes back after a restart.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

import anyio
import anyio.abc

import k7async

CHANNEL_PRODUCERS = 50  # tasks sending through one producer channel (clones)
AWAITED_PRODUCERS = 20  # tasks awaiting each write (fsync="sync": group commit)
PER_PRODUCER = 100
TOTAL = (CHANNEL_PRODUCERS + AWAITED_PRODUCERS) * PER_PRODUCER


async def channel_producer(i: int, send: anyio.abc.ObjectSendStream[bytes]) -> None:
    async with send:  # each task closes its own clone
        for j in range(PER_PRODUCER):
            await send.send(b"c%d:%d" % (i, j))


async def awaited_producer(q: k7async.AsyncQueue, i: int) -> None:
    for j in range(PER_PRODUCER):
        await q.enqueue(b"a%d:%d" % (i, j))  # returns once msync'd


async def auto_ack_consumer(q: k7async.AsyncQueue, seen: dict[bytes, list[int]]) -> None:
    # At-most-once: each batch is acked when it is handed over. Payloads are views into the
    # log; bytes() copies what we keep.
    async with q.consumer_group_channel("dashboard") as stream:
        count = 0
        async for msg in stream:
            producer, seq = bytes(msg.payload).split(b":")
            seen[producer].append(int(seq))
            count += 1
            if count == TOTAL:
                break
    print(f"  dashboard (auto-ack)      received {count} messages")


async def at_least_once_consumer(q: k7async.AsyncQueue, unique: set[bytes]) -> None:
    async with q.consumer_group_channel("billing", auto_ack=False) as stream:
        deliveries = 0
        nacked = False
        async for msg in stream:
            deliveries += 1
            if deliveries == 100 and not nacked:
                nacked = True
                await stream.nack(msg)  # "could not process it now": comes back first
                print(f"  billing nacked offset {msg.offset}; it will be delivered again")
                continue
            unique.add(bytes(msg.payload))
            await stream.ack(msg)
            if len(unique) == TOTAL:
                break
    print(f"  billing (at-least-once)   received {deliveries} deliveries, {len(unique)} unique")


async def main(directory: Path) -> None:
    path = directory / "events"
    print(f"queue directory: {path}")
    seen: dict[bytes, list[int]] = defaultdict(list)
    unique: set[bytes] = set()

    async with k7async.open_queue(path, fsync="sync") as q:
        print(
            f"{CHANNEL_PRODUCERS} tasks send through a producer channel and "
            f"{AWAITED_PRODUCERS} tasks await enqueue, {PER_PRODUCER} messages each"
        )
        with anyio.fail_after(60):
            async with anyio.create_task_group() as consumers:
                consumers.start_soon(auto_ack_consumer, q, seen)
                consumers.start_soon(at_least_once_consumer, q, unique)
                async with q.producer_channel() as send, anyio.create_task_group() as tg:
                    for i in range(CHANNEL_PRODUCERS):
                        tg.start_soon(channel_producer, i, send.clone())
                    for i in range(AWAITED_PRODUCERS):
                        tg.start_soon(awaited_producer, q, i)
        print(
            f"  the writer thread appended {q.writer.messages} messages with "
            f"{q.writer.batches} enqueue_many calls (= msyncs with fsync='sync')"
        )
        assert q.writer.messages == TOTAL
        assert len(seen) == CHANNEL_PRODUCERS + AWAITED_PRODUCERS
        assert all(seqs == list(range(PER_PRODUCER)) for seqs in seen.values())
        assert len(unique) == TOTAL
        print("  check: every message arrived, in order for each producer")

        # At-least-once across a restart: ack only part of what arrives, then stop.
        await q.enqueue_many([b"late-%d" % i for i in range(5)])
        async with q.consumer_group_channel("billing", auto_ack=False) as stream:
            late = [await stream.receive() for _ in range(5)]
            for msg in late[:2]:
                await stream.ack(msg)
        print("  billing received 5 late messages, acked 2, stopped")

    async with (  # a restart: the queue and the group are opened again
        k7async.open_queue(path, fsync="sync") as q,
        q.consumer_group_channel("billing", auto_ack=False) as stream,
    ):
        again = [bytes((await stream.receive()).payload) for _ in range(3)]
        print(f"  after the restart billing got again: {[p.decode() for p in again]}")
        assert again == [b"late-2", b"late-3", b"late-4"]
        print("  check: the 3 unacked messages were delivered again")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", nargs="?", type=Path, help="parent directory to use")
    parser.add_argument("--trio", action="store_true", help="run under trio instead of asyncio")
    args = parser.parse_args()
    backend = "trio" if args.trio else "asyncio"
    print(f"event loop: {backend}")
    if args.directory is not None:
        anyio.run(main, args.directory, backend=backend)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            anyio.run(main, Path(tmp), backend=backend)
    print("done")


if __name__ == "__main__":
    run()
