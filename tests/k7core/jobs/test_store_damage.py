"""A damaged journal: what open says, what repair does, and ids that never go back.

The damage is made by hand on real files, as a power loss or a bad disk leaves it: the
journal's tail zeroed below the position a snapshot covers (pages never written back), a
frame in the middle of the active segment with a flipped byte, a torn last frame. A job's
id is the offset of its put's frame + 1, so ``id - 1`` is where its frame starts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
from pathlib import Path

import pytest

import k7core
from k7core._faults import inject
from k7core.jobs import CorruptJobDataError, JobStore, JournalDamagedError
from k7core.jobs._codec import dump_snapshot, load_snapshot
from k7core.jobs._files import JOURNAL, list_snapshots
from tests.k7core.jobs._storehelp import journal_end


def segment_of(path: Path) -> Path:
    """The journal's only segment (these stores stay in their first one)."""
    (seg,) = sorted((path / JOURNAL).glob("seg-*.k7"))
    return seg


def zero_from(path: Path, offset: int) -> None:
    """Zero the journal's bytes from ``offset`` on: pages a power loss never wrote back."""
    seg = segment_of(path)
    with seg.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[offset:] = bytes(len(m) - offset)


def flip(path: Path, offset: int) -> None:
    """Flip a bit of the journal's byte at ``offset`` (a bad sector, a stray write)."""
    seg = segment_of(path)
    with seg.open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[offset] ^= 0x20


def side_files(path: Path) -> list[str]:
    return sorted(p.name for p in (path / JOURNAL).glob("k7py-torn-*"))


def test_a_snapshot_covers_only_a_journal_made_durable(tmp_path: Path) -> None:
    """The snapshot is written only once the journal range it covers is msync'd: if that
    msync fails, no snapshot is written (under "flush", the default, nothing else msyncs
    the journal: a snapshot would outlive the journal's tail after a power loss)."""
    path = tmp_path / "store"
    store = JobStore(path, snapshot_bytes=1 << 40)
    for _ in range(10):
        store.put(b"job")
    with inject("msync", errno.EIO), pytest.raises(k7core.StorageError):
        store.snapshot()
    assert list_snapshots(path) == []
    with contextlib.suppress(k7core.StorageError):  # the queue may report the failed msync
        store.close()
    with JobStore(path, snapshot_bytes=1 << 40) as store:
        assert len(store) == 10
        covered = store.snapshot()  # the msync works again
        assert [o for o, _ in list_snapshots(path)] == [covered]


def _snapshot_then_lose_the_tail(path: Path) -> tuple[list[int], list[int], int]:
    """A store with a snapshot, whose journal then loses its tail from below the
    snapshot's position: (the ids the snapshot holds, the ids put after it, the snapshot's
    position)."""
    with JobStore(path, snapshot_bytes=1 << 40) as store:
        kept = [store.put(b"kept %d" % i) for i in range(20)]
        covered = store.snapshot()
        later = [store.put(b"later %d" % i) for i in range(5)]
    zero_from(path, kept[10] - 1)  # from job kept[10]'s frame on
    return kept, later, covered


def test_a_journal_that_ends_before_its_snapshot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    kept, _, covered = _snapshot_then_lose_the_tail(path)
    with pytest.raises(JournalDamagedError) as info:
        JobStore(path)
    err = info.value
    assert isinstance(err, CorruptJobDataError)
    assert (err.start, err.end) == (kept[10] - 1, covered)
    assert f"ends at offset {kept[10] - 1}" in str(err) and str(covered) in str(err)
    assert err.hint is not None and "repair=True" in err.hint
    with pytest.raises(JournalDamagedError):  # it stays refused: open changed nothing
        JobStore(path)


def test_repair_keeps_the_snapshots_jobs_and_never_reuses_an_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    kept, later, covered = _snapshot_then_lose_the_tail(path)
    with caplog.at_level(logging.WARNING, "k7core"), JobStore(path, repair=True) as store:
        assert [store.peek(i) is not None for i in kept] == [True] * len(kept)
        assert [store.peek(i) for i in later] == [None] * len(later)  # after the snapshot
        assert len(store) == len(kept)
        (event,) = [e for e in store.recovery_events if e.kind == "journal-padded"]
        assert event.offset == kept[10] - 1 and event.offset + event.nbytes >= covered
        new = store.put(b"new")
        assert new > covered
    assert "journal-padded" in caplog.text or "padded" in caplog.text
    with JobStore(path) as store:  # repaired for good: opens without repair=
        assert len(store) == len(kept) + 1 and store.peek(new) is not None
        assert store.put(b"newer") > new


def test_a_damaged_frame_in_the_middle_is_refused_not_cut(tmp_path: Path) -> None:
    """Valid frames after a damaged one are not a torn tail: open refuses, names where, and
    changes nothing (the frames after it are still in the segment)."""
    path = tmp_path / "store"
    with JobStore(path) as store:
        ids = [store.put(b"job %d" % i) for i in range(30)]
    end = journal_end(path)
    flip(path, ids[12] - 1 + 12)  # a byte of job ids[12]'s body: its CRC32C fails
    for _ in range(2):
        with pytest.raises(JournalDamagedError) as info:
            JobStore(path)
        err = info.value
        assert err.start == ids[12] - 1 and err.end == end
        assert f"offset {ids[12] - 1}" in str(err)
        assert side_files(path) == []
    with JobStore(path, repair=True) as store:
        assert [store.peek(i) is not None for i in ids] == [True] * 12 + [False] * 18
        kinds = [e.kind for e in store.recovery_events]
        assert kinds == ["torn-tail-cut", "journal-padded"], kinds
        new = store.put(b"new")
        assert new > ids[-1]
    assert len(side_files(path)) == 1  # the cut frames, kept aside by the queue
    with JobStore(path) as store:
        assert len(store) == 13 and store.put(b"newer") > new


def test_a_torn_last_frame_is_cut_and_its_id_is_not_handed_out_again(tmp_path: Path) -> None:
    """A torn last frame is no damage to report (nothing valid follows it), but its put may
    have been acknowledged (a power loss under "flush"): its id is never given again."""
    path = tmp_path / "store"
    with JobStore(path) as store:
        ids = [store.put(b"job %d" % i) for i in range(5)]
    flip(path, ids[-1] - 1 + 12)
    with JobStore(path) as store:
        assert store.peek(ids[-1]) is None and len(store) == 4
        assert [e.kind for e in store.recovery_events] == ["torn-tail-cut", "journal-padded"]
        assert store.put(b"new") > ids[-1]


def test_a_store_open_elsewhere_is_locked_whatever_its_journal_holds(tmp_path: Path) -> None:
    """The look for damage happens before the journal's lock is taken: while another
    JobStore has the journal (whose frame being written may look damaged for a moment),
    open says the store is locked."""
    path = tmp_path / "store"
    with JobStore(path) as store:
        ids = [store.put(b"job %d" % i) for i in range(10)]
        flip(path, ids[3] - 1 + 12)
        with pytest.raises(k7core.QueueLockedError):
            JobStore(path)
    with pytest.raises(JournalDamagedError):
        JobStore(path)


def test_the_next_id_lies_past_every_id_a_snapshot_holds(tmp_path: Path) -> None:
    """A snapshot that holds a job whose id lies past the journal's end (written so, its
    CRC32C checks out): the next put does not take that id, nor any below it."""
    path = tmp_path / "store"
    with JobStore(path, snapshot_bytes=1 << 40) as store:
        store.put(b"job")
        covered = store.snapshot()
    (_, file), = list_snapshots(path)
    machine = load_snapshot(file.read_bytes())
    plan = machine.check_put("default", b"far", 1, 0, 60, None, (), 0.0)
    assert not isinstance(plan, int)
    far = covered + 10_000
    machine.apply_put(far, plan)
    file.write_bytes(b"".join(dump_snapshot(machine, covered)))
    with JobStore(path) as store:
        assert store.peek(far) is not None
        new = store.put(b"new")
        assert new > far and store.peek(far).body == b"far"  # type: ignore[union-attr]
