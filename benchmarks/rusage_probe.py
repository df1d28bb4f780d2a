"""Where the time of 1,000,000 ``enqueue`` calls goes: wall time against user and system CPU
and minor page faults (``getrusage``), 4 runs into one fresh queue (``fsync="flush"``).

``python benchmarks/rusage_probe.py [--dir DIR]``. When user + system is well below the
wall time, the process waited for a core: the machine is busy and absolute figures drift.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

import k7core

PAYLOAD = b"x" * 32


def run(label: str, q: k7core.Queue, n: int) -> None:
    enqueue = q.enqueue
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(n):
        enqueue(PAYLOAD)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{label}: {n / wall / 1e6:.2f}M msg/s  wall {wall:.3f}s "
          f"user {r1.ru_utime - r0.ru_utime:.3f}s sys {r1.ru_stime - r0.ru_stime:.3f}s "
          f"minflt {r1.ru_minflt - r0.ru_minflt}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="where the queue goes (a real disk)")
    ap.add_argument("--messages", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d, \
            k7core.Queue(f"{d}/q", fsync="flush") as q:
        for i in range(4):
            run(f"fresh pages run {i}", q, args.messages)


if __name__ == "__main__":
    main()
