"""A multiprocessing pool producing into one queue: each worker process opens the queue with
``writers="shared"`` and appends; one consumer group then reads every message.

    python examples/shared_writers.py [DIRECTORY]

Without DIRECTORY the queue goes to a temporary directory, removed at the end.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from collections import Counter
from pathlib import Path

import k7core

WORKERS = 4
PER_WORKER = 10_000


def produce(path: str, worker: int) -> int:
    """One pool process: open the queue as one of its shared writers, append, close."""
    with k7core.Queue(path, writers="shared", fsync="flush") as q:
        for i in range(PER_WORKER // 2):
            q.enqueue(b"%d:%d" % (worker, i))
        # a batch: its frames are contiguous, no other process's frame lands between them
        q.enqueue_many([b"%d:%d" % (worker, i) for i in range(PER_WORKER // 2, PER_WORKER)])
    return worker


def main(directory: Path) -> None:
    path = str(directory / "events")
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that has queues open
    with ctx.Pool(WORKERS) as pool:
        done = pool.starmap(produce, [(path, w) for w in range(WORKERS)])
    print(f"workers done: {sorted(done)}")

    per_worker: Counter[int] = Counter()
    last: dict[int, int] = {}
    with k7core.Queue(path, readonly=True) as q, q.consumer_group("report") as group:
        while batch := group.poll(max_batch=4096, timeout=0):
            for msg in batch:
                worker, i = map(int, bytes(msg.payload).split(b":"))
                assert i == last.get(worker, -1) + 1, "each worker's messages in its order"
                last[worker] = i
                per_worker[worker] += 1
            group.ack_many(batch)
    counts = dict(sorted(per_worker.items()))
    print(f"messages read: {sum(per_worker.values())}, per worker: {counts}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
