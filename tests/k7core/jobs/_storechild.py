"""The child process of the job store's crash tests (not a test module).

Run as ``python -m tests.k7core.jobs._storechild DIR FSYNC SNAPSHOT_BYTES SEED BODY HOOK K``
(``tests._childproc.Child(..., program=...)`` does so). It opens a JobStore on DIR, prints
``ready``, then calls the store forever, at random: put (some delayed by an hour), reserve
(``timeout=0``), delete its reservation, release it (now, or delayed by an hour, with an
error text), bury it (with an error text), kick-job or delete a buried or delayed job, and
with ``HOOK`` = ``none`` an explicit ``snapshot()`` now and then. Before each call it prints
``S <what>``; after the call returned, its result line:

    S P <n> <delay>      P <n> <id>           put of body(SEED, n, BODY)
    S R                  R <id> (0: none)     reserve
    S D <id>             D <id>               delete of its reservation
    S L <id> <delay> <e> L <id>               release (<e>: the error text)
    S B <id> <e>         B <id>               bury
    S K <id>             K <id>               kick-job of a buried or delayed job
    S X <id>             X <id>               delete of a buried or delayed job by the store
    S N                  N <offset>           explicit snapshot

Each line goes out in one ``os.write`` (nothing buffered, never half a line). A result line
is printed only after the call returned: the parent, which SIGKILLs this process, holds it
to every result line it read, and allows the one call started last to have happened or not.

``HOOK`` stops the store inside a snapshot, at the ``K``-th time it gets there, prints
``H <hook>`` and blocks there until killed:

- ``snap-mid``: the snapshot file is half written (its temporary file);
- ``snap-renamed``: it is renamed into place, the older snapshots not yet deleted;
- ``trim-before``: the journal trim (``delete_before``) is called, with segments to delete;
- ``trim-after``: the trim deleted them; the store has not recorded the new snapshot yet.

The first two block the snapshotter thread only (the calls go on); the trims hold the
store's lock (every call waits).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import k7core
import k7core.jobs._files as files_module
from k7core._storage import write_file_atomic
from k7core.jobs import JobStore

TUBE = "t"
MAX_LIVE = 300
DELAY = 3600.0


def body(seed: int, n: int, size: int) -> bytes:
    head = b"%d:%d|" % (seed, n)
    return head + b"." * max(size - len(head), 0)


def say(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def block(hook: str) -> None:
    say(f"H {hook}")
    sys.stdin.readline()  # the parent never writes: this returns when we are killed
    os._exit(3)


def install_hook(hook: str, k: int) -> None:
    seen = [0]

    def due() -> bool:
        seen[0] += 1
        return seen[0] == k

    if hook in ("snap-mid", "snap-renamed"):
        real_write = write_file_atomic

        def write(path: Path, data: bytes | Iterable[bytes], *args: Any) -> None:
            if not path.name.startswith("snapshot-") or not due():
                return real_write(path, data, *args)
            if hook == "snap-renamed":
                real_write(path, data, *args)
                block(hook)
            chunks = iter([data] if isinstance(data, bytes) else data)

            def cut() -> Iterator[bytes]:
                yield next(chunks)
                yield next(chunks)
                block(hook)

            real_write(path, cut(), *args)

        files_module.write_file_atomic = write  # type: ignore[attr-defined, assignment]
    elif hook in ("trim-before", "trim-after"):
        real_trim = k7core.Queue.delete_before

        def trim(q: k7core.Queue, offset: int) -> list[int]:
            bases = sorted(int(n[4:24]) for n in os.listdir(q.path) if n.startswith("seg-"))
            deletes = any(b <= offset for b in bases[1:])
            if not deletes or not due():
                return real_trim(q, offset)
            if hook == "trim-before":
                block(hook)
            real_trim(q, offset)
            block(hook)
            return []

        k7core.Queue.delete_before = trim  # type: ignore[method-assign, assignment]


def main(argv: list[str]) -> None:
    d, fsync, snapshot_bytes, seed_s, size_s, hook, k = argv
    seed, size = int(seed_s), int(size_s)
    rng = random.Random(seed)
    if hook != "none":
        install_hook(hook, int(k))
    store = JobStore(d, fsync=fsync, snapshot_bytes=int(snapshot_bytes))
    me = store.owner()
    others = [j.id for j in store.errors(TUBE)]  # buried or delayed: to kick or delete
    first_delayed = store.peek_delayed(TUBE)
    if first_delayed is not None:
        others.append(first_delayed.id)
    say("ready")
    n = 0
    mine: list[int] = []
    actions = ("put", "reserve", "delete", "release", "bury", "kick", "drop", "snapshot")
    weights = (8, 6, 6, 2, 2, 1, 2, 0.2 if hook == "none" else 0)
    while True:
        action = rng.choices(actions, weights)[0]
        if action == "put" and len(store) < MAX_LIVE:
            delay = DELAY if rng.random() < 0.05 else 0.0
            n += 1
            say(f"S P {n} {delay:g}")
            job_id = store.put(body(seed, n, size), tube=TUBE, delay=delay)
            say(f"P {n} {job_id}")
            if delay:
                others.append(job_id)
        elif action == "reserve":
            say("S R")
            job = me.reserve((TUBE,), timeout=0)
            say(f"R {0 if job is None else job.id}")
            if job is not None:
                mine.append(job.id)
        elif action in ("delete", "release", "bury") and mine:
            job_id = mine.pop(rng.randrange(len(mine)))
            error = f"e{seed}.{n}.{rng.randrange(10**6)}"
            if action == "delete":
                say(f"S D {job_id}")
                me.delete(job_id)
                say(f"D {job_id}")
            elif action == "release":
                delay = DELAY if rng.random() < 0.2 else 0.0
                say(f"S L {job_id} {delay:g} {error}")
                me.release(job_id, delay=delay, error=error)
                say(f"L {job_id}")
                if delay:
                    others.append(job_id)
            else:
                say(f"S B {job_id} {error}")
                me.bury(job_id, error=error)
                say(f"B {job_id}")
                others.append(job_id)
        elif action in ("kick", "drop") and others:
            job_id = others.pop(rng.randrange(len(others)))
            if action == "kick":
                say(f"S K {job_id}")
                store.kick_job(job_id)
                say(f"K {job_id}")
            else:
                say(f"S X {job_id}")
                store.delete(job_id)
                say(f"X {job_id}")
        elif action == "snapshot":
            say("S N")
            say(f"N {store.snapshot()}")


if __name__ == "__main__":
    main(sys.argv[1:])
