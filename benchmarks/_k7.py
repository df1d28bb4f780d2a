"""This project's cases, and the baselines (a bare mmap slice loop, one bulk copy, msync per
call)."""

from __future__ import annotations

import array
import mmap
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import k7core

from ._harness import PAYLOAD, Case, Run, Samples, percentile, rate

SEGMENT = 256 << 20
BIG = b"y" * (64 << 10)
BIG_SEGMENT = 64 << 20


@dataclass(frozen=True)
class Sizes:
    enqueue: int  # messages per run, flush / async
    sync: int  # messages per run, fsync="sync"
    poll: int  # prefilled messages for poll+ack and read_columnar
    latency: int  # round trips per run (flush)
    latency_sync: int  # round trips per run (sync)
    big: int  # 64 KiB messages per run
    msync: int  # msync calls per run


QUICK = Sizes(enqueue=200_000, sync=300, poll=50_000, latency=5_000, latency_sync=300, big=500,
              msync=300)
FULL = Sizes(enqueue=1_000_000, sync=2_000, poll=100_000, latency=20_000, latency_sync=2_000,
             big=2_000, msync=2_000)


def _enqueue_cases(fsync: str, n: int) -> list[Case]:
    batch = [PAYLOAD] * 1000
    col_n = 10_000
    col_data = PAYLOAD * col_n
    col_offs = array.array("q", range(0, len(PAYLOAD) * (col_n + 1), len(PAYLOAD)))

    def make(kind: str) -> Case:
        name = {
            "single": f"k7 enqueue [{fsync}]",
            "many": f"k7 enqueue_many(1000) [{fsync}]",
            "columnar": f"k7 enqueue_columnar(10000) [{fsync}]",
        }[kind]
        count = n if kind == "single" else max(n // 1000, 1) * 1000
        if kind == "columnar":
            count = max(n // col_n, 1) * col_n

        @contextmanager
        def setup(root: Path) -> Iterator[Run]:
            with k7core.Queue(root / f"enq-{fsync}-{kind}", fsync=fsync,
                              segment_size=SEGMENT) as q:
                enqueue, enqueue_many, enqueue_columnar = q.enqueue, q.enqueue_many, \
                    q.enqueue_columnar

                def body() -> None:
                    if kind == "single":
                        for _ in range(count):
                            enqueue(PAYLOAD)
                    elif kind == "many":
                        for _ in range(count // 1000):
                            enqueue_many(batch)
                    else:
                        for _ in range(count // col_n):
                            enqueue_columnar(col_data, col_offs)

                yield lambda: {name: ("msg/s", rate(count, body))}

        return Case(name, "k7", setup, {"payload": 32, "messages": count, "fsync": fsync})

    return [make("single"), make("many"), make("columnar")]


def _poll_case(n: int, b: int, cursor: str, many: bool) -> Case:
    """poll(b) + ack: one ``ack`` per message, or one ``ack_many`` per batch (``many``)."""
    name = (f"k7 poll+ack_many max_batch={b} [cursor {cursor}]" if many
            else f"k7 poll+ack max_batch={b}")

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "poll", fsync="flush", segment_size=SEGMENT) as q:
            q.enqueue_many([PAYLOAD] * n)
            with q.consumer_group("bench", cursor_fsync=cursor) as cg:

                def body() -> None:
                    poll, ack, ack_many, got = cg.poll, cg.ack, cg.ack_many, 0
                    while got < n:
                        msgs = poll(b, 0)
                        if many:
                            ack_many(msgs)
                        else:
                            for m in msgs:
                                ack(m)
                        got += len(msgs)

                def run() -> Samples:
                    cg.seek(0)
                    return {name: ("msg/s", rate(n, body))}

                yield run

    return Case(name, "k7", setup, {"payload": 32, "messages": n, "max_batch": b,
                                    "cursor_fsync": cursor})


def _read_columnar_case(n: int) -> Case:
    name = "k7 read_columnar(65536)"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "rcol", fsync="flush", segment_size=SEGMENT) as q:
            q.enqueue_many([PAYLOAD] * n)

            def body() -> None:
                off, got = 0, 0
                while got < n:
                    batch = q.read_columnar(off, 65536)
                    got += len(batch)
                    off = batch.next

            yield lambda: {name: ("msg/s", rate(n, body))}

    return Case(name, "k7", setup, {"payload": 32, "messages": n})


def _latency_case(fsync: str, n: int) -> Case:
    base = f"k7 round-trip [{fsync}]"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / f"rt-{fsync}", fsync=fsync, segment_size=SEGMENT) as q, \
                q.consumer_group("rt", cursor_fsync=fsync) as cg:
            enqueue, poll, ack, clock = q.enqueue, cg.poll, cg.ack, time.perf_counter_ns

            def run() -> Samples:
                lat: list[float] = []
                for _ in range(n):
                    t0 = clock()
                    enqueue(PAYLOAD)
                    (m,) = poll(1, 1.0)
                    ack(m)
                    lat.append((clock() - t0) / 1000)
                lat.sort()
                return {f"{base} p50": ("us", percentile(lat, 0.5)),
                        f"{base} p99": ("us", percentile(lat, 0.99))}

            yield run

    return Case(base, "k7", setup, {"payload": 32, "round_trips": n, "fsync": fsync,
                                    "cursor_fsync": fsync})


def _big_cases(n: int) -> list[Case]:
    mb = len(BIG) * n / 1e6
    enq_name, drain_name = "k7 64KiB enqueue [flush]", "k7 64KiB poll+ack drain"

    @contextmanager
    def enq_setup(root: Path) -> Iterator[Run]:
        # 64 MiB segments: the runs cross rolls, as a steady writer does (the segments after
        # the first roll come pre-faulted from the spare thread)
        with k7core.Queue(root / "big-enq", fsync="flush", segment_size=BIG_SEGMENT) as q:
            enqueue = q.enqueue

            def body() -> None:
                for _ in range(n):
                    enqueue(BIG)

            yield lambda: {enq_name: ("MB/s", rate(n, body) * len(BIG) / 1e6)}

    @contextmanager
    def drain_setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "big-drain", fsync="flush", segment_size=SEGMENT) as q:
            for _ in range(n):
                q.enqueue(BIG)
            with q.consumer_group("bench", cursor_fsync="async") as cg:

                def body() -> None:
                    got, total = 0, 0
                    while got < n:
                        for m in cg.poll(64, 0):
                            total += len(m.payload)
                            cg.ack(m)
                            got += 1

                def run() -> Samples:
                    cg.seek(0)
                    return {drain_name: ("MB/s", rate(n, body) * len(BIG) / 1e6)}

                yield run

    params = {"payload": len(BIG), "messages": n, "MB": round(mb, 1)}
    enq_params = {**params, "segment_size": BIG_SEGMENT}
    return [Case(enq_name, "k7", enq_setup, enq_params),
            Case(drain_name, "k7", drain_setup, {**params, "max_batch": 64})]


def _mmap_store_case(n: int, name: str, bulk: bool) -> Case:
    """``n`` x 32 bytes into a preallocated mmap (pre-touched by the warm-up run): a Python
    loop of slice stores (no framing, no CRC), or one bulk copy (the memory bandwidth
    ceiling for the payload bytes)."""

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        size = len(PAYLOAD) * n
        data = PAYLOAD * n
        with open(root / "mmap-store", "w+b") as f:
            os.posix_fallocate(f.fileno(), 0, size)
            m = mmap.mmap(f.fileno(), size)
            try:
                def loop() -> None:
                    for pos in range(0, size, 32):
                        m[pos:pos + 32] = PAYLOAD

                def copy() -> None:
                    m[0:size] = data

                body = copy if bulk else loop
                yield lambda: {name: ("msg/s", rate(n, body))}
            finally:
                m.close()

    return Case(name, "baseline", setup, {"payload": 32, "messages": n})


def _msync_case(n: int) -> Case:
    base = "baseline: write 32 B + msync per call"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        page = mmap.PAGESIZE
        size = page * 64
        path = root / "msync"
        with open(path, "w+b") as f:
            os.posix_fallocate(f.fileno(), 0, size)
            m = mmap.mmap(f.fileno(), size)
            try:
                def run() -> Samples:
                    lat: list[float] = []
                    clock = time.perf_counter_ns
                    for i in range(n):
                        pos = (i * 32) % size
                        t0 = clock()
                        m[pos:pos + 32] = PAYLOAD
                        start = pos - pos % page
                        m.flush(start, page)
                        lat.append((clock() - t0) / 1000)
                    lat.sort()
                    return {f"{base} p50": ("us", percentile(lat, 0.5)),
                            f"{base} p99": ("us", percentile(lat, 0.99)),
                            f"{base} rate": ("msg/s", n / (sum(lat) / 1e6))}

                yield run
            finally:
                m.close()

    return Case(base, "baseline", setup, {"payload": 32, "calls": n})


def _partitions_case(n: int, queues: int = 64) -> Case:
    """``enqueue`` round-robin over 64 ``"async"`` queues of one process (a topic's
    partitions): one background flusher thread serves them all."""
    name = f"k7 enqueue over {queues} queues [async]"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        qs = [k7core.Queue(root / f"part-{i}", fsync="async", segment_size=8 << 20)
              for i in range(queues)]
        try:
            enqueues = [q.enqueue for q in qs] * (n // queues)

            def body() -> None:
                for enqueue in enqueues:
                    enqueue(PAYLOAD)

            def run() -> Samples:
                threads = sum(t.name.startswith("k7-flusher") for t in threading.enumerate())
                return {name: ("msg/s", rate(len(enqueues), body)),
                        f"{name} flusher threads": ("threads", threads)}

            yield run
        finally:
            for q in qs:
                q.close()

    return Case(name, "k7", setup, {"payload": 32, "messages": n, "queues": queues})


def cases(s: Sizes) -> list[Case]:
    out: list[Case] = []
    out += _enqueue_cases("flush", s.enqueue)
    out += _enqueue_cases("async", s.enqueue)
    out += _enqueue_cases("sync", s.sync)
    out.append(_partitions_case(s.enqueue // 4))
    out.append(_read_columnar_case(s.poll))
    out += [_poll_case(s.poll, b, "async", many=False) for b in (1, 16, 64, 256, 1024)]
    out += [_poll_case(s.poll, b, cursor, many=True)
            for cursor in ("async", "sync") for b in (64, 1024)]
    out.append(_latency_case("flush", s.latency))
    out.append(_latency_case("sync", s.latency_sync))
    out += _big_cases(s.big)
    out.append(_mmap_store_case(
        s.enqueue, "baseline: Python loop of 32-byte slice stores into an mmap", bulk=False))
    out.append(_mmap_store_case(
        s.enqueue, "baseline: one bulk copy of the same bytes into an mmap", bulk=True))
    out.append(_msync_case(s.msync))
    return out
