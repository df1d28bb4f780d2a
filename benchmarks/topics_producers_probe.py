"""Producer processes on one topic: how their number, the fsync strategy and the commit
interval change what 4 (or N) producers sustain, and their CPU per record.

``python benchmarks/topics_producers_probe.py [--records N] [--reps R] [--dir DIR]``. Each
rep runs, for every setting below, N producer processes (spawned, started together) that
each ``send_many`` their share of the records (1 KiB values keyed ``key-{i % 10000}``,
batches of 1,000) into a new 8-partition topic (64 MiB segments), and prints the settings,
msg/s (records / the time from "go" to the last exit) and the children's CPU per record
(``getrusage``, start-up and record building included).

Settings: 1, 2 and 4 processes with ``"flush"``; 4 with ``"async"`` at a commit interval
of 50 µs (the default), 1 ms and 5 ms.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from k7core.topics import Topic

CHILD = r"""
import sys
from k7core.topics import ProducerRecord, Topic
path, first, n, fsync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ci = float(sys.argv[5])
recs = [ProducerRecord(b"x" * 1024, f"key-{(first + j) % 10000}") for j in range(n)]
with Topic(path, fsync=fsync, commit_interval=ci) as t:
    print("ready", flush=True)
    sys.stdin.readline()
    for j in range(0, n, 1000):
        t.send_many(recs[j:j + 1000])
"""

SETTINGS = [(1, "flush", 50e-6), (2, "flush", 50e-6), (4, "flush", 50e-6),
            (4, "async", 50e-6), (4, "async", 1e-3), (4, "async", 5e-3)]


def run(root: Path, procs: int, fsync: str, interval: float, records: int) -> tuple[float, float]:
    path = root / f"t-{procs}-{fsync}-{interval}"
    Topic(path, partitions=8, segment_size=64 << 20).close()
    share = records // procs
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = [subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(i * share), str(share), fsync,
         str(interval)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for i in range(procs)]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    for c in children:
        assert c.wait() == 0
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    shutil.rmtree(path)
    return share * procs / seconds, cpu / (share * procs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.reps):
            for procs, fsync, interval in SETTINGS:
                rate, cpu = run(Path(tmp), procs, fsync, interval, args.records)
                print(f"rep {rep} procs {procs} fsync {fsync} commit_interval {interval:g}: "
                      f"{rate:,.0f} msg/s, {cpu:.2f} us CPU a record", flush=True)


if __name__ == "__main__":
    main()
