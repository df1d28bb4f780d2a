"""Where our beanstalkd server's time goes under one load of the ``server`` group: starts
``python -m k7async.server`` (optionally under cProfile, or with ``perf record`` attached),
runs the load with the suite's client processes, and prints jobs/s and the server's CPU per
job by thread (the event loop is the main thread; the store's owner thread and the others
follow by thread id).

    python benchmarks/server_probe.py [--fsync flush|sync] [--load put|take] [--depth 64]
        [--procs 4] [--seconds 5] [--cprofile FILE.prof] [--perf FILE.data]

cProfile sees the main thread only (the event loop side: parsing, anyio, the hand-over to
the owner thread); ``perf record`` sees every thread at the C level (``perf report -i FILE
--sort pid,dso,sym``: pid is the thread).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._jobs import BeanstalkClient
from benchmarks._server import Clients, K7Server, Load, put_pipelined, rate


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of ``pid``, by thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsync", choices=("flush", "sync"), default="flush")
    ap.add_argument("--load", choices=("put", "take"), default="put")
    ap.add_argument("--depth", type=int, default=64, help="requests in flight per connection")
    ap.add_argument("--procs", type=int, default=4, help="client processes")
    ap.add_argument("--conns", type=int, default=1, help="connections per client process")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--prefill", type=int, default=300_000, help="ready jobs (--load take)")
    ap.add_argument("--cprofile", type=Path, metavar="FILE.prof")
    ap.add_argument("--perf", type=Path, metavar="FILE.data")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="k7-server-probe-"))
    flags = ("-F",) if args.fsync == "flush" else ("-f", "0")
    prefix: tuple[str, ...] = (sys.executable,)
    if args.cprofile:
        prefix += ("-m", "cProfile", "-o", str(args.cprofile.resolve()))
    clients = Clients(args.procs)
    perf: subprocess.Popen[bytes] | None = None
    try:
        if args.load == "take":
            filler = K7Server(root / "data", ("-F",))
            client = BeanstalkClient(filler.port)
            put_pipelined(client, args.prefill)
            client.close()
            filler.close()
        server = K7Server(root / "data", flags, prefix)
        try:
            if args.perf:
                perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-o",
                                         str(args.perf), "-p", str(server.proc.pid)])
            before = thread_cpu(server.proc.pid)
            results = clients.run([Load(args.load, server.port, args.seconds, args.conns,
                                        args.depth)] * args.procs)
            after = thread_cpu(server.proc.pid)
        finally:
            if perf is not None:
                perf.send_signal(2)
                perf.wait()
            server.close()
    finally:
        clients.close()
        shutil.rmtree(root, ignore_errors=True)
    jobs = sum(r.jobs for r in results)
    print(f"{args.load} fsync={args.fsync} depth={args.depth} procs={args.procs} "
          f"conns/proc={args.conns}: {jobs:,} jobs, {rate(results):,.0f} jobs/s")
    total = 0.0
    for tid, cpu in sorted(after.items()):
        used = cpu - before.get(tid, 0.0)
        total += used
        if used > 0:
            role = "main (event loop)" if tid == server.proc.pid else "thread"
            print(f"  tid {tid} {role}: {used:.2f} s CPU, {used / jobs * 1e6:.1f} µs/job")
    print(f"  server total: {total:.2f} s CPU, {total / jobs * 1e6:.1f} µs/job")


if __name__ == "__main__":
    main()
