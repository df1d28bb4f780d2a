"""What the rest of the library does with shared writers (``writers="shared"``): retention,
remove-when-empty, stats and metrics (which processes write), ``k7 verify``, the SIGBUS guard,
and ``k7async.open_queue``. The protocol itself (ordering, kills, recovery) is
``test_shared_writers.py``'s."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import k7async
import k7core
from k7core.metrics import K7Collector
from tests._childproc import Child
from tests._queuehelp import k7, read_all, read_dir, run_python
from tests.k7core._shared_children import parse_payload

PROGRAM = "tests.k7core._shared_children"
SEGMENT = 8192


def check_order(messages: list[bytes], wids: set[int]) -> None:
    """Each writer's messages that are left come in its order, without a gap."""
    last: dict[int, int] = {}
    for m in messages:
        wid, seq = parse_payload(m)
        assert wid in wids
        if wid in last:
            assert seq == last[wid] + 1, (wid, seq, last[wid])
        last[wid] = seq


@pytest.mark.parametrize("policy", ["bytes", "age", "consumed"])
def test_retention_with_shared_writers(tmp_path: Path, policy: str) -> None:
    """Retention runs at a roll, under the shared lock, with the options of the writer that
    rolled: both writers have the same, so the log stays bounded whoever rolls, segments go
    once, and both writers go on."""
    qdir = tmp_path / "q"
    policies: dict[str, dict[str, object]] = {
        "bytes": {"retention_bytes": 4 * SEGMENT},
        "age": {"retention_age": 1e-3},
        "consumed": {"retention": "consumed"},
    }
    kw = policies[policy]
    opts: dict[str, object] = {"writers": "shared", "fsync": "flush", "segment_size": SEGMENT,
                               **kw}
    with k7core.Queue(qdir, **opts) as a, k7core.Queue(qdir, **opts) as b:  # type: ignore[arg-type]
        g = a.consumer_group("g") if policy == "consumed" else None
        most = 0
        for seq in range(3000):
            a.enqueue(b"w1.%d:" % seq + b"a" * (seq % 150))
            b.enqueue(b"w2.%d:" % seq)
            if g is not None and seq % 100 == 99:
                g.ack_many(g.poll(max_batch=1000, timeout=0))
            most = max(most, len(os.listdir(qdir)))
        stats = [a.stats(), b.stats()]
        if g is not None:
            g.close()
    assert stats[0].earliest_offset > 0, "retention deleted nothing"
    assert stats[0].retention_deleted_segments > 0 and stats[1].retention_deleted_segments > 0
    assert most < 20, f"the directory grew to {most} files"
    res = k7("verify", qdir)
    assert res.returncode == 0, res.stdout + res.stderr
    with k7core.Queue(qdir, readonly=True) as q:
        left = read_all(q, q.earliest())
    check_order(left, {1, 2})
    assert left[-1] == b"w2.2999:"  # the last call (retention by age may leave only it)


def test_remove_when_empty_waits_for_the_last_shared_writer(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    first = k7core.Queue(qdir, writers="shared", fsync="flush", remove_when_empty=True)
    second = k7core.Queue(qdir, writers="shared", fsync="flush", remove_when_empty=True)
    first.enqueue(b"a")
    second.enqueue(b"b")
    with first.consumer_group("g") as g:
        assert g.ack_many(g.poll(max_batch=10, timeout=0)) == 2
    first.close()
    assert qdir.exists(), "a writer that was not the last removed the queue"
    assert sorted(read_dir(qdir)) == [b"a", b"b"]
    second.close()
    assert not qdir.exists()


def test_stats_metrics_and_info_name_the_writing_processes(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush") as here, \
            Child("hold", str(qdir), "flush", str(SEGMENT), "1", "3", program=PROGRAM) as child:
        for _ in range(3):
            assert child.line().startswith(b"O ")
        assert child.line().startswith(b"held ")  # it holds the lock now: stats need none
        pids = (os.getpid(), child.proc.pid)
        assert here.stats().writer_pids == tuple(sorted(pids))
        with k7core.Queue(qdir, readonly=True) as reader:
            st = reader.stats()
            assert st.writer_pids == tuple(sorted(pids))
            assert st.writer_active
        collector = K7Collector(here, registry=None)
        samples = {s.name: s.value for fam in collector.collect() for s in fam.samples}
        assert samples["k7_queue_writer_processes"] == 2
        info = k7("info", qdir)
        assert info.returncode == 0, info.stderr
        shown = b" ".join(info.stdout.split())  # the table may wrap the line
        assert f"pids {', '.join(map(str, sorted(pids)))}".encode() in shown, info.stdout
        child.kill_and_drain()  # killed holding the lock: the next append recovers
        here.enqueue(b"after")
        st = here.stats()
        assert st.writer_pids == (os.getpid(),)
        assert [e.kind for e in st.recovery_events] == ["torn-tail-cut"]
        by_kind = {(s.name, s.labels.get("kind")): s.value
                   for fam in collector.collect() for s in fam.samples}
        assert by_kind[("k7_queue_writer_processes", None)] == 1
        assert by_kind[("k7_queue_recovery_events_total", "torn-tail-cut")] == 1
    with k7core.Queue(qdir, readonly=True) as reader:
        assert reader.stats().writer_pids == ()


def test_segment_truncated_under_a_shared_writer(tmp_path: Path) -> None:
    """The SIGBUS guard covers a shared writer's map: the writer finds out at its next check,
    as an exclusive one does."""
    out = run_python("""
import os, sys
import k7core
from k7core._kernel import lib
qdir = sys.argv[1]
q = k7core.Queue(qdir, writers="shared", segment_size=1 << 16, fsync="flush")
q.enqueue_many([b"x" * 100] * 10)
os.truncate(os.path.join(qdir, "seg-00000000000000000000.k7"), 0)
q.enqueue_many([b"y" * 100] * 100)  # writes into pages the file no longer has
try:
    q.sync()
except k7core.StorageError as exc:
    print("truncated" in str(exc))
try:
    q.close()
except k7core.StorageError:
    print("close-raised")
print(q.closed, lib.k7_bus_faults() > 0)
""", str(tmp_path / "q"))
    assert out.split() == ["True", "close-raised", "True", "True"]


def test_async_open_queue_with_shared_writers(tmp_path: Path) -> None:
    qdir = tmp_path / "q"

    async def main() -> list[int]:
        async with k7async.open_queue(qdir, writers="shared", fsync="sync") as a, \
                k7async.open_queue(qdir, writers="shared", fsync="sync") as b:
            offsets = [await a.enqueue(b"a0"), await b.enqueue(b"b0")]
            offsets += await a.enqueue_many([b"a1", b"a2"])
            return offsets

    offsets = anyio.run(main)
    assert offsets == sorted(offsets) and len(set(offsets)) == 4
    with k7core.Queue(qdir, readonly=True) as q:
        assert read_all(q) == [b"a0", b"b0", b"a1", b"a2"]
    with pytest.raises(ValueError, match="writers"):
        anyio.run(lambda: k7async.open_queue(qdir, writers="many").__aenter__())
