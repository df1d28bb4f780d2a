"""A job store for the ``k7 jobs`` tests, and a child process that holds one open (not a
test module).

Run as ``python -m tests.k7core.jobs._jobs_child <mode> DIR`` (``tests._childproc.Child``
does so). Modes:

``hold DIR``
    Open the store, :func:`fill` it, reserve job ``e1`` with an owner that stays open, print
    the ids as one JSON line, then block until stdin closes; close the store.

``churn DIR``
    Open the store with small snapshots, :func:`fill` it, print ``ready``, then put and
    delete jobs of 4 KiB without pause (so the background snapshotter writes snapshots,
    deletes old ones and trims the journal all the time) until stdin closes.
"""

from __future__ import annotations

import json
import os
import select
import sys

from k7core.jobs import JobStore


def fill(store: JobStore) -> dict[str, int]:
    """Jobs in every state but reserved, in two tubes; their ids by name.

    ``emails``: ``e0`` ready (priority 10: urgent), ``e1`` ready (1024), ``late`` delayed an
    hour, ``bad`` buried with two error texts (released once, then buried).
    ``thumbs``: ``bin`` buried without an error (key ``k1``, a body that is not UTF-8),
    ``wait`` waiting on ``bin``.
    """
    ids = {
        "e0": store.put(b"email 0", tube="emails", priority=10),
        "e1": store.put(b"email 1", tube="emails"),
        "late": store.put(b"later", tube="emails", delay=3600),
        "bad": store.put(b"bad one", tube="emails", priority=2000),
        "bin": store.put(b"\xff\x00bin", tube="thumbs", key="k1"),
    }
    ids["wait"] = store.put(b"waits", tube="thumbs", depends_on=[ids["bin"]])
    with store.owner() as me:
        me.reserve_job(ids["bad"])
        me.release(ids["bad"], error="smtp timeout")
        me.reserve_job(ids["bad"])
        me.bury(ids["bad"], error="smtp 550\nmailbox unavailable")
        me.reserve_job(ids["bin"])
        me.bury(ids["bin"])
    return ids


def _stdin_closed() -> bool:
    return bool(select.select([sys.stdin], [], [], 0)[0]) and not os.read(0, 1 << 16)


def main() -> None:
    mode, path = sys.argv[1:3]
    if mode == "hold":
        with JobStore(path, fsync="flush") as store, store.owner() as me:
            ids = fill(store)
            me.reserve_job(ids["e1"])
            os.write(1, json.dumps(ids).encode() + b"\n")
            sys.stdin.read()
    elif mode == "churn":
        with JobStore(path, fsync="flush", snapshot_bytes=64 << 10) as store:
            fill(store)
            os.write(1, b"ready\n")
            body = b"x" * 4096
            while not _stdin_closed():
                for _ in range(200):
                    store.delete(store.put(body, tube="churn"))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
