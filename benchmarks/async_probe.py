"""Throughput probe of the k7async bridges (what a message costs when it crosses threads).

    python benchmarks/async_probe.py [--messages N] [--backend asyncio|trio|both] [--dir DIR]

Measures, per backend, with 32-byte payloads on a real disk directory:

- for reference, a bare anyio memory object stream (1 sender task, 1 receiver task);

- producer channel: N messages sent by 1 task, then by 100 tasks (clones), fsync="flush";
  the clock stops when the channel's context has exited (everything is in the queue);
- consumer channel: N pre-written messages received one by one (``async for``), auto-ack
  and at-least-once (one ``await ack`` per message), then auto-ack with
  ``receive_batch()``; max_batch=64; the clock stops at the last message;
- awaited writes: 100 tasks each awaiting ``enqueue`` in a loop on an fsync="sync" queue
  (group commit), with the number of writer batches (= msyncs).

Each case: a small warm-up, then ``--repeat`` runs (3 by default); the median is printed with
the lowest and highest rate, because rates vary a lot from run to run on a shared machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

import anyio
import anyio.abc

import k7async
import k7core

PAYLOAD = b"x" * 32


async def memory_stream_alone(root: Path, n: int) -> tuple[float, str]:
    """Reference: an anyio memory object stream, one sender, one receiver, no queue."""
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
    return n / (time.perf_counter() - t0), "(reference, no queue)"


async def producer_channel(root: Path, n: int, tasks: int) -> tuple[float, str]:
    with k7core.Queue(root / f"prod-{tasks}", fsync="flush") as q:
        per_task = n // tasks

        async def produce(send: anyio.abc.ObjectSendStream[bytes]) -> None:
            async with send:
                for _ in range(per_task):
                    await send.send(PAYLOAD)

        t0 = time.perf_counter()
        async with k7async.producer_channel(q) as send, anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(produce, send.clone())
        elapsed = time.perf_counter() - t0
        assert q.read_columnar(0, 1).offsets, "nothing written"
        return per_task * tasks / elapsed, ""


async def consumer_channel(
    root: Path, n: int, auto_ack: bool, batches: bool = False
) -> tuple[float, str]:
    with k7core.Queue(root / "cons", fsync="flush") as q:
        for _ in range(n // 1000):
            q.enqueue_many([PAYLOAD] * 1000)
        total = n // 1000 * 1000
        t0 = time.perf_counter()
        async with k7async.consumer_group_channel(q, "g", auto_ack=auto_ack) as stream:
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
            elapsed = time.perf_counter() - t0
        return total / elapsed, ""


async def awaited_sync(root: Path, n: int, tasks: int) -> tuple[float, str]:
    per_task = n // tasks
    async with k7async.open_queue(root / "sync", fsync="sync") as q:
        start_batches = q.writer.batches

        async def produce() -> None:
            for _ in range(per_task):
                await q.enqueue(PAYLOAD)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(produce)
        elapsed = time.perf_counter() - t0
        batches = q.writer.batches - start_batches
    total = per_task * tasks
    return total / elapsed, f"{batches} batches (msyncs), {total / batches:.0f} msgs/batch"


async def run_all(root: Path, n: int, repeat: int) -> list[tuple[str, list[float], str]]:
    cases: list[tuple[str, Callable[[Path, int], Awaitable[tuple[float, str]]], int]] = [
        ("anyio memory stream alone, 1 task", memory_stream_alone, n),
        ("producer_channel, 1 task", lambda r, m: producer_channel(r, m, 1), n),
        ("producer_channel, 100 tasks", lambda r, m: producer_channel(r, m, 100), n),
        ("consumer_group_channel, auto-ack", lambda r, m: consumer_channel(r, m, True), n),
        ("consumer_group_channel, at-least-once", lambda r, m: consumer_channel(r, m, False), n),
        (
            "consumer_group_channel, auto-ack, receive_batch",
            lambda r, m: consumer_channel(r, m, True, batches=True),
            n,
        ),
        ('await enqueue, fsync="sync", 100 tasks', lambda r, m: awaited_sync(r, m, 100), n // 10),
    ]
    out = []
    for i, (name, fn, count) in enumerate(cases):
        warm = root / f"warm-{i}"
        warm.mkdir()
        await fn(warm, max(1000, count // 20))
        rates = []
        for r in range(repeat):
            run = root / f"run-{i}-{r}"
            run.mkdir()
            rate, note = await fn(run, count)
            rates.append(rate)
            shutil.rmtree(run)
        out.append((name, rates, note))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median shown)")
    parser.add_argument("--dir", type=Path, default=None, help="parent directory for the queues")
    args = parser.parse_args()
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    print(
        f"python {sys.version.split()[0]}, anyio {version('anyio')}, trio {version('trio')}, "
        f"{args.messages} messages of {len(PAYLOAD)} bytes, median of {args.repeat} runs "
        "[min .. max]"
    )
    for backend in backends:
        root = Path(tempfile.mkdtemp(prefix="k7async-probe-", dir=args.dir))
        try:
            results = anyio.run(run_all, root, args.messages, args.repeat, backend=backend)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"\n[{backend}]")
        for name, rates, note in results:
            spread = f"[{min(rates):,.0f} .. {max(rates):,.0f}]"
            line = f"  {name:<48} {statistics.median(rates):>10,.0f} msg/s  {spread:<21} {note}"
            print(line.rstrip())


if __name__ == "__main__":
    main()
