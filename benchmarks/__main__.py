"""The benchmark suite: this project's cases, two baselines, and peer queues side by side.

    python -m benchmarks [--quick] [--only NAME ...] [--json FILE] [--md FILE] [--plot FILE.png]
                         [--reps N] [--dir DIR] [--no-peers] [--list]

32-byte payloads unless a case says otherwise; every case runs once as a warm-up, then
``--reps`` times (3 by default), and reports the median, lowest and highest value. Queues go
to a temporary directory on a real disk (``--dir``; the default is the system temp directory,
which must not be a tmpfs for the figures to mean anything). ``--quick`` takes under two
minutes (CI smoke); the full run under fifteen. Peers come with ``pip install '.[bench]'``;
missing ones are skipped with a note. ``--list`` prints the selected case names and exits.

Cases: ``_k7`` (single calls: enqueue, poll, round trips, 64 KiB, baselines), ``_scenarios``
(four groups, sustained runs in one and two processes, peak RSS), ``_async`` (k7async
bridges), ``_peers``, ``_jobs`` (issue 14: the job store against litequeue, persist-queue,
huey and beanstalkd, 100-byte bodies; every name starts with ``jobs``, so ``--only jobs``),
``_outbox`` (issue 16: outbox relay throughput and lag, SQLite and PostgreSQL, against
pgqueuer's enqueue; ``--only outbox``), ``_server`` (our beanstalkd server against
beanstalkd 1.12, the same client processes for both; ``--only server``), ``_workers``
(issue 16: worker throughput with an empty consumer, k7's workers against huey, pgqueuer,
arq and RQ; ``--only workers``), ``_shared`` (issue 17: several writer processes on one
queue, ``writers="shared"``, against persist-queue and litequeue in as many processes;
``--only shared``), ``_topics`` (issue 18: ``k7core.topics`` end to end, 4 producer and 2
consumer processes on 8 partitions, against Redis Streams on a local redis-server, and the
exchanges' routing cost per record; ``--only topics``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path

from . import (
    _async,
    _jobs,
    _k7,
    _outbox,
    _peers,
    _scenarios,
    _server,
    _shared,
    _topics,
    _workers,
)
from ._harness import (
    Case,
    Record,
    Skipped,
    console_table,
    iter_selected,
    measure,
    write_json,
    write_markdown,
    write_plot,
)


def _fs_type(path: Path) -> str:
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


GROUP_ORDER = {"k7": 0, "baseline": 1, "peer": 2}


def build_cases(quick: bool, peers: bool) -> tuple[list[Case], list[Skipped]]:
    """Every case of a quick or full run: k7 first, then baselines, then peers, then the
    servers (``_server``), then the cases marked ``late`` (the peak-RSS case, which writes
    gigabytes)."""
    cases = _k7.cases(_k7.QUICK if quick else _k7.FULL)
    cases += _scenarios.cases(_scenarios.QUICK if quick else _scenarios.FULL)
    cases += _async.cases(_async.QUICK if quick else _async.FULL)
    job_cases, skipped = _jobs.cases(_jobs.QUICK if quick else _jobs.FULL, peers)
    cases += job_cases
    outbox_cases, outbox_skipped = _outbox.cases(_outbox.QUICK if quick else _outbox.FULL, peers)
    cases += outbox_cases
    skipped += outbox_skipped
    worker_cases, worker_skipped = _workers.cases(_workers.QUICK if quick else _workers.FULL,
                                                  peers)
    cases += worker_cases
    skipped += worker_skipped
    shared_cases, shared_skipped = _shared.cases(_shared.QUICK if quick else _shared.FULL, peers)
    cases += shared_cases
    skipped += shared_skipped
    topic_cases, topic_skipped = _topics.cases(_topics.QUICK if quick else _topics.FULL, peers)
    cases += topic_cases
    skipped += topic_skipped
    if peers:
        peer_cases, peer_skipped = _peers.cases(*((1_000, 100) if quick else (5_000, 500)))
        cases += peer_cases
        skipped += peer_skipped
    cases.sort(key=lambda c: GROUP_ORDER.get(c.group, len(GROUP_ORDER)))
    # The servers (ours and beanstalkd) one load after the other, in their own order.
    server_cases, server_skipped = _server.cases(_server.QUICK if quick else _server.FULL, peers)
    cases += server_cases
    skipped += server_skipped
    cases.sort(key=lambda c: c.late)
    return cases, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (< ~2 min, CI smoke)")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run only cases whose name contains NAME (repeatable)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write records as JSON")
    ap.add_argument("--md", type=Path, metavar="FILE", help="write a Markdown table")
    ap.add_argument("--plot", type=Path, metavar="FILE.png", help="bar chart of msg/s (log)")
    ap.add_argument("--reps", type=int, default=3, help="measured repetitions (>= 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where queues go (a real disk)")
    ap.add_argument("--no-peers", action="store_true", help="skip the peer queues")
    ap.add_argument("--list", action="store_true", help="print the selected case names, exit")
    args = ap.parse_args(argv)
    if args.reps < 3:
        ap.error("--reps must be at least 3")

    cases, skipped = build_cases(args.quick, not args.no_peers)
    selected = list(iter_selected(cases, args.only))
    skipped = [s for s in skipped if not args.only or any(o.lower() in s.name.lower()
                                                            for o in args.only)]
    if not selected and not skipped:
        ap.error(f"no case matches --only {args.only}")
    if args.list:
        print("\n".join(c.name for c in selected))
        return 0

    root = Path(tempfile.mkdtemp(prefix="k7-bench-", dir=args.dir))
    fstype = _fs_type(root)
    print(f"queues in {root} ({fstype}); {'quick' if args.quick else 'full'} mode, "
          f"{args.reps} reps after a warm-up", file=sys.stderr)
    if fstype in ("tmpfs", "ramfs"):
        print("warning: this directory is on a RAM filesystem; pass --dir on a real disk",
              file=sys.stderr)
    records: list[Record] = []
    failed: list[str] = []
    t_start = time.perf_counter()
    try:
        for i, case in enumerate(selected):
            d = root / f"case{i}"
            d.mkdir()
            t0 = time.perf_counter()
            try:
                records += measure(case, d, args.reps)
            except Exception:  # one broken case must not throw away the whole run
                traceback.print_exc()
                failed.append(case.name)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            print(f"  {case.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - t_start

    print(console_table(records, skipped))
    print(f"({len(records)} records in {elapsed:.1f} s)")
    header = (
        f"`python -m benchmarks{' --quick' if args.quick else ''}` on {date.today()}: "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, queues on {fstype}; medians of {args.reps} after a warm-up."
    )
    if args.json:
        write_json(args.json, records)
    if args.md:
        write_markdown(args.md, records, skipped, header)
    if args.plot:
        write_plot(args.plot, records, header.replace("`", ""))
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
