"""Child-process programs of ``test_frozen_writers.py`` (not a test module): a shared writer
that takes one of the shared locks and keeps it, for the test to freeze with SIGSTOP.

Run as ``python -m tests.k7core._frozen_children <mode> DIR FSYNC`` (``tests._childproc.Child``
with ``program=``). Each opens ``DIR`` with ``writers="shared"`` and ``fsync=FSYNC``, enqueues
one message, takes its lock through the kernel, prints ``held`` and sleeps until killed.

``hold``
    The lock of appends and rolls, as a writer frozen in the middle of an append holds it.
``holdsync``
    The lock of msyncs, as a writer frozen in the middle of an msync holds it.
``holdthread``
    As ``hold``, from a second thread (whose id is not the process's).

``holdjoin``
    The join lock (``k7py-writers.lock``), as a writer frozen while it joins or leaves.

``loop DIR FSYNC``
    Open ``DIR`` as above, print ``ready``, then append in a loop (``enqueue`` and
    ``enqueue_many`` in turn) until killed: a writer that a SIGSTOP freezes wherever it is.

``own DIR FSYNC``
    An exclusive writer of ``DIR`` that owns its consumer group ``g``; prints ``held``.
``store DIR FSYNC``
    A ``JobStore`` in ``DIR`` (one job in tube ``t``); prints ``held``.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time

import k7core
from k7core._format import SHARED_LOCK
from k7core._kernel import lib
from k7core.jobs import JobStore
from tests._children import say


def own(mode: str, d: str, fsync: str) -> None:
    """The modes ``own`` and ``store``: hold, print ``held``, sleep until killed."""
    held: object
    if mode == "own":
        q = k7core.Queue(d, fsync=fsync)
        q.enqueue(b"from the child")
        held = (q, q.consumer_group("g"))
    else:
        held = JobStore(d, fsync=fsync)
        held.put(b"from the child", tube="t")
    say("held")
    while held:
        time.sleep(60)


def main() -> None:
    mode, d, fsync = sys.argv[1:]
    if mode in ("own", "store"):
        own(mode, d, fsync)
    q = k7core.Queue(d, writers="shared", fsync=fsync)
    if mode == "loop":
        say("ready")
        while True:
            q.enqueue(b"from the child")
            q.enqueue_many([b"child batch"] * 4)
    q.enqueue(b"from the child")
    if mode == "holdjoin":
        fd = os.open(os.path.join(d, SHARED_LOCK), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        say("held")
        while True:
            time.sleep(60)
    w = q._writer
    assert w is not None
    take = {"hold": lib.k7_shared_lock, "holdthread": lib.k7_shared_lock,
            "holdsync": lib.k7_shared_sync_hold}[mode]
    got: list[int] = []
    if mode == "holdthread":  # the thread lives on: a robust lock dies with its thread
        taken = threading.Event()

        def hold() -> None:
            got.append(take(w.c))
            taken.set()
            while True:
                time.sleep(60)

        threading.Thread(target=hold, daemon=True).start()
        taken.wait()
    else:
        got.append(take(w.c))
    assert got == [0], f"{mode}: the lock was not granted"
    say("held")
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
