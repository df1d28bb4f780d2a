"""A queue directory damaged by hand: cursor files holding a value outside the log or inside
a frame, a missing segment in the middle, foreign files. Each is detected and reported with
a typed error that says where and what to do, or ignored when harmless; none makes the
library deliver a wrong payload, and ``seek`` recovers a group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import k7core
from k7core._format import encode_cursor
from tests._queuehelp import drain, message, payloads, seg_name, write_cursor, write_queue

SEGMENT = 256


def _msg(i: int) -> bytes:
    return message(i, 44)


def _fill(qdir: Path, n: int = 30) -> list[int]:
    return write_queue(qdir, [_msg(i) for i in range(n)], segment_size=SEGMENT, fsync="async",
                       batch=True)


def _drain(g: k7core.ConsumerGroup) -> list[bytes]:
    return payloads(drain(g, ack="batch", max_batch=100))


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("where", ["beyond", "negative", "inside"])
def test_cursor_outside_the_log_or_inside_a_frame(
    tmp_path: Path, where: str, readonly: bool
) -> None:
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q, q.consumer_group("g") as g:
        g.seek(offs[5])
        end = q.end
    bad = {"beyond": end + 4096, "negative": -8, "inside": offs[5] + 4}[where]
    write_cursor(qdir, "g", bad)
    with k7core.Queue(qdir, segment_size=SEGMENT, readonly=readonly) as q:
        g = q.consumer_group("g")
        for _ in range(2):  # reported on every poll until a seek, and nothing delivered
            with pytest.raises(k7core.CursorError) as info:
                g.poll(max_batch=10, timeout=0)
        err = info.value
        assert err.offset == bad and err.end == end and err.path == str(qdir / "cursor-g.k7")
        assert f"seek({end})" in str(err)
        if where == "inside":
            assert err.boundary == offs[6] and f"seek({offs[6]})" in str(err)
            assert "inside a frame" in str(err)
            g.seek(err.boundary)
            assert _drain(g) == [_msg(i) for i in range(6, 30)]
        else:
            assert err.boundary is None
            g.seek(q.earliest())
            assert _drain(g) == [_msg(i) for i in range(30)]
        assert g.committed == end
        g.close()
    with k7core.Queue(qdir, segment_size=SEGMENT) as q, q.consumer_group("g") as g:
        assert g.poll(max_batch=10, timeout=0) == []  # the repaired cursor holds


def test_valid_cursors_open_without_error(tmp_path: Path) -> None:
    """Every frame boundary (segment starts, mid-segment, the end) is a valid cursor."""
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q:
        for i, off in enumerate([*offs, q.end]):
            with q.consumer_group("g") as g:
                g.seek(off)
            with q.consumer_group("g") as g:
                got = g.poll(max_batch=1, timeout=0)
                assert [bytes(m.payload) for m in got] == [_msg(i)][: len(got)]
                assert len(got) == (i < len(offs))


def test_missing_segment_in_the_middle(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q:
        bases = [s.base for s in q.stats().segments]
    missing, after = bases[2], bases[3]
    os.unlink(qdir / seg_name(missing))
    for readonly in (False, True):
        with k7core.Queue(qdir, segment_size=SEGMENT, readonly=readonly) as q:
            with q.consumer_group("g") as g:
                got = [bytes(m.payload) for m in g.poll(max_batch=100, timeout=0)]
                assert got == [_msg(i) for i, o in enumerate(offs) if o < missing]
                with pytest.raises(k7core.CorruptFrameError) as info:
                    g.poll(max_batch=100, timeout=0)
                assert info.value.offset == missing
                assert "missing" in str(info.value) and f"seek to {after}" in str(info.value)
                g.seek(after)  # skip the gap: the rest is intact
                rest = [bytes(m.payload) for m in g.poll(max_batch=100, timeout=0)]
                assert rest == [_msg(i) for i, o in enumerate(offs) if o >= after]
                g.seek(0)
            batch = q.read_columnar(bases[1])  # the segment before the gap reads whole
            assert batch.next == missing
            with pytest.raises(k7core.CorruptFrameError, match="missing"):
                q.read_columnar(batch.next)


def test_foreign_files_are_ignored(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    _fill(qdir)
    foreign = ["seg-abc.k7", "seg-0.k7", "seg-00000000000000000001.k7.bak", "cursor-.k7",
               "cursor-x.k7.tmp", "cursor-a/b.k7", ".hidden", "README"]
    for name in foreign:
        if "/" in name:
            (qdir / name.split("/")[0]).mkdir()
        (qdir / name).write_bytes(b"junk")
    (qdir / "cursor-dir.k7").mkdir()  # a directory named like a cursor
    (qdir / "seg-00000000000000099999.k7").mkdir()  # and one named like a segment
    for readonly in (False, True):
        with pytest.raises(k7core.StorageError, match=r"seg-00000000000000099999\.k7"):
            k7core.Queue(qdir, segment_size=SEGMENT, readonly=readonly)
    os.rmdir(qdir / "seg-00000000000000099999.k7")
    with k7core.Queue(qdir, segment_size=SEGMENT, retention="consumed") as q:
        with q.consumer_group("g") as g:
            assert _drain(g) == [_msg(i) for i in range(30)]
        q.enqueue_many([b"x" * 200] * 2)  # rolls: retention deletes what "g" consumed
        assert q.earliest() > 0
        assert {s.name for s in q.stats().groups} == {"g"}
    for name in foreign:
        assert (qdir / name).read_bytes() == b"junk"  # left alone


# ---------------------------------------------------------------- under an open queue


def _seg(qdir: Path, base: int) -> Path:
    return qdir / seg_name(base)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "replaced"])
def test_sealed_segment_damaged_ahead_of_an_open_group(tmp_path: Path, damage: str) -> None:
    """A segment the group has not mapped yet changes underneath it: what is intact is
    delivered, the damage is reported where it starts, nothing wrong is delivered."""
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q, q.consumer_group("g") as g:
        bases = [s.base for s in q.stats().segments]
        first = g.poll(max_batch=1, timeout=0)  # maps segment 0 only
        assert [bytes(m.payload) for m in first] == [_msg(0)]
        hit, after = bases[2], bases[3]
        path = _seg(qdir, hit)
        if damage == "deleted":
            path.unlink()
        elif damage == "truncated":
            os.truncate(path, 64)  # the first frame of it stays whole
        else:
            tmp = path.with_name("new")
            tmp.write_bytes(bytes(range(256)) * (SEGMENT // 256))
            os.replace(tmp, path)
        got = [bytes(m.payload) for m in first]
        with pytest.raises(k7core.CorruptFrameError) as info:
            while batch := g.poll(max_batch=7, timeout=0):
                got += [bytes(m.payload) for m in batch]
        intact = [o for o in offs if o < hit]
        if damage == "truncated":
            intact.append(hit)
        assert got == [_msg(i) for i in range(len(intact))]
        assert info.value.offset == offs[len(intact)] and f"seek to {after}" in str(info.value)
        g.seek(after)
        assert _drain(g) == [_msg(i) for i, o in enumerate(offs) if o >= after]


def test_mapped_segment_deleted_keeps_reading(tmp_path: Path) -> None:
    """Deleting the file of a segment a reader has mapped does not disturb that reader."""
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q, q.consumer_group("g") as g:
        assert [bytes(m.payload) for m in g.poll(max_batch=1, timeout=0)] == [_msg(0)]
        _seg(qdir, 0).unlink()
        got = [bytes(m.payload) for m in g.poll(max_batch=100, timeout=0)]
        assert got[:3] == [_msg(1), _msg(2), _msg(3)]
        assert len(got) >= sum(o < offs[4] for o in offs) - 1


@pytest.mark.parametrize("damage", ["deleted", "replaced"])
def test_active_segment_damaged_under_the_writer(tmp_path: Path, damage: str) -> None:
    """The writer's segment is deleted or replaced: the next sync, roll or close says so,
    later writes are refused, and the frames written are saved to a side file that
    restores them."""
    qdir = tmp_path / "q"
    q = k7core.Queue(qdir, segment_size=4096, fsync="flush")
    q.enqueue_many([b"one", b"two"])
    path = _seg(qdir, 0)
    if damage == "deleted":
        path.unlink()
    else:
        path.with_name("new").write_bytes(bytes(4096))
        os.replace(path.with_name("new"), path)
    q.enqueue(b"three")  # not detected per message (one stat per sync, roll, close)
    with pytest.raises(k7core.StorageError) as info:
        q.sync()
    assert "deleted, replaced or truncated" in str(info.value) and info.value.path == str(path)
    assert "k7py-orphaned-seg-00000000000000000000.k7" in str(info.value)
    with pytest.raises(k7core.StorageError, match="deleted, replaced or truncated"):
        q.enqueue(b"four")  # refused from now on
    with pytest.raises(k7core.StorageError, match="deleted, replaced or truncated"):
        q.close()
    assert q.closed
    os.replace(qdir / "k7py-orphaned-seg-00000000000000000000.k7", path)
    with k7core.Queue(qdir, segment_size=4096) as q:
        batch = q.read_columnar(0)
        assert [bytes(batch.payload(i)) for i in range(len(batch))] == [b"one", b"two", b"three"]


def test_active_segment_deleted_detected_at_roll(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, segment_size=256, fsync="flush") as q:
        q.enqueue(b"x" * 100)
        _seg(qdir, 0).unlink()
        with pytest.raises(k7core.StorageError, match="deleted, replaced or truncated"):
            for _ in range(3):
                q.enqueue(b"y" * 100)  # the third does not fit: a roll
        with pytest.raises(k7core.StorageError):
            q.close()


def test_cursor_deleted_under_an_open_group(tmp_path: Path) -> None:
    """The group goes on; close() writes the cursor file again at the committed offset."""
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q:
        g = q.consumer_group("g", cursor_fsync="sync")
        g.ack_many(g.poll(max_batch=5, timeout=0))
        (qdir / "cursor-g.k7").unlink()
        g.ack_many(g.poll(max_batch=5, timeout=0))
        g.close()
        with q.consumer_group("g") as g:
            assert g.committed == offs[10]
            assert [bytes(m.payload) for m in g.poll(max_batch=1, timeout=0)] == [_msg(10)]


def test_cursor_replaced_under_an_open_group(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    offs = _fill(qdir)
    with k7core.Queue(qdir, segment_size=SEGMENT) as q:
        g = q.consumer_group("g")
        g.ack_many(g.poll(max_batch=5, timeout=0))
        other = qdir / "other"
        other.write_bytes(encode_cursor(offs[2]))
        os.replace(other, qdir / "cursor-g.k7")
        with pytest.raises(k7core.StorageError, match="replaced") as info:
            g.close()
        assert info.value.offset == offs[5] and f"seek({offs[5]})" in str(info.value)
        assert g.closed
        with q.consumer_group("g") as g:  # the file now there decides
            assert g.committed == offs[2]
