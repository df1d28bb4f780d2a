"""Cross-process end-to-end latency: a writer process enqueues timestamps, a ``readonly``
reader in this process polls with a timeout (asleep on the futex) and measures receipt delay.

    python -m benchmarks.cross_process [--messages N] [--fsync flush|async|sync]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import k7core

WRITER = """
import struct, sys, time, k7core
path, n, fsync = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with k7core.Queue(path, fsync=fsync, segment_size=64 << 20) as q:
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(n):
        q.enqueue(struct.pack("<q", time.monotonic_ns()))
        time.sleep(0.0005)
    q.enqueue(b"")
"""


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cross_process")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--fsync", default="flush", choices=["flush", "async", "sync"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k7-xproc-") as tmp:
        path = Path(tmp) / "q"
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(args.messages), args.fsync],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == b"ready"
        lat: list[int] = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with k7core.Queue(path, readonly=True) as q, q.consumer_group("lat") as cg:
            child.stdin.write(b"go\n")
            child.stdin.flush()
            done = False
            while not done:
                for m in cg.poll(max_batch=256, timeout=1.0):
                    now = time.monotonic_ns()
                    if len(m.payload) == 0:
                        done = True
                        break
                    lat.append(now - struct.unpack("<q", m.payload)[0])
                    cg.ack(m)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        child.wait()
    lat.sort()

    def p(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1000

    print(
        f"fsync={args.fsync} messages={len(lat)} latency p50={p(0.5):.1f} us "
        f"p99={p(0.99):.1f} us max={lat[-1] / 1000:.1f} us mean={statistics.mean(lat) / 1000:.1f}"
        f" us; reader CPU {cpu:.2f} s over {wall:.2f} s wall"
    )


if __name__ == "__main__":
    main()
