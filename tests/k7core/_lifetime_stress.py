"""The lifetime stress run: a child program of test_lifetime_stress.py (which
sanitize_python.sh runs under AddressSanitizer), not a test module.

    python -m tests.k7core._lifetime_stress DIR SEED ROUNDS

``THREADS`` threads each do ``ROUNDS`` random operations (seeded by ``SEED`` and the thread's
number) on a few queues and a topic under ``DIR``: they open queues (writer, read-only,
``fsync="sync"`` ones that take no flusher slot at open), consumer groups whose queue is
dropped at once, groups opened at the same moment on queue objects the threads share,
k7async channels and topic consumers; they poll, ack, nack and close them, close shared
queues under groups other threads use, keep payload views and columnar batches past their
queue's end and read them later, and collect garbage. The only errors allowed are the ones
that say an object is closed or busy (``EXPECTED``). Prints ``ok`` and the count of each
operation, and exits 0, when every thread got through; a crash, a sanitizer report or a hang
is the failure this run exists to show.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import k7async
import k7core
from k7core.topics import MemberBusyError, Topic

THREADS = 6
QUEUES = 3
SEGMENT = 1 << 20
GROUPS = ("a", "b", "c", "d")
EXPECTED = (
    k7core.ClosedError, k7core.ConcurrentUseError, k7core.GroupBusyError,
    k7core.QueueLockedError, MemberBusyError, k7async.StreamClosedError,
)
KEEP = 64  # payload views and batches kept past their queue


class World:
    """What the threads share: the directories, queue objects any thread uses or closes,
    groups any thread polls or closes, and payloads kept past their queue."""

    def __init__(self, root: Path) -> None:
        self.dirs = [root / f"q{i}" for i in range(QUEUES)]
        self.topic = root / "t"
        self.lock = threading.Lock()
        self.queues: list[k7core.Queue] = []
        self.groups: list[k7core.ConsumerGroup] = []
        self.kept: list[k7core.Message | k7core.ColumnarBatch] = []
        self.ops: Counter[str] = Counter()
        self.failures: list[str] = []

    def pick(self, items: list[Any], rnd: random.Random) -> Any:
        with self.lock:
            return rnd.choice(items) if items else None

    def add(self, items: list[Any], item: Any, limit: int) -> Any:
        """Add ``item``; the oldest one beyond ``limit`` is returned (to be closed or dropped)."""
        with self.lock:
            items.append(item)
            return items.pop(0) if len(items) > limit else None

    def keep(self, msgs: list[Any]) -> None:
        for m in msgs[:2]:
            self.add(self.kept, m, KEEP)


def _fill(w: World) -> None:
    for d in w.dirs:
        with k7core.Queue(d, segment_size=SEGMENT) as q:
            q.enqueue_many([b"m%d" % i for i in range(200)])
    with Topic(w.topic, 2, segment_size=SEGMENT) as t:
        t.send_many([b"r%d" % i for i in range(200)])


def _use_group(w: World, g: k7core.ConsumerGroup, rnd: random.Random) -> None:
    """Poll and ack (or nack) a little, keep some payloads; close, drop or share it."""
    for _ in range(rnd.randint(1, 3)):
        msgs = g.poll(rnd.randint(1, 32), 0)
        w.keep(msgs)
        if msgs and rnd.random() < 0.2:
            g.nack(msgs[0])
        g.ack_many(msgs[1:] if rnd.random() < 0.5 else msgs)
    r = rnd.random()
    if r < 0.4:
        g.close()
    elif r < 0.6:
        old = w.add(w.groups, g, 8)
        if old is not None and rnd.random() < 0.5:
            old.close()
    # else: dropped open (its finalizer releases it, possibly after its queue's)


def op_orphan_group(w: World, rnd: random.Random) -> None:
    """A group whose queue is dropped as soon as it is opened (collected right away)."""
    d = rnd.choice(w.dirs)
    fsync = rnd.choice(("async", "async", "flush", "sync"))
    g = k7core.Queue(d, readonly=rnd.random() < 0.7).consumer_group(
        rnd.choice(GROUPS), cursor_fsync=fsync)
    if rnd.random() < 0.5:
        gc.collect()
    _use_group(w, g, rnd)


def op_share_queue(w: World, rnd: random.Random) -> None:
    """A queue object for every thread: read-only, or a writer with fsync="sync" or
    "flush" (no flusher slot until its first async group)."""
    d = rnd.choice(w.dirs)
    if rnd.random() < 0.6:
        q = k7core.Queue(d, readonly=True)
    else:
        q = k7core.Queue(d, fsync=rnd.choice(("sync", "flush")), segment_size=SEGMENT)
    old = w.add(w.queues, q, 4)
    if old is not None and rnd.random() < 0.5:
        old.close()  # other threads may be using its groups


def op_shared_group(w: World, rnd: random.Random) -> None:
    """Async groups opened on a shared queue, by several threads at once."""
    q = w.pick(w.queues, rnd)
    if q is not None:
        _use_group(w, q.consumer_group(rnd.choice(GROUPS), cursor_fsync="async"), rnd)


def op_burst(w: World, rnd: random.Random) -> None:
    """A fresh queue with no flusher slot yet, and 2 or 3 threads opening their first async
    groups on it at the same moment; the queue is closed, or dropped, under them."""
    q = k7core.Queue(rnd.choice(w.dirs), readonly=True)
    n = rnd.randint(2, 3)
    start = threading.Barrier(n)
    seeds = [rnd.random() for _ in range(n)]
    errors: list[BaseException] = []

    def open_group(i: int, q: k7core.Queue) -> None:
        r = random.Random(seeds[i])
        start.wait()
        try:
            _use_group(w, q.consumer_group(GROUPS[i], cursor_fsync="async"), r)
        except EXPECTED:
            pass
        except BaseException as exc:  # raised in the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=open_group, args=(i, q)) for i in range(n)]
    for t in threads:
        t.start()
    if rnd.random() < 0.3:
        q.close()
    del q  # the threads' groups hold it
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def op_foreign_group(w: World, rnd: random.Random) -> None:
    """A group another thread opened: poll, ack, or close it (it may be in use)."""
    g = w.pick(w.groups, rnd)
    if g is None:
        return
    if rnd.random() < 0.3:
        g.close()
    else:
        w.keep(g.poll(4, 0))
        g.ack_many([])


def op_close_shared(w: World, rnd: random.Random) -> None:
    """Close a shared queue (its groups with it), or only forget it (it is collected once
    no group holds it)."""
    with w.lock:
        q = w.queues.pop(rnd.randrange(len(w.queues))) if w.queues else None
    if q is not None and rnd.random() < 0.7:
        q.close()


def op_write(w: World, rnd: random.Random) -> None:
    """A writer (QueueLockedError while another has the directory), closed or dropped."""
    q = k7core.Queue(rnd.choice(w.dirs), fsync=rnd.choice(("async", "flush", "sync")),
                     commit_interval=rnd.choice((50e-6, 1e-3)), segment_size=SEGMENT)
    q.enqueue_many([b"w%d" % i for i in range(rnd.randint(1, 50))])
    if rnd.random() < 0.5:
        _use_group(w, q.consumer_group(rnd.choice(GROUPS)), rnd)
    if rnd.random() < 0.5:
        q.close()


def op_columnar(w: World, rnd: random.Random) -> None:
    q = w.pick(w.queues, rnd)
    if q is not None:
        b = q.read_columnar(0, rnd.randint(1, 64))
        if len(b):
            w.add(w.kept, b, KEEP)


def op_read_kept(w: World, rnd: random.Random) -> None:
    """Read a payload or a batch kept past its queue's (and group's) end."""
    k = w.pick(w.kept, rnd)
    if isinstance(k, k7core.ColumnarBatch):
        data, _ = k.gather()
        assert data.startswith(bytes(k.payload(0)))
    elif k is not None:
        assert bytes(k.payload)[:1] in (b"m", b"w"), k


def op_topic(w: World, rnd: random.Random) -> None:
    """A topic consumer whose topic is dropped at once."""
    c = Topic(w.topic, 2, readonly=True).consumer(rnd.choice(GROUPS[:2]), heartbeat=0.01)
    for _ in range(rnd.randint(1, 3)):
        recs = c.poll(rnd.randint(1, 16), 0)
        c.ack_many(recs)
    if rnd.random() < 0.7:
        c.close()


async def _channel(w: World, rnd: random.Random) -> None:
    q = k7core.Queue(rnd.choice(w.dirs), readonly=True)
    async with k7async.consumer_group_channel(
        q, rnd.choice(GROUPS), auto_ack=rnd.random() < 0.5, timeout=0.001,
    ) as stream:
        del q  # the channel's group holds it
        with anyio.move_on_after(0.02):  # bounds the receiving only (the group may be drained)
            for _ in range(rnd.randint(1, 20)):
                msg = await stream.receive()
                if not stream.auto_ack:
                    await stream.ack(msg)


async def _topic_stream(w: World, rnd: random.Random) -> None:
    async with k7async.topic_consumer_stream(
        w.topic, rnd.choice(GROUPS[2:]), heartbeat=0.01, timeout=0.001,
    ) as stream:
        with anyio.move_on_after(0.02):
            for _ in range(rnd.randint(1, 20)):
                await stream.receive()


def op_async(w: World, rnd: random.Random) -> None:
    """A k7async channel (a reader thread owning the group) or a topic consumer stream."""
    fn = _channel if rnd.random() < 0.7 else _topic_stream
    anyio.run(fn, w, rnd)


def op_gc(w: World, rnd: random.Random) -> None:
    gc.collect()


OPS: list[tuple[Callable[[World, random.Random], None], int]] = [
    (op_orphan_group, 6), (op_burst, 3), (op_share_queue, 3), (op_shared_group, 8),
    (op_foreign_group, 4), (op_close_shared, 2), (op_write, 2), (op_columnar, 2), (op_read_kept, 3),
    (op_topic, 1), (op_async, 1), (op_gc, 1),
]


def worker(w: World, seed: int, i: int, rounds: int, start: threading.Barrier) -> None:
    rnd = random.Random(seed * 1000 + i)
    fns = [fn for fn, _ in OPS]
    weights = [n for _, n in OPS]
    start.wait()
    for _ in range(rounds):
        fn = rnd.choices(fns, weights)[0]
        try:
            fn(w, rnd)
        except EXPECTED:
            pass
        except BaseException as exc:  # reported, then the run fails
            w.failures.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            return
        with w.lock:
            w.ops[fn.__name__] += 1


def main() -> None:
    root, seed, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    w = World(root)
    _fill(w)
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=worker, args=(w, seed, i, rounds, start))
               for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in list(w.queues):
        q.close()
    if w.failures:
        sys.exit("\n".join(w.failures))
    print("ok " + " ".join(f"{k}={n}" for k, n in sorted(w.ops.items())), flush=True)


if __name__ == "__main__":
    main()
