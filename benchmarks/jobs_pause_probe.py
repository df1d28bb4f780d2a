"""How long a single ``JobStore.put`` can take: each of N puts timed into a fresh store
(``fsync="flush"``, 100-byte bodies), then as many more as fit while an explicit snapshot of them
runs in another thread, then (the control) the same two phases into a second store with no
snapshot. Prints the median, 99.9th percentile and the longest put of each phase:
the longest is a pause of the whole process (the cycle collector, the snapshot thread holding
the GIL).

``--touch-gib G`` first writes and frees G GiB of memory, so that the puts do not meet
memory the process touches for the first time: on the development machine (a Firecracker
VM) such first touches stalled a thread for up to a third of a second.

``python benchmarks/jobs_pause_probe.py [--jobs N] [--dir DIR] [--touch-gib G]``
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from k7core import jobs

BODY = b"x" * 100


def summary(label: str, took: list[float]) -> None:
    took.sort()
    print(f"{label}: {len(took):,} puts, p50 {took[len(took) // 2] * 1e6:.1f} us, "
          f"p99.9 {took[int(len(took) * 0.999)] * 1e6:.0f} us, "
          f"longest {took[-1] * 1e3:.1f} ms")


def timed_puts(put: Callable[[bytes], object], n: int) -> list[float]:
    clock = time.perf_counter
    took: list[float] = []
    for _ in range(n):
        t0 = clock()
        put(BODY)
        took.append(clock() - t0)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=600_000)
    ap.add_argument("--dir", default=None, help="where the store goes (a real disk)")
    ap.add_argument("--touch-gib", type=float, default=0.0,
                    help="write and free this much memory first (GiB)")
    args = ap.parse_args()
    if args.touch_gib > 0:
        touched = bytearray(b"\x01") * int(args.touch_gib * (1 << 30))
        del touched
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        with jobs.JobStore(Path(tmp) / "store", snapshot_bytes=1 << 40) as store:
            put, clock = store.put, time.perf_counter
            summary("puts", timed_puts(put, args.jobs))
            done = threading.Event()

            def snapshot() -> None:
                t0 = clock()
                store.snapshot()
                print(f"snapshot of {args.jobs:,} jobs: {clock() - t0:.1f} s")
                done.set()

            thread = threading.Thread(target=snapshot)
            thread.start()
            took = []
            while not done.is_set():
                t0 = clock()
                put(BODY)
                took.append(clock() - t0)
            thread.join()
            summary("puts during the snapshot", took)
        # The control: the same puts into a store of the same size, with no snapshot running
        # (what is left is the store's own cost of growing, such as its job table doubling).
        with jobs.JobStore(Path(tmp) / "control", snapshot_bytes=1 << 40) as control:
            timed_puts(control.put, args.jobs)
            summary("the same puts, no snapshot", timed_puts(control.put, len(took)))


if __name__ == "__main__":
    main()
