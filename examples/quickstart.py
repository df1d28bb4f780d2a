"""Quickstart: produce, consume with two groups, ack, reopen, resume.

    python examples/quickstart.py [DIR]

Uses a fresh temporary directory unless DIR is given.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import k7core


def main(directory: Path) -> None:
    path = directory / "orders"
    print(f"queue directory: {path}")

    with k7core.Queue(path, fsync="flush", segment_size=1 << 20) as q:
        first = q.enqueue(b"order #1")
        rest = q.enqueue_many([f"order #{i}".encode() for i in range(2, 11)])
        print(f"enqueued 10 messages at offsets {first}..{rest[-1]}")

        with q.consumer_group("billing") as billing:
            batch = billing.poll(max_batch=4, timeout=0.05)
            for msg in batch:
                print(f"  billing got {bytes(msg.payload).decode()!r} at offset {msg.offset}")
                billing.ack(msg)
            print(f"billing committed offset: {billing.committed} (lag {billing.lag} bytes)")

        with q.consumer_group("audit") as audit:
            seen = []
            while batch := audit.poll(max_batch=100, timeout=0.01):
                for msg in batch:
                    seen.append(bytes(msg.payload).decode())
                    audit.ack(msg)
            print(f"audit read all {len(seen)} messages independently: {seen[0]} .. {seen[-1]}")

    print("closed; reopening the queue ...")
    with k7core.Queue(path, fsync="flush") as q:
        q.enqueue(b"order #11")
        with q.consumer_group("billing") as billing:
            resumed = []
            while batch := billing.poll(max_batch=100, timeout=0.01):
                for msg in batch:
                    resumed.append(bytes(msg.payload).decode())
                    billing.ack(msg)
            print(f"billing resumed after its cursor: {resumed}")
            assert resumed == [f"order #{i}" for i in range(5, 12)], resumed
        with q.consumer_group("audit") as audit:
            assert audit.poll(max_batch=100, timeout=0.01)[0].payload == b"order #11"
            print("audit sees only the new message")
    print("done")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory(prefix="k7-quickstart-") as tmp:
            main(Path(tmp))
