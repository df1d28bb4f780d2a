"""What the deleted-directory check costs ``Topic.send`` and ``Exchange.publish``.

``python benchmarks/topics_dirwatch_probe.py [--records N] [--reps R] [--dir DIR]``. One
process, one 8-partition ``"async"`` topic (64 MiB segments) and a direct exchange bound to
it; each rep sends N 1 KiB records keyed ``key-{i % 10000}`` with the check, then without it
(``Topic._writer`` replaced by the bare partition lookup), then publishes N through the
exchange each way. Prints the median and the smallest CPU time a record (``process_time``)
of each, over the reps: A and B interleaved, so that a busy machine weighs on both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from k7core import Queue
from k7core.topics import Exchange, Topic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="k7-dirwatch-", dir=args.dir))
    checked = Topic._writer

    def unchecked(self: Topic, p: int) -> Queue:
        return self._queue(p)

    value = b"x" * 1024
    keys = [b"key-%d" % (i % 10_000) for i in range(args.records)]
    cpu: dict[str, list[float]] = {}
    with Topic(root / "t", partitions=8, segment_size=64 << 20) as t, \
            Exchange(root / "ex", "direct") as ex:
        ex.bind(root / "t", "k")
        for _ in range(args.reps):
            for label, writer in (("with the check", checked), ("without", unchecked)):
                Topic._writer = writer  # type: ignore[method-assign]
                for what, send in (
                    ("Topic.send", lambda k: t.send(value, k)),
                    ("Exchange.publish", lambda k: ex.publish(value, "k", key=k)),
                ):
                    start = time.process_time()
                    for k in keys:
                        send(k)
                    per = (time.process_time() - start) / args.records * 1e6
                    cpu.setdefault(f"{what} {label}", []).append(per)
        Topic._writer = checked  # type: ignore[method-assign]
    for name, v in cpu.items():
        print(f"{name:34s} median {statistics.median(v):5.2f} µs CPU a record, "
              f"smallest {min(v):5.2f}")


if __name__ == "__main__":
    main()
