"""Group commit of shared ``"sync"`` writers: 8 writer processes against 1, with the msyncs
they made and where their CPU went.

``python benchmarks/shared_sync_probe.py [--messages N] [--reps R] [--dir DIR]``. Each rep
runs one shared writer process, one exclusive writer process and 8 shared writer processes
(spawned, started together), each a loop of N single ``"sync"`` ``enqueue`` calls of 32
bytes, and prints their msg/s, the 8/1 ratio, the 8 processes' messages per msync and mean
msync time (their ``stats()`` summed), and the children's CPU and context switches
(``getrusage``, start-up included).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import k7core

CHILD = r"""
import sys, time, k7core
path, n, shared = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
kw = {"writers": "shared"} if shared else {}
q = k7core.Queue(path, fsync="sync", segment_size=64 << 20, **kw)
print("ready", flush=True)
sys.stdin.readline()
payload = b"x" * 32
t = time.perf_counter()
for _ in range(n):
    q.enqueue(payload)
seconds = time.perf_counter() - t
st = q.stats()
print(seconds, st.log_syncs, st.log_sync.total_seconds if st.log_sync else 0.0, flush=True)
q.close()
"""


def run(root: Path, procs: int, n: int, shared: bool) -> float:
    """``procs`` writer processes of ``n`` messages each, started together: aggregate msg/s."""
    path = root / f"q-{procs}-{int(shared)}-{time.monotonic_ns()}"
    k7core.Queue(path, fsync="sync", segment_size=64 << 20).close()
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(n),
                                  "1" if shared else "0"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(procs)]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        for c in children:
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.flush()
        reports = [c.stdout.readline().split() for c in children if c.stdout is not None]
        wall = time.perf_counter() - t0
    finally:
        for c in children:
            c.wait()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if procs > 1:
        syncs = sum(int(r[1]) for r in reports)
        sync_s = sum(float(r[2]) for r in reports)
        print(f"  {procs} processes: {syncs} msyncs ({procs * n / syncs:.1f} messages per "
              f"msync), mean msync {sync_s / syncs * 1e6:.0f} us; children's CPU user "
              f"{r1.ru_utime - r0.ru_utime:.2f} s sys {r1.ru_stime - r0.ru_stime:.2f} s, "
              f"wall {wall:.2f} s, context switches {r1.ru_nvcsw - r0.ru_nvcsw} voluntary "
              f"{r1.ru_nivcsw - r0.ru_nivcsw} involuntary")
    return procs * n / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--messages", type=int, default=4000, help="per writer process")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the queues go (a real disk)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        root = Path(d)
        for _ in range(args.reps):
            one = run(root, 1, args.messages, True)
            exclusive = run(root, 1, args.messages, False)
            eight = run(root, 8, args.messages, True)
            print(f"1 shared {one:,.0f}  1 exclusive {exclusive:,.0f}  8 shared {eight:,.0f} "
                  f"msg/s  ratio {eight / max(one, exclusive):.2f}", flush=True)


if __name__ == "__main__":
    main()
