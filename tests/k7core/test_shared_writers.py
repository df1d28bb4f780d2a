"""Shared writers (``Queue(path, writers="shared")``, docs/concurrency.md): several processes
append to one queue directory through a lock in shared memory.

Writer children (``tests/k7core/_shared_children.py``) append self-identifying messages
(``shared_payload(wid, seq)``: writer ``wid``, its message ``seq``) with ``enqueue`` and
``enqueue_many`` on tiny segments (a roll every few dozen messages, by any writer) and report
the offsets every call returned; a consumer group in this process follows the log while they
write. Some are SIGKILLed at random moments (and replaced), one while it holds the shared lock
with unpublished bytes past the end. Afterwards (:func:`check_log`):

- ``k7 verify`` passes; the log is one run of frames from offset 0, frame after frame;
- every message is whole and appears once; each writer's messages are in its order, and each
  writer's messages in the log are a prefix of what it wrote (calls are atomic);
- every offset a child reported as returned holds the message it reported it for, and the
  frames of each ``enqueue_many`` call are consecutive in the log;
- the follower saw exactly the final log, in order, nothing twice.

``"sync"``'s durability (fsynced before return) cannot be checked without losing power; its
runs check the same properties with fewer messages. Seeds are fixed (``K7_SHARED_SEED``).
A hypothesis test interleaves several shared writers of this process (enqueue,
enqueue_many, rolls, close and reopen) against a model of the log.
Threads in this process only read the children's report lines; synchronisation is by those
lines, never by sleeping.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import k7core
from tests._childproc import DEADLINE, Child
from tests._queuehelp import encode_frame, frame_size, k7, read_records
from tests.k7core._shared_children import parse_payload, shared_payload

PROGRAM = "tests.k7core._shared_children"
SEED = int(os.environ.get("K7_SHARED_SEED", "17"))
SEG = 4096  # a roll every ~35 messages
RecordProperty = Callable[[str, object], None]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


@dataclass
class Writer:
    """A writer child whose report lines a thread collects as they come."""

    wid: int
    child: Child
    lines: list[bytes] = field(default_factory=list)
    ended: str | None = None  # why the reading stopped (the child's output ended)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                ln = self.child.line()
                with self.cond:
                    self.lines.append(ln)
                    self.cond.notify_all()
        except AssertionError as exc:  # output ended (exit, kill) or the child went silent
            with self.cond:
                self.ended = str(exc)
                self.cond.notify_all()

    def wait_lines(self, n: int) -> bool:
        """Wait until the child reported ``n`` lines (True) or its output ended (False)."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.lines) >= n or self.ended is not None,
                                      DEADLINE), f"writer {self.wid} is stuck"
            return len(self.lines) >= n

    def wait_end(self) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.ended is not None, DEADLINE)

    def calls(self) -> list[tuple[int, list[int]]]:
        """``(first seq, offsets)`` of every call the child reported as returned."""
        out = []
        for ln in self.lines:
            if ln.startswith(b"O "):
                seq, *offs = map(int, ln.split()[1:])
                out.append((seq, offs))
        return out


def spawn(stack: ExitStack, qdir: Path, fsync: str, wid: int, count: int, seg: int = SEG,
          ) -> Writer:
    child = stack.enter_context(Child(
        "write", str(qdir), fsync, str(seg), str(wid), str(SEED * 1000 + wid), str(count),
        program=PROGRAM,
    ))
    w = Writer(wid, child)
    w.start()
    return w


@contextmanager
def follower(qdir: Path) -> Iterator[tuple[k7core.Queue, k7core.ConsumerGroup]]:
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("follow") as g:
        yield q, g


def follow(g: k7core.ConsumerGroup, seen: list[tuple[int, bytes]], timeout: float) -> None:
    """One poll of the follower, acked."""
    msgs = g.poll(max_batch=1024, timeout=timeout)
    seen.extend((m.offset, bytes(m.payload)) for m in msgs)
    if msgs:
        assert g.ack_many(msgs) == len(msgs)


Calls = dict[int, list[tuple[int, list[int]]]]  # wid -> (first seq, offsets) of each call


def calls_of(writers: Sequence[Writer]) -> Calls:
    return {w.wid: w.calls() for w in writers}


def check_log(qdir: Path, calls: Calls, seen: list[tuple[int, bytes]] | None,
              *, complete: bool) -> list[tuple[int, bytes]]:
    """The checks of the module docstring, on the closed queue at ``qdir``; ``calls``: the
    calls each writer reported as returned. ``complete``: every writer ended cleanly, so
    each wrote all of its messages and nothing more. Returns the log."""
    res = k7("verify", qdir)
    assert res.returncode == 0, (res.stdout + res.stderr).decode(errors="replace")
    with k7core.Queue(qdir, readonly=True) as q:
        log = read_records(q, 0)
        assert q.end == (log[-1][0] + frame_size(len(log[-1][1])) if log else 0)
    index: dict[int, int] = {}  # offset -> position in the log
    where: dict[tuple[int, int], int] = {}  # (wid, seq) -> offset
    last: dict[int, int] = {}  # wid -> last seq so far
    expect = 0
    for k, (off, data) in enumerate(log):
        assert off == expect, f"frame {k} at {off}, expected {expect} (gap or overlap)"
        expect = off + frame_size(len(data))
        wid, seq = parse_payload(data)
        assert data == shared_payload(wid, seq), f"torn message {(wid, seq)} at {off}"
        assert (wid, seq) not in where, f"{(wid, seq)} at {where[(wid, seq)]} and at {off}"
        assert seq == last.get(wid, -1) + 1, (
            f"writer {wid}: message {seq} at {off} follows its message {last.get(wid)}")
        last[wid] = seq
        where[(wid, seq)] = off
        index[off] = k
    for wid, made in calls.items():
        for seq, offs in made:
            for j, off in enumerate(offs):
                assert where.get((wid, seq + j)) == off, (
                    f"writer {wid}: message {seq + j} returned offset {off}, in the log at "
                    f"{where.get((wid, seq + j))}")
            ks = [index[o] for o in offs]
            assert ks == list(range(ks[0], ks[0] + len(ks))), (
                f"writer {wid}: the frames of enqueue_many at {offs} are not contiguous")
        if complete:
            n = sum(len(offs) for _, offs in made)
            assert last.get(wid, -1) + 1 == n, f"writer {wid}: {last.get(wid)} of {n}"
    if seen is not None:
        diff = next((i for i, (a, b) in enumerate(zip(seen, log, strict=False)) if a != b),
                    min(len(seen), len(log)))
        assert seen == log, (f"the follower saw {len(seen)} messages, the log holds "
                             f"{len(log)}; first difference at message {diff}")
    return log


# --------------------------------------------------------------------------------------
# (1) the API
# --------------------------------------------------------------------------------------


def test_exclusive_and_shared_writers_exclude_each_other(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush") as a:
        assert a.writers == "shared"
        with pytest.raises(k7core.QueueLockedError) as exc:
            k7core.Queue(qdir, fsync="flush")
        assert "writers='shared'" in str(exc.value)
        assert "writers='shared'" in (exc.value.hint or "")
        with pytest.raises(k7core.QueueLockedError) as exc:
            k7core.Queue(qdir, writers="shared", fsync="sync")
        assert "fsync" in str(exc.value)
        # a second shared writer, in this process too, appends beside the first
        with k7core.Queue(qdir, writers="shared", fsync="flush") as b:
            assert [a.enqueue(b"a0"), b.enqueue(b"b0"), a.enqueue(b"a1")] == [
                0, frame_size(2), 2 * frame_size(2)]
    # the last shared writer gone, an exclusive one opens ...
    with k7core.Queue(qdir, fsync="flush") as ex:
        assert ex.writers == "exclusive"
        assert ex.enqueue(b"x") == 3 * frame_size(2)
        # ... and shared ones are refused while it lives, here and in another process
        with pytest.raises(k7core.QueueLockedError):
            k7core.Queue(qdir, writers="shared", fsync="flush")
        with Child("write", str(qdir), "flush", str(SEG), "1", "1", "1",
                   program=PROGRAM) as child:
            assert child.wait() == 1
            assert "QueueLockedError" in child.stderr()


def test_exclusive_writer_process_refused_beside_a_shared_writer(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush") as q:
        q.enqueue(b"mine")
        with Child("try", str(qdir), "g") as child:  # tests._children: an exclusive open
            assert child.line() == b"QueueLockedError"
            assert child.line() == b"opened"  # the group on a read-only queue
            assert child.wait() == 0, child.stderr()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"writers": "bogus"}, "writers"),
    ({"writers": "shared", "readonly": True}, "readonly"),
])
def test_bad_writers_arguments(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        k7core.Queue(tmp_path / "q", **kwargs)  # type: ignore[arg-type]


def test_readers_and_groups_beside_shared_writers(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with (
        k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=SEG) as a,
        k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=SEG) as b,
        k7core.Queue(qdir, readonly=True) as ro,
        ro.consumer_group("r") as g,
        a.consumer_group("w") as gw,
    ):
        offs = []
        for i in range(100):  # a few rolls, made by either writer
            offs += [a.enqueue(shared_payload(1, i))]
            offs += b.enqueue_many([shared_payload(2, 2 * i), shared_payload(2, 2 * i + 1)])
        assert len(list(qdir.glob("seg-*.k7"))) >= 3
        got = [(m.offset, bytes(m.payload)) for m in g.poll(max_batch=1000, timeout=1)]
        while len(got) < 300:
            batch = g.poll(max_batch=1000, timeout=1)
            assert batch, f"the reader stopped at {len(got)} of 300"
            got += [(m.offset, bytes(m.payload)) for m in batch]
        assert [o for o, _ in got] == offs
        assert [parse_payload(p) for _, p in got][:3] == [(1, 0), (2, 0), (2, 1)]
        wmsgs = gw.poll(max_batch=1000, timeout=1)
        assert wmsgs[0].offset == 0 and gw.ack_many(wmsgs) == len(wmsgs)
        assert ro.end == a.end == b.end


# --------------------------------------------------------------------------------------
# (2) N writer processes, each strategy, a follower
# --------------------------------------------------------------------------------------

COUNTS = {"flush": 8000, "async": 8000, "sync": 80}  # flush, async: in all; sync: each


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_writer_processes_append_while_a_reader_follows(
    tmp_path: Path, n: int, fsync: str
) -> None:
    qdir = tmp_path / "q"
    count = COUNTS[fsync] // n if fsync != "sync" else COUNTS[fsync]
    k7core.Queue(qdir, fsync=fsync, segment_size=SEG).close()
    seen: list[tuple[int, bytes]] = []
    with ExitStack() as stack, follower(qdir) as (q, g):
        writers = [spawn(stack, qdir, fsync, wid, count) for wid in range(1, n + 1)]
        while not all(w.ended for w in writers):
            follow(g, seen, 0.05)
        for w in writers:
            assert w.child.wait() == 0, w.child.stderr()
            assert w.lines[0] == b"ready" and w.lines[-1] == b"done", w.lines[-3:]
        while len(seen) < n * count:  # "async": the last writer's close published the rest
            before = len(seen)
            follow(g, seen, 1.0)
            assert len(seen) > before, f"the follower stopped at {len(seen)} of {n * count}"
        follow(g, seen, 0)
        assert g.position == q.end
    log = check_log(qdir, calls_of(writers), seen, complete=True)
    assert len(log) == n * count
    assert len(list(qdir.glob("seg-*.k7"))) >= 5, "the writers should have rolled often"


def test_sync_writer_processes_share_their_msyncs(tmp_path: Path) -> None:
    """Group commit across processes: 4 processes, each a loop of single ``"sync"``
    enqueues, started together. An msync's leader gathers the writers the last msync woke,
    so one msync serves about all 4; without the gather they take turns in two halves (2 a
    msync), without a shared msync each makes its own (1)."""
    qdir = tmp_path / "q"
    n, count = 4, 300
    k7core.Queue(qdir, fsync="sync").close()
    with ExitStack() as stack:
        children = [stack.enter_context(Child("syncloop", str(qdir), str(wid), str(count),
                                              program=PROGRAM)) for wid in range(1, n + 1)]
        for c in children:
            assert c.line() == b"ready", c.stderr()
        for c in children:
            c.send("go")
        syncs = 0
        for c in children:
            word, k = c.line().split()
            assert word == b"syncs", c.stderr()
            syncs += int(k)
            assert c.line() == b"done" and c.wait() == 0, c.stderr()
    log = check_log(qdir, {}, None, complete=False)
    assert sorted(parse_payload(m) for _, m in log) == [
        (wid, seq) for wid in range(1, n + 1) for seq in range(count)]
    assert syncs <= n * count / 3, f"{syncs} msyncs for {n * count} messages"


# --------------------------------------------------------------------------------------
# (3) SIGKILLs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fsync", "rounds"), [("flush", 30), ("async", 16), ("sync", 10)])
def test_random_sigkills_of_writers(
    tmp_path: Path, fsync: str, rounds: int, record_property: RecordProperty
) -> None:
    """Three writer children append at once; again and again one of them is SIGKILLed after
    a random number of report lines (its in-flight call may be mid-frame, mid-roll,
    mid-msync, holding the lock or not) and replaced by a new one, while the others go on.
    A shared writer of this process (writer 0) stays open all along and appends one message
    after each kill; it is the last to close."""
    rng = random.Random(f"{SEED}-kills-{fsync}")
    qdir = tmp_path / "q"
    count = 400 if fsync != "sync" else 150
    seen: list[tuple[int, bytes]] = []
    kills = 0
    mine: list[tuple[int, list[int]]] = []
    with (
        ExitStack() as stack,
        k7core.Queue(qdir, writers="shared", fsync=fsync, segment_size=SEG) as obs,
        follower(qdir) as (q, g),
    ):
        live = [spawn(stack, qdir, fsync, wid, count) for wid in (1, 2, 3)]
        every = list(live)
        for r in range(rounds):
            k = rng.randrange(len(live))
            victim = live[k]
            if victim.wait_lines(len(victim.lines) + rng.randint(0, count // 10)):
                victim.child.proc.send_signal(signal.SIGKILL)
                kills += 1
            victim.wait_end()
            assert victim.child.wait() in (0, -signal.SIGKILL), victim.child.stderr()
            mine.append((r, [obs.enqueue(shared_payload(0, r))]))
            follow(g, seen, 0)
            live[k] = spawn(stack, qdir, fsync, len(every) + 1, count)
            every.append(live[k])
        for w in live:
            w.wait_end()
            assert w.child.wait() == 0, w.child.stderr()
        assert obs._writer is not None and obs._writer._shared is not None
        deaths = obs._writer._shared.state().deaths
        obs.close()  # the last writer: it published everything
        while True:
            before = len(seen)
            follow(g, seen, 0.2)
            if len(seen) == before and g.position == q.end:
                break
    record_property("kills", kills)
    record_property("holder_deaths", deaths)
    assert kills >= rounds // 2, f"only {kills} kills in {rounds} rounds"
    check_log(qdir, {0: mine, **calls_of(every)}, seen, complete=False)
    for w in live:  # the survivors wrote everything
        assert sum(len(offs) for _, offs in w.calls()) == count


@pytest.mark.parametrize("others", ["live", "none"])
def test_writer_killed_while_holding_the_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, others: str
) -> None:
    """A child takes the shared lock, writes an unpublished frame and garbage past the end,
    and is SIGKILLed holding the lock. ``live``: a writer of this process was open all along
    and recovers on its next enqueue; ``none``: it was the only writer, and the next to open
    recovers at open. Both recover as open-time recovery does: the whole valid frame stays
    (as an exclusive writer's would), the garbage after it goes to a side file, a WARNING."""
    qdir = tmp_path / "q"
    seg = 1 << 16
    caplog.set_level(logging.WARNING, logger="k7core")
    with ExitStack() as stack:
        mine = (stack.enter_context(k7core.Queue(qdir, writers="shared", fsync="flush",
                                                 segment_size=seg))
                if others == "live" else None)
        mine_offs = [mine.enqueue(shared_payload(0, 0))] if mine is not None else []
        child = stack.enter_context(Child("hold", str(qdir), "flush", str(seg), "1", "20",
                                          program=PROGRAM))
        lines = []
        while not (ln := child.line()).startswith(b"held"):
            lines.append(ln)
        pos, size = map(int, ln.split()[1:])
        holder = Writer(1, child, lines)
        child.proc.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        assert not list(qdir.glob("k7py-torn-*"))
        if mine is None:
            mine = stack.enter_context(k7core.Queue(qdir, writers="shared", fsync="flush",
                                                    segment_size=seg))
        s = len(mine_offs)
        after = mine.enqueue(shared_payload(0, s))
        frame = encode_frame(shared_payload(1, 20))
        end = pos + len(frame)
        assert after == end, f"the next append went to {after}, not {end}"
        mine_offs += [after, *mine.enqueue_many([shared_payload(0, s + 1),
                                                 shared_payload(0, s + 2)])]
    torn = list(qdir.glob("k7py-torn-*"))
    assert len(torn) == 1, torn
    assert torn[0].read_bytes() == bytes(range(1, 200))
    assert size == len(frame) + 199
    text = caplog.text
    assert "cut the torn or corrupt tail" in text, text
    if others == "live":
        assert (f"died holding its lock (dead writer processes, the holder among them: "
                f"{child.proc.pid}); {len(frame)} bytes") in text, text
    log = check_log(qdir, calls_of([holder]), None, complete=False)
    assert [p for _, p in log if parse_payload(p)[0] == 1] == [
        shared_payload(1, i) for i in range(21)]
    assert [o for o, p in log if parse_payload(p)[0] == 0] == mine_offs


def test_writer_killed_in_an_msync(tmp_path: Path) -> None:
    """A child holds the msync lock (as in the middle of an msync) and is SIGKILLed there.
    A ``"sync"`` enqueue of this process waits for that msync meanwhile (it must not return
    before its frame is msynced), then, the holder dead, takes the lock over (EOWNERDEAD),
    msyncs and returns; the queue goes on."""
    qdir = tmp_path / "q"
    with ExitStack() as stack:
        mine = stack.enter_context(k7core.Queue(qdir, writers="shared", fsync="sync"))
        first = mine.enqueue(shared_payload(0, 0))
        child = stack.enter_context(Child("holdsync", str(qdir), "1", program=PROGRAM))
        lines = [child.line()]
        assert child.line() == b"held", child.stderr()
        got: list[int] = []
        done = threading.Event()

        def append() -> None:
            got.append(mine.enqueue(shared_payload(0, 1)))
            done.set()

        t = threading.Thread(target=append)
        t.start()
        try:
            assert not done.wait(0.5), "a sync enqueue returned while its msync was held"
            child.proc.send_signal(signal.SIGKILL)
            assert child.wait() == -signal.SIGKILL
            assert done.wait(DEADLINE), "the sync enqueue never returned after the kill"
        finally:
            t.join(DEADLINE)
        with k7core.Queue(qdir, readonly=True) as ro:
            assert ro.end > got[0], "the enqueue returned but its frame is not visible"
        got += mine.enqueue_many([shared_payload(0, 2), shared_payload(0, 3)])
        mine.sync()
    calls = {0: [(0, [first]), (1, got[:1]), (2, got[1:])],
             1: Writer(1, child, lines).calls()}
    log = check_log(qdir, calls, None, complete=True)
    assert len(log) == 5


# --------------------------------------------------------------------------------------
# (4) interleavings of several shared writers in one process, against a model
# --------------------------------------------------------------------------------------

HANDLES = 3
_op = st.one_of(
    st.tuples(st.just("enqueue"), st.integers(0, HANDLES - 1), st.integers(0, 1500)),
    st.tuples(st.just("many"), st.integers(0, HANDLES - 1),
              st.lists(st.integers(0, 900), min_size=1, max_size=6)),
    st.tuples(st.just("close"), st.integers(0, HANDLES - 1), st.just(0)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=60))
def test_interleaved_shared_writers_in_one_process_match_a_model(
    ops: list[tuple[str, int, object]]
) -> None:
    """``HANDLES`` queues opened with ``writers="shared"`` on one directory in this process
    take turns at ``enqueue`` / ``enqueue_many`` (sizes up to a third of a segment: rolls by
    any of them) and ``close`` (a closed one reopens on its next turn; when all are closed,
    the next to open is the first writer again and recovers at open). Each returned offset
    is the model's, a reader that stays open sees the model's log, and so does the closed
    queue."""
    with tempfile.TemporaryDirectory() as tmp:
        qdir = Path(tmp) / "q"
        model: list[bytes] = []
        end = 0
        handles: list[k7core.Queue | None] = [None] * HANDLES
        k7core.Queue(qdir, fsync="flush", segment_size=SEG).close()
        with ExitStack() as stack:
            ro = stack.enter_context(k7core.Queue(qdir, readonly=True))
            for op, h, arg in ops:
                q = handles[h]
                if op == "close":
                    if q is not None:
                        q.close()
                        handles[h] = None
                    continue
                if q is None:
                    q = handles[h] = stack.enter_context(
                        k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=SEG))
                sizes = [arg] if op == "enqueue" else arg
                assert isinstance(sizes, list)
                msgs = [b"%d.%d:" % (h, len(model) + j) + b"x" * n for j, n in enumerate(sizes)]
                want = []
                for m in msgs:
                    want.append(end)
                    end += frame_size(len(m))
                got = [q.enqueue(msgs[0])] if op == "enqueue" else q.enqueue_many(msgs)
                assert got == want, (op, h, sizes)
                model += msgs
                assert ro.end == end
            assert [p for _, p in read_records(ro, 0)] == model
        with k7core.Queue(qdir, readonly=True) as q:
            assert read_records(q, 0) == [(o, p) for o, p in zip(
                itertools.accumulate((frame_size(len(m)) for m in model), initial=0), model,
                strict=False)]
