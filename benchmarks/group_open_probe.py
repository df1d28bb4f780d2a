"""What opening a consumer group costs, by where its stored cursor lies: at the end of the
log (nothing to check), at a segment start, or deep inside a full segment (the open walks
the frame headers of that segment up to the cursor, to tell a frame boundary from a
damaged cursor). One segment of 32-byte messages, filled; median of 5 opens each.

``python benchmarks/group_open_probe.py [--segment-size BYTES] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time

import k7core

PAYLOAD = b"x" * 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_size = inspect.signature(k7core.Queue).parameters["segment_size"].default
    ap.add_argument("--segment-size", type=int, default=default_size)
    ap.add_argument("--dir", default=None, help="parent directory of the queue (default: /tmp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as top, k7core.Queue(
        f"{top}/q", fsync="flush", segment_size=args.segment_size
    ) as q:
        per = k7core.frame_size(len(PAYLOAD))
        n = args.segment_size // per - 1
        while n > 0:
            k = min(n, 65536)
            q.enqueue_many([PAYLOAD] * k)
            n -= k
        last = q.end - per
        for label, where in (("at the end", q.end), ("at the segment start", 0),
                             ("at the last frame of the segment", last)):
            with q.consumer_group("g") as g:
                g.seek(where)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                with q.consumer_group("g"):
                    pass
                times.append(time.perf_counter() - t0)
            print(f"open a group, cursor {label} ({where:,} of {q.end:,}): "
                  f"{statistics.median(times) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
