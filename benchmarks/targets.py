"""Issue 4's, issue 14's and issue 16's targets and the beanstalkd server's, checked against
the records of one run: ``python -m benchmarks.targets FILE.json`` prints a Markdown table
(target, measured, met or missed), then a second one: the job store's ratio to each job-queue
peer of the same run (issue 14 asks for the ratios; they have no floor), then a third: our
server against beanstalkd 1.12, load by load (``_server``), then a fourth: k7's workers
against each worker peer (``_workers``), then a fifth: issue 17's targets for shared
writers (target, measured, met or missed), then a sixth: shared k7 writers against the
multi-process peers, process count by process count (``_shared``; no floor).

Every figure comes from the JSON that ``python -m benchmarks --json FILE.json`` wrote, so a
ratio always compares two figures of the same run. A record missing from the file (a
``--quick`` or ``--only`` run, peers not installed) makes its row say so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._jobs import (
    BEANSTALKD_RAM,
    FSYNC_PER_PUT,
    K7_INPROC,
    K7_PRODUCERS,
    K7_RAM,
    K7_TASKS,
    OS_BUFFERED,
    PRODUCERS,
    RAM_BEYOND_BODY,
    k7_reopen_name,
)
from ._server import (
    BEANSTALKD,
    BEANSTALKD_F0,
    FULL,
    K7_FLUSH,
    K7_SYNC,
    conns_name,
    latency_name,
    pipelined_name,
    put_name,
    take_name,
)
from ._shared import (
    AGGREGATE,
    K7_PROCS,
    ONE_WRITER,
    PEER_PROCS,
    SYNC_CASE,
    SYNC_PROCS,
    peer_name,
    shared_name,
)
from ._workers import BARE_LOOP, K7_ASYNC, K7_WORKER, K7_WORKER_SYNC, server_name

Values = dict[str, float]

NOT_CRASH_SAFE = ("FifoDiskQueue",)
DURABLE_PEERS = ("sqlite3 WAL sync=FULL", "persist-queue SQLiteAckQueue",
                 "queuelib FifoSQLiteQueue", "diskcache Deque sync=FULL")


@dataclass(frozen=True)
class Target:
    what: str
    check: Callable[[Values], tuple[str, bool]]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _at_least(name: str, floor: float, unit: str = "msg/s") -> Callable[[Values], tuple[str, bool]]:
    def check(v: Values) -> tuple[str, bool]:
        return f"{_fmt(v[name])} {unit}", v[name] >= floor
    return check


def _at_most(name: str, ceiling: float, unit: str) -> Callable[[Values], tuple[str, bool]]:
    def check(v: Values) -> tuple[str, bool]:
        return f"{_fmt(v[name])} {unit}", v[name] <= ceiling
    return check


def _ratio(num: str, den: str, floor: float) -> Callable[[Values], tuple[str, bool]]:
    def check(v: Values) -> tuple[str, bool]:
        r = v[num] / v[den]
        return f"{_fmt(v[num])} / {_fmt(v[den])} = {r:.2f}", r >= floor
    return check


def _best_peer(v: Values, phase: str, durable: bool) -> tuple[str, float]:
    """The fastest crash-safe peer (or, with ``durable``, the fastest durable one) in a phase."""
    best = ("", 0.0)
    for name, value in v.items():
        if not (name.startswith("peer ") and name.endswith(" " + phase)):
            continue
        peer = name[len("peer "):-len(phase) - 1]
        if any(s in peer for s in NOT_CRASH_SAFE):
            continue
        if durable and peer not in DURABLE_PEERS:
            continue
        if value > best[1]:
            best = (peer, value)
    if not best[0]:
        raise KeyError(f"peer ... {phase}")
    return best


def _vs_peer(ours: str, phase: str, durable: bool) -> Callable[[Values], tuple[str, bool]]:
    def check(v: Values) -> tuple[str, bool]:
        peer, value = _best_peer(v, phase, durable)
        r = v[ours] / value
        return f"{_fmt(v[ours])} / {_fmt(value)} ({peer}) = {r:.0f} x", r >= 100
    return check


def _cross_process(v: Values) -> tuple[str, bool]:
    base = "k7 sustained two processes (readonly), paced 5,000 msg/s"
    p50, p99, cpu = v[f"{base} p50"], v[f"{base} p99"], v[f"{base} reader cpu/wall"]
    return (f"p50 {_fmt(p50)} µs, p99 {_fmt(p99)} µs, reader CPU/wall {cpu:.2f}",
            p50 <= 100 and p99 <= 1000 and cpu < 0.5)


def _rss(v: Values) -> tuple[str, bool]:
    base = "k7 peak RSS, 4 GiB through 64 MiB segments"
    growth, anon = v[f"{base} RSS growth"], v[f"{base} anon RSS growth"]
    four_segments = 4 * 64 * 1.048576  # MB
    return (f"RSS growth {_fmt(growth)} MB (anonymous {_fmt(anon)} MB) while "
            f"{_fmt(v[f'{base} GB flowed'])} GB flowed", growth <= four_segments)


SLICE_LOOP = "baseline: Python loop of 32-byte slice stores into an mmap"
MSYNC = "baseline: write 32 B + msync per call rate"

TARGETS = [
    Target("`enqueue` flush ≥ 3M msg/s", _at_least("k7 enqueue [flush]", 3e6)),
    Target("`enqueue` flush ≥ 0.4 x mmap slice loop",
           _ratio("k7 enqueue [flush]", SLICE_LOOP, 0.4)),
    Target("`enqueue_many` flush ≥ 10M msg/s", _at_least("k7 enqueue_many(1000) [flush]", 10e6)),
    Target("columnar append ≥ 30M msg/s",
           _at_least("k7 enqueue_columnar(10000) [flush]", 30e6)),
    Target("columnar read ≥ 30M msg/s", _at_least("k7 read_columnar(65536)", 30e6)),
    Target("poll + ack, max_batch=1 ≥ 1M msg/s", _at_least("k7 poll+ack max_batch=1", 1e6)),
    *[Target(f"poll + ack (one `ack` each), max_batch={b} ≥ 3M msg/s",
             _at_least(f"k7 poll+ack max_batch={b}", 3e6)) for b in (64, 256, 1024)],
    *[Target(f"poll + `ack_many` per batch, max_batch={b} ≥ 3M msg/s",
             _at_least(f"k7 poll+ack_many max_batch={b} [cursor async]", 3e6))
      for b in (64, 1024)],
    Target("round trip flush p50 ≤ 2 µs", _at_most("k7 round-trip [flush] p50", 2, "µs")),
    Target("`sync` single producer ≥ 0.9 x msync-per-message baseline",
           _ratio("k7 enqueue [sync]", MSYNC, 0.9)),
    *[Target(f"`sync`, 100 awaiting tasks ≥ 100,000 msg/s ({b})",
             _at_least(f"k7async awaited enqueue [sync] 100 tasks ({b})", 1e5))
      for b in ("asyncio", "trio")],
    *[Target(f"k7async, per message, {what} ≥ 300,000 msg/s (asyncio)",
             _at_least(f"k7async {case} (asyncio)", 3e5))
      for what, case in (("producer channel, 1 task", "producer_channel 1 task"),
                         ("producer channel, 100 tasks", "producer_channel 100 tasks"),
                         ("consumer channel `async for`, auto-ack",
                          "consumer channel auto-ack"))],
    Target("64 KiB enqueue ≥ 1 GB/s", _at_least("k7 64KiB enqueue [flush]", 1000, "MB/s")),
    Target("cross-process p50 ≤ 100 µs, p99 ≤ 1 ms, no spinning core", _cross_process),
    Target("RSS bounded by a few segments over 4 GB (64 MiB segments)", _rss),
    Target("≥ 100 x fastest crash-safe peer, enqueue (`enqueue`, flush)",
           _vs_peer("k7 enqueue [flush]", "enqueue", durable=False)),
    Target("≥ 100 x fastest crash-safe peer, dequeue+ack (poll(64) + `ack` each, flush)",
           _vs_peer("k7 poll+ack max_batch=64", "dequeue+ack", durable=False)),
    Target("≥ 100 x fastest crash-safe peer, dequeue+ack (poll(64) + `ack_many`, flush)",
           _vs_peer("k7 poll+ack_many max_batch=64 [cursor async]", "dequeue+ack",
                    durable=False)),
    Target("≥ 100 x fastest durable peer, enqueue (`sync`, 100 awaiting tasks, asyncio)",
           _vs_peer("k7async awaited enqueue [sync] 100 tasks (asyncio)", "enqueue",
                    durable=True)),
    Target("≥ 100 x fastest durable peer, enqueue (`sync`, `enqueue_many(1000)`)",
           _vs_peer("k7 enqueue_many(1000) [sync]", "enqueue", durable=True)),
    Target("≥ 100 x fastest durable peer, dequeue+ack (cursor `sync`, poll(64) + `ack_many`)",
           _vs_peer("k7 poll+ack_many max_batch=64 [cursor sync]", "dequeue+ack",
                    durable=True)),
    # Issue 14: the job store (100-byte bodies).
    Target("jobs: `put` flush ≥ 300,000 jobs/s",
           _at_least(f"{K7_INPROC} put", 3e5, "jobs/s")),
    Target("jobs: put N, then reserve + delete N, flush ≥ 100,000 jobs/s over the whole",
           _at_least(f"{K7_INPROC} put+reserve+delete", 1e5, "jobs/s")),
    Target(f"jobs: durable puts from {PRODUCERS} producers (asyncio tasks, k7async), `sync` "
           "≥ 50,000 jobs/s", _at_least(K7_TASKS, 5e4, "jobs/s")),
    Target(f"jobs: durable puts from {PRODUCERS} producers (threads), `sync` ≥ 50,000 jobs/s",
           _at_least(K7_PRODUCERS, 5e4, "jobs/s")),
    Target("jobs: reopen a store of 1M live jobs ≤ 3 s",
           _at_most(k7_reopen_name(1_000_000), 3, "s")),
    # Issue 16: the workers, empty consumer, jobs put before.
    Target("workers: in-process `Worker` (1 thread, flush) ≥ 50,000 empty jobs/s",
           _at_least(K7_WORKER, 5e4, "jobs/s")),
    Target("workers: in-process `AsyncWorker` (1 task, asyncio, flush) ≥ 50,000 empty jobs/s",
           _at_least(K7_ASYNC, 5e4, "jobs/s")),
]


# The beanstalkd server: each load of the full run, ours against beanstalkd 1.12 (same
# clients): (what, our record, beanstalkd's record). The floors: "flush" >= 0.5 x
# beanstalkd -b; "sync" (group commit) >= 3 x beanstalkd -b -f 0 on durable puts.
_P, _D, _C = FULL.procs, FULL.depth, FULL.conns
SERVER_LOADS: list[tuple[str, Callable[[str], str]]] = [
    (f"puts, {_P} clients", lambda s: put_name(s, _P)),
    (f"puts pipelined {_D}, {_P} clients", lambda s: pipelined_name(s, _P, _D)),
    (f"reserve+delete, {_P} clients", lambda s: take_name(s, _P)),
    (f"reserve+delete pipelined {_D}, {_P} clients", lambda s: take_name(s, _P, _D)),
    ("puts, 1 client", latency_name),
]
SERVER_DURABLE_LOADS: list[tuple[str, Callable[[str], str]]] = [
    *SERVER_LOADS[:2], (f"puts, {_C} connections", lambda s: conns_name(s, _C))]
TARGETS += [
    *[Target(f"server: `flush` ≥ 0.5 x beanstalkd -b, {what}",
             _ratio(name(K7_FLUSH.name), name(BEANSTALKD.name), 0.5))
      for what, name in SERVER_LOADS[:4]],
    *[Target(f"server: `sync` ≥ 3 x beanstalkd -b -f 0, durable {what}",
             _ratio(name(K7_SYNC.name), name(BEANSTALKD_F0.name), 3))
      for what, name in SERVER_DURABLE_LOADS],
]


def server_ratios(records: list[dict[str, Any]]) -> str:
    """Our server against beanstalkd, like for like (flush against -b, sync against -f 0):
    jobs/s, the server's CPU per job and, for one client, put latency (lower is better)."""
    v = {str(r["name"]): float(r["value"]) for r in records}
    rows = ["| load | ours | beanstalkd | ours / beanstalkd |", "|---|---|---|---|"]
    pairs = ((K7_FLUSH, BEANSTALKD, SERVER_LOADS), (K7_SYNC, BEANSTALKD_F0, SERVER_LOADS +
                                                    SERVER_DURABLE_LOADS[2:]))
    for ours, theirs, loads in pairs:
        for what, name in loads:
            a, b = name(ours.name), name(theirs.name)
            label = f"{what}: {ours.name} / {theirs.name}"
            if a not in v or b not in v:
                rows.append(f"| {label} | not in this run | | — |")
                continue
            cpu = f"{a} (server CPU per job)"
            rows.append(f"| {label} | {_fmt(v[a])} jobs/s | {_fmt(v[b])} jobs/s "
                        f"| {v[a] / v[b]:.2f} x |")
            rows.append(f"| {label}, server CPU per job (lower is better) | {_fmt(v[cpu])} µs "
                        f"| {_fmt(v[f'{b} (server CPU per job)'])} µs "
                        f"| {v[cpu] / v[f'{b} (server CPU per job)']:.2f} x |")
            if name is latency_name:
                for q in ("p50", "p99"):
                    rows.append(f"| put latency {q}, 1 client: {ours.name} / {theirs.name} "
                                f"(lower is better) | {_fmt(v[f'{a} {q}'])} µs "
                                f"| {_fmt(v[f'{b} {q}'])} µs "
                                f"| {v[f'{a} {q}'] / v[f'{b} {q}']:.2f} x |")
    return "\n".join(rows) + "\n"


# The job store against each job-queue peer of the run: (ours, the peer records' suffix,
# what is compared). Peer records are "jobs peer <name><suffix>".
JOB_RATIOS = [
    (f"{K7_INPROC} put", " put", "put, one thread"),
    (f"{K7_INPROC} put+reserve+delete", " put+reserve+delete",
     "put N, then reserve + delete N"),
    (K7_PRODUCERS, f", {PRODUCERS} producers", f"durable puts, {PRODUCERS} producers"),
]


def job_ratios(records: list[dict[str, Any]]) -> str:
    """The ratio of each job-store figure to the same figure of every job-queue peer, with
    both durability classes (like for like when they match), and RAM per live job against
    beanstalkd (lower is better)."""
    by_name = {str(r["name"]): r for r in records}
    rows = ["| job store vs peer | k7 (durability) | peer (durability) | k7 / peer |",
            "|---|---|---|---|"]
    for ours, suffix, what in JOB_RATIOS:
        k7 = by_name.get(ours)
        peer_names = [n for n in by_name if n.startswith("jobs peer ") and n.endswith(suffix)]
        if k7 is None or not peer_names:
            rows.append(f"| {what} | not in this run | | — |")
            continue
        k7_dur = k7["params"].get("durability", "?")
        for name in peer_names:
            peer = by_name[name]
            label = name[len("jobs peer "):-len(suffix)]
            rows.append(
                f"| {what}: {label} | {_fmt(k7['value'])} jobs/s ({k7_dur}) "
                f"| {_fmt(peer['value'])} jobs/s ({peer['params'].get('durability', '?')}) "
                f"| {k7['value'] / peer['value']:,.1f} x |")
    k7_ram = by_name.get(f"{K7_RAM} {RAM_BEYOND_BODY}")
    bs_ram = by_name.get(f"{BEANSTALKD_RAM} {RAM_BEYOND_BODY}")
    if k7_ram is None or bs_ram is None or bs_ram["value"] <= 0:
        rows.append("| RAM per live job beyond the body | not in this run | | — |")
    else:
        rows.append(
            f"| RAM per live job beyond the body ({k7_ram['params'].get('jobs', '?')} jobs; "
            f"lower is better): beanstalkd -b | {_fmt(k7_ram['value'])} B/job "
            f"| {_fmt(bs_ram['value'])} B/job | {k7_ram['value'] / bs_ram['value']:.2f} x |")
    return "\n".join(rows) + "\n"


def worker_ratios(records: list[dict[str, Any]]) -> str:
    """Each worker peer against k7's worker of the same durability class: in process
    (``Worker`` flush, 1 thread, or ``Worker`` sync, 4 threads), and, for ``Worker`` over
    beanstalkd, ``Worker`` over our server with as many connections. Then what a worker
    costs over the bare reserve + delete loop."""
    by_name = {str(r["name"]): r for r in records}
    rows = ["| workers: peer vs k7 | peer (durability) | k7 | k7 / peer |",
            "|---|---|---|---|"]
    like = {OS_BUFFERED: K7_WORKER, FSYNC_PER_PUT: K7_WORKER_SYNC}
    peers = [n for n in by_name if n.startswith("workers peer ")]
    if not peers:
        rows.append("| peers | not in this run | | — |")
    for name in peers:
        peer = by_name[name]
        dur = peer["params"].get("durability", "?")
        ours = [like[dur]] if dur in like else []
        if " over beanstalkd -b, " in name:
            ours.append(server_name(True, name.rsplit(", ", 1)[1]))
        for k7_name in ours:
            k7 = by_name.get(k7_name)
            if k7 is None:
                rows.append(f"| {name[len('workers peer '):]} | {_fmt(peer['value'])} jobs/s "
                            f"({dur}) | {k7_name}: not in this run | — |")
                continue
            rows.append(f"| {name[len('workers peer '):]} vs {k7_name[len('workers k7 '):]} "
                        f"| {_fmt(peer['value'])} jobs/s ({dur}) "
                        f"| {_fmt(k7['value'])} jobs/s ({k7['params'].get('durability', '?')}) "
                        f"| {k7['value'] / peer['value']:,.1f} x |")
    bare = by_name.get(BARE_LOOP)
    for name in (K7_WORKER, K7_ASYNC):
        k7 = by_name.get(name)
        if bare is not None and k7 is not None:
            rows.append(f"| {name[len('workers k7 '):]} vs the bare reserve + delete loop "
                        f"| {_fmt(bare['value'])} jobs/s (baseline) | {_fmt(k7['value'])} "
                        f"jobs/s | {k7['value'] / bare['value']:.2f} x |")
    return "\n".join(rows) + "\n"


# Issue 17: several writer processes on one queue (``_shared``), a table of its own.
SHARED_TARGETS = [
    Target('shared: one writer process, `writers="shared"` ≥ 0.8 x exclusive (`enqueue`, '
           "flush)", _at_least(f"{ONE_WRITER} shared/exclusive", 0.8, "x")),
    *[Target(f"shared: {p} writer processes, `enqueue` (flush) ≥ 2M msg/s aggregate",
             _at_least(f"{shared_name('enqueue', p)} {AGGREGATE}", 2e6)) for p in (2, 4)],
    *[Target(f"shared: {p} writer processes, `enqueue_many(1000)` (flush) ≥ 10M msg/s "
             "aggregate", _at_least(f"{shared_name('enqueue_many(1000)', p)} {AGGREGATE}", 10e6))
      for p in (2, 4)],
    Target(f'shared: {SYNC_PROCS} writer processes, `"sync"` ≥ 5 x 1 process (durable '
           "`enqueue`, aggregate; against the faster of 1 shared and 1 exclusive writer)",
           _at_least(f"{SYNC_CASE} {SYNC_PROCS}/1", 5, "x")),
]


def _k7_shared(kind: str, procs: int) -> tuple[str, str]:
    """The k7 record that does the same work as a peer's ``procs`` processes of ``put``
    (with ``kind`` "flush" or "sync"), and its durability class."""
    if kind == "sync":
        return (f"{SYNC_CASE} {procs} processes" if procs > 1
                else f"{SYNC_CASE} 1 process writers=shared"), FSYNC_PER_PUT
    return f"{shared_name('enqueue', procs)} {AGGREGATE}", OS_BUFFERED


def _times(r: float) -> str:
    return f"{r:,.0f} x" if r >= 10 else f"{r:.2f} x"


def shared_ratios(records: list[dict[str, Any]]) -> str:
    """Shared k7 writers against each multi-process peer with as many processes, one message
    per call: k7 flush (1, 2, 4 processes) against every peer, and k7 sync (1 and 8
    processes) against the peers of the same durability class."""
    by_name = {str(r["name"]): r for r in records}
    rows = ["| shared writers vs peer, same processes | k7 (durability) | peer (durability) "
            "| k7 / peer |", "|---|---|---|---|"]
    for peer, procs in PEER_PROCS.items():
        for p in procs:
            theirs = by_name.get(f"{peer_name(peer, p)} {AGGREGATE}")
            if theirs is None:
                rows.append(f"| {peer}, {p} processes | | not in this run | — |")
                continue
            dur = theirs["params"].get("durability", "?")
            kinds = (["flush"] if p in K7_PROCS else []) + (
                ["sync"] if dur == FSYNC_PER_PUT and p in (1, SYNC_PROCS) else [])
            for kind in kinds:
                name, k7_dur = _k7_shared(kind, p)
                ours = by_name.get(name)
                label = f"{peer}, {p} process{'es' if p > 1 else ''}: k7 {kind}"
                if ours is None:
                    rows.append(f"| {label} | not in this run | {_fmt(theirs['value'])} msg/s "
                                f"({dur}) | — |")
                    continue
                rows.append(f"| {label} | {_fmt(ours['value'])} msg/s ({k7_dur}) "
                            f"| {_fmt(theirs['value'])} msg/s ({dur}) "
                            f"| {_times(ours['value'] / theirs['value'])} |")
    return "\n".join(rows) + "\n"


def table(records: list[dict[str, object]], targets: list[Target] | None = None) -> str:
    """Each target (``TARGETS`` by default) against the records of one run."""
    values: Values = {str(r["name"]): float(r["value"]) for r in records}  # type: ignore[arg-type]
    rows = ["| target | measured (medians of this run) | |", "|---|---|---|"]
    for t in TARGETS if targets is None else targets:
        try:
            measured, ok = t.check(values)
        except KeyError as e:
            rows.append(f"| {t.what} | not in this run ({e}) | — |")
            continue
        rows.append(f"| {t.what} | {measured} | {'met' if ok else '**missed**'} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__)
    ap.add_argument("json", type=Path, help="records written by python -m benchmarks --json")
    args = ap.parse_args()
    records = json.loads(args.json.read_text())
    print(table(records), end="")
    print()
    print(job_ratios(records), end="")
    print()
    print(server_ratios(records), end="")
    print()
    print(worker_ratios(records), end="")
    print()
    print(table(records, SHARED_TARGETS), end="")
    print()
    print(shared_ratios(records), end="")


if __name__ == "__main__":
    main()
