"""How long a single ``JobStore.put`` can take: each of N puts timed into a fresh store
(``fsync="flush"``, 100-byte bodies), then N/2 more while an explicit snapshot of them runs
in another thread. Prints the median, 99.9th percentile and the longest put of each phase:
the longest is a pause of the whole process (the cycle collector, the snapshot thread holding
the GIL).

``python benchmarks/jobs_pause_probe.py [--jobs N] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from k7core import jobs

BODY = b"x" * 100


def summary(label: str, took: list[float]) -> None:
    took.sort()
    print(f"{label}: {len(took):,} puts, p50 {took[len(took) // 2] * 1e6:.1f} us, "
          f"p99.9 {took[int(len(took) * 0.999)] * 1e6:.0f} us, "
          f"longest {took[-1] * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=600_000)
    ap.add_argument("--dir", default=None, help="where the store goes (a real disk)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, \
            jobs.JobStore(Path(tmp) / "store", snapshot_bytes=1 << 40) as store:
        put, clock = store.put, time.perf_counter
        took: list[float] = []
        for _ in range(args.jobs):
            t0 = clock()
            put(BODY)
            took.append(clock() - t0)
        summary("puts", took)
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


if __name__ == "__main__":
    main()
