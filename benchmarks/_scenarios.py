"""Longer k7 scenarios: four groups on the same messages, sustained runs in one and two
processes, and peak memory while gigabytes flow through a queue.

The two-process cases and the memory case run a child process (``sys.executable -c``); the
child is always waited for, and killed if this process fails or is interrupted first.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import k7core

from ._harness import PAYLOAD, Case, Run, Samples, percentile, rate

SEGMENT = 256 << 20
SUSTAINED_SEGMENT = 16 << 20  # small enough that sustained runs cross segment rolls
CHILD_TIMEOUT = 900.0  # seconds; a child that takes longer is killed and the case fails


@dataclass(frozen=True)
class Sizes:
    groups: int  # prefilled messages, read by each of the four groups per run
    sustained: int  # messages per run, writer and group in one process
    xproc: int  # messages per run, unpaced writer process
    paced: int  # messages per run, paced writer process
    paced_interval: float  # seconds between two paced messages (absolute schedule)
    rss_bytes: int  # bytes flowing through the memory case (once)
    rss_payload: int  # payload size in the memory case
    rss_segment: int  # segment size in the memory case


QUICK = Sizes(groups=50_000, sustained=100_000, xproc=100_000, paced=2_000,
              paced_interval=200e-6, rss_bytes=256 << 20, rss_payload=64 << 10,
              rss_segment=16 << 20)
FULL = Sizes(groups=100_000, sustained=1_000_000, xproc=1_000_000, paced=20_000,
             paced_interval=200e-6, rss_bytes=4 << 30, rss_payload=64 << 10,
             rss_segment=64 << 20)


# ---------------------------------------------------------------------- four groups


def _four_groups_case(n: int) -> Case:
    name = "k7 four groups, round-robin poll+ack max_batch=256"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "groups", fsync="flush", segment_size=SEGMENT) as q, \
                ExitStack() as stack:
            q.enqueue_many([PAYLOAD] * n)
            groups = [stack.enter_context(q.consumer_group(f"g{i}", cursor_fsync="async"))
                      for i in range(4)]

            def body() -> None:
                active = [(g.poll, g.ack, [0]) for g in groups]
                while active:
                    for entry in list(active):
                        poll, ack, got = entry
                        msgs = poll(256, 0)
                        for m in msgs:
                            ack(m)
                        got[0] += len(msgs)
                        if got[0] >= n:
                            active.remove(entry)

            def run() -> Samples:
                for g in groups:
                    g.seek(0)
                return {name: ("msg/s", rate(4 * n, body))}

            yield run

    return Case(name, "k7", setup, {"payload": 32, "messages": n, "groups": 4,
                                    "cursor_fsync": "async",
                                    "counted": "messages delivered to all groups"})


# ---------------------------------------------------------------------- sustained, one process


def _sustained_one_process_case(n: int) -> Case:
    name = "k7 sustained one process, enqueue_many(1000) + poll(1024)+ack_many"
    batch = [PAYLOAD] * 1000
    count = max(n // 1000, 1) * 1000

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        with k7core.Queue(root / "sustained", fsync="flush",
                          segment_size=SUSTAINED_SEGMENT) as q, \
                q.consumer_group("s", cursor_fsync="async") as cg:
            enqueue_many, poll, ack_many = q.enqueue_many, cg.poll, cg.ack_many

            def body() -> None:
                for _ in range(count // 1000):
                    enqueue_many(batch)
                    got = 0
                    while got < 1000:
                        msgs = poll(1024, 0)
                        ack_many(msgs)
                        got += len(msgs)

            # Each run appends ``count`` more messages: the log keeps growing across runs.
            yield lambda: {name: ("msg/s", rate(count, body))}

    return Case(name, "k7", setup, {"payload": 32, "messages": count, "fsync": "flush",
                                    "segment_MiB": SUSTAINED_SEGMENT >> 20,
                                    "cursor_fsync": "async"})


# ---------------------------------------------------------------------- two processes

# The writer child: opens (creates) the queue, prints "ready", waits for "go" on stdin, then
# enqueues n messages, each the writer's time.monotonic_ns() padded to 32 bytes, then an
# empty message as the end marker. interval > 0: message i is enqueued at go + (i+1)*interval
# (an absolute schedule: sleeping late does not slow the average rate); 0: as fast as it can.
WRITER = r"""
import struct, sys, time, k7core
path, n, interval, fsync, seg = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]),
                                 sys.argv[4], int(sys.argv[5]))
pack, clock, sleep = struct.Struct("<q24x").pack, time.monotonic_ns, time.sleep
with k7core.Queue(path, fsync=fsync, segment_size=seg) as q:
    enqueue = q.enqueue
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit("no go")
    if interval <= 0:
        for _ in range(n):
            enqueue(pack(clock()))
    else:
        step, due = int(interval * 1e9), clock()
        for _ in range(n):
            due += step
            left = due - clock()
            if left > 0:
                sleep(left / 1e9)
            enqueue(pack(clock()))
    enqueue(b"")
"""


@contextmanager
def child_process(script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -c script args`` with pipes on stdin/stdout; on leaving, wait for it
    (killed after CHILD_TIMEOUT), or kill it at once if the block raised."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ok = False
    try:
        yield proc
        ok = True
    finally:
        try:
            if not ok:
                proc.kill()
            if proc.stdin is not None:
                with suppress(OSError):
                    proc.stdin.close()  # a child still waiting for "go" reads EOF
            proc.wait(timeout=CHILD_TIMEOUT)
        except BaseException:  # a timeout, or an interrupt while waiting
            proc.kill()
            proc.wait()
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child process exited with {proc.returncode}")


def cross_process(path: Path, n: int, interval: float, fsync: str = "flush",
                  segment_size: int = SUSTAINED_SEGMENT,
                  cursor_fsync: str = "async") -> dict[str, Any]:
    """One run: a writer child enqueues ``n`` timestamps into ``path``; this process reads them
    through a ``readonly`` queue and a consumer group (poll with a timeout: asleep on the
    futex), acks each batch, and measures the delay from enqueue to receipt.

    Returns ``latencies`` (sorted, microseconds), ``wall`` (s from "go" to the end marker)
    and ``cpu`` (this process's CPU seconds over the same time, every thread).
    """
    unpack_from, clock = struct.Struct("<q").unpack_from, time.monotonic_ns
    with child_process(WRITER, str(path), str(n), repr(interval), fsync,
                       str(segment_size)) as child:
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != b"ready":
            raise RuntimeError("the writer process did not start")
        lat: list[int] = []
        append = lat.append
        with k7core.Queue(path, readonly=True) as q, \
                q.consumer_group("lat", cursor_fsync=cursor_fsync) as cg:
            poll, ack_many = cg.poll, cg.ack_many
            child.stdin.write(b"go\n")
            child.stdin.flush()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            deadline = wall0 + CHILD_TIMEOUT
            done = False
            while not done:
                msgs = poll(256, 0.5)
                now = clock()  # receipt time of the whole batch
                if not msgs:
                    if child.poll() is not None:
                        raise RuntimeError(f"the writer exited ({child.returncode}) early")
                    if time.perf_counter() > deadline:
                        raise TimeoutError("the writer process is too slow")
                    continue
                for m in msgs:
                    payload = m[1]
                    if not len(payload):
                        done = True
                        break
                    append(now - unpack_from(payload)[0])
                ack_many(msgs)
                del msgs, m, payload  # release the views into the segment map
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
    if len(lat) != n:
        raise RuntimeError(f"received {len(lat)} messages, expected {n}")
    lat.sort()
    return {"latencies": [x / 1000 for x in lat], "wall": wall, "cpu": cpu}


def _cross_process_case(n: int, interval: float, cursor_fsync: str = "async") -> Case:
    paced = interval > 0
    base = ("k7 sustained two processes (readonly), "
            + (f"paced {1 / interval:,.0f} msg/s" if paced else "unpaced")
            + (f", cursor_fsync={cursor_fsync}" if cursor_fsync != "async" else ""))

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        runs = iter(range(1 << 30))

        def run() -> Samples:
            path = root / f"xproc-{next(runs)}"  # a fresh queue (and writer process) per run
            try:
                r = cross_process(path, n, interval, cursor_fsync=cursor_fsync)
            finally:
                shutil.rmtree(path, ignore_errors=True)
            lat = r["latencies"]
            out: Samples = {f"{base} p50": ("us", percentile(lat, 0.5)),
                            f"{base} p99": ("us", percentile(lat, 0.99))}
            if not paced:
                out[f"{base} throughput"] = ("msg/s", n / r["wall"])
            out[f"{base} reader cpu/wall"] = ("cpu/wall", r["cpu"] / r["wall"])
            return out

        yield run

    params: dict[str, Any] = {"payload": 32, "messages": n, "fsync": "flush",
                              "segment_MiB": SUSTAINED_SEGMENT >> 20,
                              "poll": "max_batch=256 timeout=0.5", "ack": "ack_many per batch",
                              "cursor_fsync": cursor_fsync}
    if paced:
        params["interval_us"] = round(interval * 1e6)
    return Case(base, "k7", setup, params)


# ---------------------------------------------------------------------- peak memory

# The memory child: enqueue a chunk of messages, poll+ack them, repeat until total bytes have
# flowed; the views of consumed messages are dropped at once, so the maps of finished segments
# can be unmapped. Prints one JSON line: /proc/self/status figures (bytes) before and after.
# VmHWM is reset (clear_refs 5) once the queue and the group are open, so the peak is the
# flow's own; RssAnon and RssFile + RssShmem are sampled after every chunk.
PROC_STATUS = r"""
KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")
def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in KEYS:
                out[key] = int(value.split()[0]) * 1024
    return out
"""
"""Child-script code: ``status()``, this process's memory figures from /proc/self/status
(bytes), shared by the memory children."""

RSS_CHILD = r"""
import json, sys, time, k7core
path, total, size, seg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
""" + PROC_STATUS + r"""
payload = b"z" * size
n, chunk = total // size, max(1, (4 << 20) // size)
with k7core.Queue(path, fsync="flush", segment_size=seg) as q, \
        q.consumer_group("rss", cursor_fsync="async") as cg:
    enqueue, poll, ack_many = q.enqueue, cg.poll, cg.ack_many
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    before = status()
    peak_anon, peak_file = before["RssAnon"], before["RssFile"] + before["RssShmem"]
    t0 = time.perf_counter()
    done = 0
    while done < n:
        k = min(chunk, n - done)
        for _ in range(k):
            enqueue(payload)
        got = 0
        while got < k:
            msgs = poll(k - got, 0)
            if not msgs:
                sys.exit("nothing to poll")
            got += len(msgs)
            ack_many(msgs)
            del msgs
        done += k
        s = status()
        peak_anon = max(peak_anon, s["RssAnon"])
        peak_file = max(peak_file, s["RssFile"] + s["RssShmem"])
    elapsed = time.perf_counter() - t0
    after = status()
print(json.dumps({"before": before, "after": after, "peak_anon": peak_anon,
                  "peak_file": peak_file, "bytes": n * size, "seconds": elapsed,
                  "hwm_reset": reset}))
"""


def _rss_case(s: Sizes) -> Case:
    gib, seg_mib = s.rss_bytes / (1 << 30), s.rss_segment >> 20
    flowed = f"{gib:g} GiB" if gib >= 1 else f"{s.rss_bytes >> 20} MiB"
    base = f"k7 peak RSS, {flowed} through {seg_mib} MiB segments"

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        # The flow runs once, here, in a fresh process (VmHWM is per process and only rises);
        # run() returns that one result for the warm-up and every repetition.
        path = root / "rss"
        try:
            with child_process(RSS_CHILD, str(path), str(s.rss_bytes), str(s.rss_payload),
                               str(s.rss_segment)) as child:
                assert child.stdout is not None
                out = child.stdout.read()
        finally:
            shutil.rmtree(path, ignore_errors=True)
            # Deleting the files drops their dirty pages; wait for the writeback already
            # under way, so that it does not slow the msyncs of whatever runs next.
            os.sync()
        r = json.loads(out.decode().strip().splitlines()[-1])
        before, after = r["before"], r["after"]
        mb = 1e6
        samples: Samples = {
            f"{base} peak RSS": ("MB", after["VmHWM"] / mb),
            f"{base} RSS growth": ("MB", (after["VmHWM"] - before["VmRSS"]) / mb),
            f"{base} anon RSS growth": ("MB", (r["peak_anon"] - before["RssAnon"]) / mb),
            f"{base} file-backed RSS peak": ("MB", r["peak_file"] / mb),
            f"{base} GB flowed": ("GB", r["bytes"] / 1e9),
            f"{base} throughput": ("MB/s", r["bytes"] / r["seconds"] / mb),
        }
        yield lambda: dict(samples)

    return Case(base, "k7", setup, {"payload": s.rss_payload, "segment_MiB": seg_mib,
                                    "messages": s.rss_bytes // s.rss_payload,
                                    "fsync": "flush", "chunk": "4 MiB enqueue, then poll+ack",
                                    "runs": 1}, late=True)


def cases(s: Sizes) -> list[Case]:
    return [
        _four_groups_case(s.groups),
        _sustained_one_process_case(s.sustained),
        _cross_process_case(s.xproc, 0.0),
        _cross_process_case(s.paced, s.paced_interval),
        _cross_process_case(s.paced, s.paced_interval, cursor_fsync="flush"),
        _rss_case(s),
    ]
