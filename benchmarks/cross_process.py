"""Cross-process end-to-end latency: a writer process enqueues timestamps, a ``readonly``
reader in this process polls with a timeout (asleep on the futex) and measures receipt delay.

    python -m benchmarks.cross_process [--messages N] [--interval SECONDS] [--fsync MODE]
                                       [--cursor-fsync MODE] [--dir DIR]

A thin wrapper around the suite's two-process cases (``benchmarks/_scenarios.py``), which
``python -m benchmarks --only "two processes"`` runs with medians over repetitions.
``--interval 0`` lets the writer enqueue as fast as it can (the latency is then mostly the
backlog's).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from ._scenarios import cross_process


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cross_process")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--interval", type=float, default=0.0005,
                    help="seconds between two messages (0: unpaced)")
    ap.add_argument("--fsync", default="flush", choices=["flush", "async", "sync"])
    ap.add_argument("--cursor-fsync", default="async", choices=["flush", "async", "sync"])
    ap.add_argument("--dir", type=Path, default=None, help="where the queue goes")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="k7-xproc-", dir=args.dir))
    try:
        r = cross_process(tmp / "q", args.messages, args.interval, args.fsync,
                          cursor_fsync=args.cursor_fsync)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lat: list[float] = r["latencies"]

    def p(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    print(
        f"fsync={args.fsync} cursor_fsync={args.cursor_fsync} messages={len(lat)} "
        f"latency p50={p(0.5):.1f} us p99={p(0.99):.1f} us max={lat[-1]:.1f} us "
        f"mean={statistics.mean(lat):.1f} us; {len(lat) / r['wall']:,.0f} msg/s; "
        f"reader CPU {r['cpu']:.2f} s over {r['wall']:.2f} s wall"
    )


if __name__ == "__main__":
    main()
