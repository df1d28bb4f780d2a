"""What an outbox relay needs of the job store, on real directories: marks journaled with the
puts, remembered keys, and stores written before either existed.

The crash test kills a relay-like child (``_relaychild.py``) with SIGKILL, again and again on
one directory: after each reopen the mark is the position of the last put that survived,
and every position up to it has exactly one job.
"""

from __future__ import annotations

import random
import shutil
import signal
import struct
from pathlib import Path

import pytest

import k7core
from k7core.jobs import InvalidJobError, JobStore
from k7core.jobs._files import JOURNAL, snapshot_name
from k7core.jobs._store import JOURNAL_SEGMENT
from tests._childproc import Child
from tests.k7core.jobs import _relaychild as relay
from tests.k7core.jobs._storehelp import churn, everything, journal_end

DATA = Path(__file__).parent / "data"
V1_CLOCK = 1_700_000_000.0


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store"


def reopened(path: Path) -> JobStore:
    return JobStore(path, snapshot_bytes=1 << 40)  # explicit snapshots only


# ---------------------------------------------------------------------- marks


def test_marks_advance_per_name_and_survive_a_reopen(path: Path) -> None:
    with reopened(path) as store:
        assert store.mark("relay") is None
        store.put(b"a", mark=("relay", 1))
        store.put(b"b", mark=("relay", 5))
        store.put(b"c", mark=("relay", 5))  # the same position again: a row of two jobs
        store.put(b"d", mark=("other", 2**64 - 1))
        store.put(b"e")  # a put without a mark leaves them
        assert (store.mark("relay"), store.mark("other"), store.mark("none")) == (
            5, 2**64 - 1, None)
    with reopened(path) as store:
        assert (store.mark("relay"), store.mark("other"), len(store)) == (5, 2**64 - 1, 5)


def test_a_smaller_mark_is_refused_and_stores_nothing(path: Path) -> None:
    with reopened(path) as store:
        first = store.put(b"a", key="k", mark=("relay", 7))
        end = journal_end(path)
        with pytest.raises(InvalidJobError, match="behind"):
            store.put(b"new", mark=("relay", 6))
        with pytest.raises(InvalidJobError, match="behind"):
            store.put(b"dup", key="k", mark=("relay", 0))  # its key taken: the same check
        assert (journal_end(path), len(store), store.mark("relay")) == (end, 1, 7)
        assert store.peek(first) is not None
    with reopened(path) as store:
        assert (len(store), store.mark("relay")) == (1, 7)


def test_a_put_that_finds_its_key_taken_still_moves_the_mark(path: Path) -> None:
    with reopened(path) as store:
        live = store.put(b"a", key="k", mark=("relay", 1))
        gone = store.put(b"b", key="r", remember=True, mark=("relay", 2))
        store.delete(gone)
        end = journal_end(path)
        assert store.put(b"again", key="k", mark=("relay", 3)) == live
        assert store.put(b"again", key="r", mark=("relay", 4)) == gone
        assert journal_end(path) > end, "the marks were journaled"
        end = journal_end(path)
        assert store.put(b"again", key="k", mark=("relay", 4)) == live
        assert journal_end(path) == end, "a mark that does not move writes nothing"
        assert (len(store), store.mark("relay")) == (1, 4)
    with reopened(path) as store:
        assert (len(store), store.mark("relay")) == (1, 4)


def test_marks_survive_snapshots_and_journal_trimming(path: Path) -> None:
    with reopened(path) as store:
        store.put(b"a", mark=("relay", 10))
        store.put(b"b", key="k", mark=("other", 3))
        store.put(b"c", key="k", mark=("other", 4))  # a MARK record
        marked = journal_end(path)
        store.snapshot()
    with reopened(path) as store:
        assert (store.mark("relay"), store.mark("other")) == (10, 4)
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()  # keeps the journal from the one before: past the marks' records
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        assert q.earliest() >= marked, "the journal with the marks was trimmed"
    with reopened(path) as store:
        assert (store.mark("relay"), store.mark("other"), len(store)) == (10, 4, 2)


# ---------------------------------------------------------------------- remembered keys


def test_a_remembered_key_outlives_its_job(path: Path) -> None:
    with reopened(path) as store:
        job = store.put(b"a", tube="t", key="k", remember=True)
        assert store.put(b"b", tube="t", key="k") == job  # live: as any keyed job
        assert store.put(b"b", tube="u", key="k") != job  # keys are per tube
        with store.owner() as me:
            assert me.reserve(("t",), timeout=0) is not None
            me.delete(job)
        assert store.peek(job) is None
        end = journal_end(path)
        assert store.put(b"c", tube="t", key="k") == job
        assert store.put(b"c", tube="t", key="k", remember=True) == job
        assert (journal_end(path), store.remembered("t")) == (end, ["k"])
    with reopened(path) as store:
        assert store.put(b"d", tube="t", key="k") == job
        store.snapshot()
    with reopened(path) as store:
        assert (store.put(b"e", tube="t", key="k"), store.remembered("t")) == (job, ["k"])
        assert store.tubes() == ["u"], "a tube with remembered keys only has no jobs"


def test_find_gives_the_live_job_of_a_key_only(path: Path) -> None:
    with reopened(path) as store:
        job = store.put(b"a", tube="t", key="k", remember=True)
        other = store.put(b"b", tube="u", key="k")
        assert (store.find("t", "k"), store.find("u", "k"), store.find("t", "x")) == (
            job, other, None)
        assert store.find("nowhere", "k") is None
        store.delete(job)
        assert (store.find("t", "k"), store.remembered("t")) == (None, ["k"])
        with pytest.raises(InvalidJobError):
            store.find("-bad", "k")


def test_forget_frees_a_key(path: Path) -> None:
    with reopened(path) as store:
        gone = store.put(b"a", key="gone", remember=True)
        live = store.put(b"b", key="live", remember=True)
        store.put(b"c", key="plain")
        store.delete(gone)
        end = journal_end(path)
        assert store.forget("default", ["plain", "unknown"]) == 0
        assert store.forget("nosuchtube", ["gone"]) == 0
        assert journal_end(path) == end, "forgetting nothing writes nothing"
        assert store.forget("default", ["gone", "live", "gone"]) == 2
        assert store.remembered("default") == []
        assert store.put(b"b again", key="live") == live  # live: its key stays taken
        store.delete(live)
        again = store.put(b"a again", key="gone")
        assert again > live
        assert store.put(b"b once more", key="live") > again
    with reopened(path) as store:
        assert (store.remembered("default"), len(store)) == ([], 3)


def test_remembered_lists_by_prefix_and_survives_trimming(path: Path) -> None:
    keys = [f"order-{i:04d}" for i in range(1200)] + ["invoice-1", "invoice-2"]
    with reopened(path) as store:
        for key in reversed(keys):
            store.delete(store.put(b"x", tube="out", key=key, remember=True))
        assert store.remembered("out", "invoice-") == ["invoice-1", "invoice-2"]
        assert store.remembered("out") == sorted(keys)
        assert store.remembered("other") == []
        # more than one FORGET record (512 keys each)
        assert store.forget("out", keys[:1100]) == 1100
        forgotten = journal_end(path)
        store.snapshot()
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        assert q.earliest() >= forgotten, "the journal with the keys was trimmed"
    with reopened(path) as store:
        assert store.remembered("out") == sorted(keys[1100:])
        assert store.remembered("out", "order-11") == keys[1100:1200]


def test_a_forget_after_the_snapshot_replays(path: Path) -> None:
    with reopened(path) as store:
        for key in ("a", "b", "c"):
            store.delete(store.put(b"x", key=key, remember=True))
        store.snapshot()
        store.forget("default", ["b"])
    with reopened(path) as store:
        assert store.remembered("default") == ["a", "c"]


# ---------------------------------------------------------------------- older stores


def fill_v1(store: JobStore) -> int:
    """The calls that wrote ``data/``: k7core at 16f4c34 ran them on a store opened with
    ``snapshot_bytes=1 << 40, clock=lambda: V1_CLOCK``, then its snapshot file and its
    journal's records (u64 offset, u32 length, the record, each) were saved. Returns the
    offset the snapshot covers."""
    ids = [store.put(b"job %d" % i, tube="ab"[i % 2], priority=i % 5) for i in range(20)]
    store.put(b"keyed", tube="a", key="k-\u00e9")
    store.put(b"waits", tube="b", depends_on=[ids[1], ("a", "k-\u00e9")])
    store.put(b"later", tube="b", delay=3600)
    with store.owner() as me:
        job = me.reserve(("a",), timeout=0)
        assert job is not None
        me.bury(job.id, error="boom")
        job = me.reserve(("a",), timeout=0)
        assert job is not None
        me.release(job.id, delay=60, error="again")
    store.delete(ids[3])
    covered = store.snapshot()
    store.put(b"after", tube="c", key="k2")
    store.kick("a", 1)
    store.delete(ids[5])
    return covered


def records(path: Path) -> list[tuple[int, bytes]]:
    """A journal's records as (offset, record)."""
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        batch = q.read_columnar(0)
        assert batch.next == q.end
        return [(batch.offsets[i], bytes(batch.payload(i))) for i in range(len(batch))]


def saved_records() -> list[tuple[int, bytes]]:
    raw = (DATA / "journal-v1.records").read_bytes()
    out = []
    pos = 0
    while pos < len(raw):
        offset, n = struct.unpack_from("<QI", raw, pos)
        out.append((offset, raw[pos + 12:pos + 12 + n]))
        pos += 12 + n
    return out


def test_a_store_written_before_marks_opens_as_it_was(tmp_path: Path) -> None:
    """The saved store (a version-1 snapshot and the journal after it) opens with the
    state the same calls make now; this code journals those calls byte for byte as it did;
    the store then takes marks and remembered keys and writes a version-2 snapshot."""
    old = saved_records()
    fresh = tmp_path / "fresh"
    with JobStore(fresh, snapshot_bytes=1 << 40, clock=lambda: V1_CLOCK) as store:
        covered = fill_v1(store)
    assert records(fresh) == old, "the journal records of these calls changed"
    (snapshot,) = DATA.glob("snapshot-*.k7jobs")
    assert snapshot.name == snapshot_name(covered)
    assert snapshot.read_bytes()[8:12] == struct.pack("<I", 1)
    path = tmp_path / "old"
    path.mkdir()
    with k7core.Queue(path / JOURNAL, fsync="flush", segment_size=JOURNAL_SEGMENT) as q:
        for offset, record in old:
            assert q.enqueue(record) == offset
    shutil.copyfile(snapshot, path / snapshot.name)
    ids = [offset + 1 for offset, _ in old]
    with JobStore(fresh, clock=lambda: V1_CLOCK) as store:
        want = everything(store, ids)
    assert want["len"] == 22 and len(want["per-tube"]) == 3
    with JobStore(path, snapshot_bytes=1 << 40, clock=lambda: V1_CLOCK) as store:
        assert store.skipped_snapshots == []
        assert everything(store, ids) == want
        assert (store.mark("relay"), store.remembered("a")) == (None, [])
        assert store.put(b"dup", tube="c", key="k2", mark=("relay", 1)) in ids
        new = store.put(b"new", tube="c", key="k3", remember=True)
        store.delete(new)
        store.snapshot()
    with JobStore(path, clock=lambda: V1_CLOCK) as store:
        assert everything(store, ids) == want
        assert (store.mark("relay"), store.remembered("c")) == (1, ["k3"])
        assert store.put(b"again", tube="c", key="k3") == new


# ---------------------------------------------------------------------- crashes


def check_after_kill(store: JobStore, returned: dict[int, int]) -> int:
    """The reopened store of the relay child: the mark is the last position that survived,
    every position up to it has its one job (a duplicate row, its row's), none past it.
    Returns the mark."""
    mark = store.mark(relay.MARK)
    assert mark is not None
    by_position: dict[int, int] = {}
    for job in store._machine.jobs():
        position = int(job.body.split()[1])
        assert position not in by_position, f"two jobs for row {position}"
        by_position[position] = job.id
        assert job.key == relay.key(position)
    assert max(by_position) in (mark, mark - 1) and (
        max(by_position) == mark or relay.is_duplicate(mark)), (mark, max(by_position))
    for position in range(1, mark + 1):
        if relay.is_duplicate(position):
            assert position not in by_position
            assert store.put(b"", tube=relay.TUBE, key=relay.key(position)) == by_position[
                position - 1], "a duplicate row put a job"
        else:
            assert position in by_position, f"row {position} (mark {mark}) has no job"
    for position, job_id in returned.items():
        assert position <= mark, f"the put of row {position} returned but is lost"
        want = by_position[position - 1 if relay.is_duplicate(position) else position]
        assert job_id == want, (position, job_id, want)
    remembered = store.remembered(relay.TUBE)
    assert remembered == sorted(f"row-{p}" for p in by_position if relay.remembers(p))
    return mark


@pytest.mark.parametrize("fsync", ["flush", "sync"])
def test_a_killed_relay_resumes_after_its_mark(tmp_path: Path, fsync: str) -> None:
    path = tmp_path / "store"
    rng = random.Random(f"relay-{fsync}")
    returned: dict[int, int] = {}
    mark = 0
    for _ in range(6):
        with Child(path.as_posix(), fsync, str(16 << 10),
                   program="tests.k7core.jobs._relaychild") as child:
            assert child.line() == b"ready %d" % (mark + 1)
            lines = [child.line() for _ in range(rng.randint(1, 3000))]
            lines += child.kill_and_drain()
            assert child.proc.returncode == -signal.SIGKILL, child.stderr()
        for line in lines:
            kind, position, job_id = line.split()
            assert kind == b"P"
            returned[int(position)] = int(job_id)
        with JobStore(path, fsync=fsync) as store:
            assert store.skipped_snapshots == []
            mark = check_after_kill(store, returned)
    assert len(returned) > 50
