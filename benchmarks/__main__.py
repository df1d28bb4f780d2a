"""Quick throughput probe: enqueue per strategy and poll+ack per batch size.

    python -m benchmarks [--messages N] [--dir DIR] [--json FILE]

Medians of 3 repetitions after a warm-up, 32-byte payloads, data on a real disk directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import k7core

PAYLOAD = b"x" * 32


def median_rate(fn: Callable[[], int], reps: int = 3) -> tuple[float, float, float]:
    fn()  # warm-up
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates), min(rates), max(rates)


def bench_enqueue(root: Path, fsync: str, n: int) -> dict[str, tuple[float, float, float]]:
    out = {}
    with k7core.Queue(root / f"enq-{fsync}", fsync=fsync, segment_size=256 << 20) as q:
        enqueue = q.enqueue

        def single() -> int:
            for _ in range(n):
                enqueue(PAYLOAD)
            return n

        batch = [PAYLOAD] * 1000

        def many() -> int:
            for _ in range(n // 1000):
                q.enqueue_many(batch)
            return n // 1000 * 1000

        out["enqueue"] = median_rate(single)
        out["enqueue_many(1000)"] = median_rate(many)
    return out


def bench_poll_ack(root: Path, n: int, batches: list[int]) -> dict[str, tuple[float, float, float]]:
    out = {}
    with k7core.Queue(root / "poll", fsync="flush", segment_size=256 << 20) as q:
        q.enqueue_many([PAYLOAD] * n)
        with q.consumer_group("bench", cursor_fsync="async") as cg:
            for b in batches:

                def run(b: int = b) -> int:
                    cg.seek(0)
                    poll, ack, got = cg.poll, cg.ack, 0
                    while got < n:
                        msgs = poll(b, 0)
                        for m in msgs:
                            ack(m)
                        got += len(msgs)
                    return got

                out[f"poll+ack batch {b}"] = median_rate(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--sync-messages", type=int, default=2_000)
    ap.add_argument("--dir", type=Path, default=None, help="where queues go (a real disk)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="k7-bench-", dir=args.dir))
    results: dict[str, tuple[float, float, float]] = {}
    try:
        for fs in ("flush", "async"):
            for k, v in bench_enqueue(root, fs, args.messages).items():
                results[f"{k} [{fs}]"] = v
        for k, v in bench_enqueue(root, "sync", args.sync_messages).items():
            results[f"{k} [sync]"] = v
        results.update(bench_poll_ack(root, args.messages, [1, 16, 64, 256, 1024]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'case':36} {'msg/s (median)':>16} {'min':>12} {'max':>12}")
    for k, (med, lo, hi) in results.items():
        print(f"{k:36} {med:16,.0f} {lo:12,.0f} {hi:12,.0f}")
    if args.json:
        recs = [
            {"name": k, "unit": "msg/s", "value": v[0], "min": v[1], "max": v[2], "params": {}}
            for k, v in results.items()
        ]
        args.json.write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
