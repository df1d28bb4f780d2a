"""What the segment size costs: disk taken by a one-message queue (segments are preallocated,
and an open writer with segments of 4 MiB or more prepares the next one as a spare file),
the time to create and to reopen a queue, and enqueue throughput across segment rolls.
32-byte payloads; medians of ``--reps`` runs.

``python benchmarks/segment_size_probe.py [--sizes 16,64,256] [--mib 512] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import k7core

PAYLOAD = b"x" * 32
BATCH = 1000


def disk_bytes(d: Path) -> int:
    """Blocks allocated to the files of ``d`` (what ``du`` counts), in bytes."""
    return sum(p.stat().st_blocks * 512 for p in d.iterdir() if p.is_file())


def median_seconds(reps: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(reps))


def one_message(top: Path, size: int, reps: int) -> dict[str, float]:
    d = top / "one"
    t0 = time.perf_counter()
    q = k7core.Queue(d, segment_size=size, fsync="flush")
    create = time.perf_counter() - t0
    q.enqueue(PAYLOAD)
    spare = d / "k7py-spare.seg"
    deadline = time.monotonic() + 60
    while size >= 4 << 20 and time.monotonic() < deadline and not (
        spare.exists() and spare.stat().st_blocks * 512 >= size
    ):
        time.sleep(0.01)  # a measurement: the spare is prepared by a background thread
    open_disk = disk_bytes(d)
    q.close()
    closed_disk = disk_bytes(d)

    def reopen(readonly: bool) -> float:
        t0 = time.perf_counter()
        k7core.Queue(d, segment_size=size, readonly=readonly).close()
        return time.perf_counter() - t0

    return {
        "create_ms": create * 1e3,
        "reopen_ms": median_seconds(reps, lambda: reopen(False)) * 1e3,
        "open_readonly_ms": median_seconds(reps, lambda: reopen(True)) * 1e3,
        "disk_open_mib": open_disk / 2**20,
        "disk_closed_mib": closed_disk / 2**20,
    }


def throughput(top: Path, size: int, log_bytes: int, fsync: str, batched: bool) -> float:
    """Messages per second for ``log_bytes`` of log (frames) into a new queue."""
    n = log_bytes // k7core.frame_size(len(PAYLOAD))
    batch = [PAYLOAD] * BATCH
    d = top / f"tp-{fsync}-{batched}"
    with k7core.Queue(d, segment_size=size, fsync=fsync, remove_when_empty=True) as q:
        t0 = time.perf_counter()
        if batched:
            for _ in range(n // BATCH):
                q.enqueue_many(batch)
        else:
            enqueue = q.enqueue
            for _ in range(n):
                enqueue(PAYLOAD)
        q.sync()
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,256", help="segment sizes in MiB")
    ap.add_argument("--mib", type=int, default=512, help="MiB of log per throughput run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="parent directory of the queues (default: /tmp)")
    args = ap.parse_args()
    rows = []
    for mib in (int(s) for s in args.sizes.split(",")):
        size = mib << 20
        with tempfile.TemporaryDirectory(dir=args.dir) as top:
            row: dict[str, float] = {"segment_mib": mib, **one_message(Path(top), size, args.reps)}
            for fsync in ("flush", "async"):
                for batched in (False, True):
                    key = f"{'enqueue_many' if batched else 'enqueue'}_{fsync}"
                    row[key] = statistics.median(
                        throughput(Path(top), size, args.mib << 20, fsync, batched)
                        for _ in range(args.reps)
                    )
        rows.append(row)
        print(row, flush=True)
    print()
    print("| segment size | disk, 1 message, writer open / closed | create | reopen (writer) "
          "| open readonly | enqueue flush | enqueue async | enqueue_many(1000) flush "
          "| enqueue_many(1000) async |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['segment_mib']:.0f} MiB | {r['disk_open_mib']:.0f} / "
              f"{r['disk_closed_mib']:.0f} MiB | {r['create_ms']:.1f} ms "
              f"| {r['reopen_ms']:.1f} ms | {r['open_readonly_ms']:.2f} ms "
              f"| {r['enqueue_flush']:,.0f} | {r['enqueue_async']:,.0f} "
              f"| {r['enqueue_many_flush']:,.0f} | {r['enqueue_many_async']:,.0f} |")


if __name__ == "__main__":
    main()
