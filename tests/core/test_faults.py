"""Faults injected through the library's seam (``k7core._faults``): msync failing with EIO,
a full disk at segment and cursor preallocation; and damage done to the files of a queue
directory by hand: cursors pointing outside the log or inside a frame, a missing segment,
foreign files, files deleted, shrunk or replaced under an open queue, permissions. Errors
reach the caller, clear and typed; nothing reported durable is lost; no wrong payload is
delivered; the queue stays readable and takes writes again once the fault is gone."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import k7core
from k7core._faults import inject
from tests._queuehelp import read_dir


def test_eio_from_msync_reaches_a_sync_writer_and_loses_nothing_reported(
    tmp_path: Path,
) -> None:
    qdir = tmp_path / "q"
    q = k7core.Queue(qdir, fsync="sync", segment_size=4096)
    with q.consumer_group("g", cursor_fsync="flush") as g:
        q.enqueue(b"durable")
        with inject("msync", errno.EIO):
            with pytest.raises(k7core.StorageError) as info:
                q.enqueue(b"not durable")
            assert info.value.errno == errno.EIO
            with pytest.raises(k7core.StorageError):
                q.enqueue_many([b"a", b"b"])
        msgs = g.poll(max_batch=10, timeout=0)  # readers saw only the durable one
        assert [bytes(m.payload) for m in msgs] == [b"durable"]
        # the failed frames were rolled back; once the disk works, writes are durable again
        q.enqueue(b"after")
        assert [bytes(m.payload) for m in g.poll(max_batch=10, timeout=0)] == [b"after"]
    q.close()
    assert read_dir(qdir) == [b"durable", b"after"]


def test_eio_from_msync_reaches_an_async_writer(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    q = k7core.Queue(qdir, fsync="async", segment_size=4096)
    q.enqueue(b"one")
    q.sync()
    with inject("msync", errno.EIO):
        q.enqueue(b"two")  # appended; the flusher's msync fails
        with pytest.raises(k7core.StorageError):
            q.sync()
    with pytest.raises(k7core.StorageError):  # sticky: reported to the next write too
        q.enqueue(b"three")
    # and to close(): pages whose writeback failed may be lost even if a later msync works
    with pytest.raises(k7core.StorageError, match="final msync"):
        q.close()
    assert q.closed
    assert read_dir(qdir)[0] == b"one" and b"three" not in read_dir(qdir)


def test_eio_from_a_sync_cursor_reaches_ack(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=4096) as q:
        q.enqueue_many([b"a", b"b"])
        g = q.consumer_group("g", cursor_fsync="sync")
        first, second = g.poll(max_batch=2, timeout=0)
        assert g.ack(first)
        with inject("msync", errno.EIO), pytest.raises(k7core.StorageError, match="cursor"):
            g.ack(second)
        g.close()  # the final cursor msync works again
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("g") as g:
        assert g.committed in (second.offset, q.end)  # never ahead of what was acked


def test_full_disk_at_preallocation(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with inject("preallocate", errno.ENOSPC), pytest.raises(k7core.StorageError) as info:
        k7core.Queue(qdir, fsync="flush", segment_size=4096)
    assert info.value.errno == errno.ENOSPC and "free disk space" in str(info.value)
    with k7core.Queue(qdir, fsync="flush", segment_size=4096) as q:
        offs = q.enqueue_many([b"x" * 1000] * 3)  # fills most of the first segment
        g = q.consumer_group("g")
        with inject("preallocate", errno.ENOSPC):
            with pytest.raises(k7core.StorageError, match="preallocate"):
                q.enqueue_many([b"y" * 1000] * 3)  # needs a new segment
            with g:  # still readable
                got = [bytes(m.payload) for m in g.poll(max_batch=10, timeout=0)]
        # what fitted before the roll was written (the batch is not atomic across segments)
        assert got[:3] == [b"x" * 1000] * 3 and set(got[3:]) <= {b"y" * 1000}
        more = q.enqueue_many([b"z" * 1000] * 3)  # space is back: writes go on
        assert more[0] > offs[-1]
    assert read_dir(qdir) == got + [b"z" * 1000] * 3


def test_full_disk_at_cursor_creation(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=4096, retention="consumed") as q:
        q.enqueue_many([b"a", b"b"])
        with q.consumer_group("old") as old:
            old.ack_many(old.poll(max_batch=10, timeout=0))
        with inject("preallocate", errno.ENOSPC), pytest.raises(k7core.StorageError) as info:
            q.consumer_group("new")
        assert info.value.errno == errno.ENOSPC and "free disk space" in str(info.value)
        assert not (qdir / "cursor-new.k7").exists()  # no empty cursor left behind
        q.enqueue(b"c")  # the queue goes on: writes, existing groups
        with q.consumer_group("old") as old:
            assert [bytes(m.payload) for m in old.poll(max_batch=10, timeout=0)] == [b"c"]
        with q.consumer_group("new") as new:  # space is back
            got = [bytes(m.payload) for m in new.poll(max_batch=10, timeout=0)]
            assert got == [b"a", b"b", b"c"]


def test_eio_from_fsync_when_a_durable_queue_creates_files(tmp_path: Path) -> None:
    """fsync failing on a new segment (at open, at a roll) or a new cursor file: a
    StorageError naming the file, nothing reported durable lost, and the queue goes on once
    the disk works."""
    qdir = tmp_path / "q"
    with inject("fsync", errno.EIO), pytest.raises(k7core.StorageError) as info:
        k7core.Queue(qdir, fsync="sync", segment_size=4096)
    assert info.value.errno == errno.EIO and "seg-00000000000000000000.k7" in str(info.value)
    with k7core.Queue(qdir, fsync="sync", segment_size=4096) as q:
        done = q.enqueue_many([b"x" * 1000] * 4)  # the segment is full
        with inject("fsync", errno.EIO):
            with pytest.raises(k7core.StorageError, match=r"fsync of .*seg-") as info:
                q.enqueue(b"y" * 1000)  # needs a new segment
            assert info.value.errno == errno.EIO
            with pytest.raises(k7core.StorageError, match=r"cursor-g\.k7"):
                q.consumer_group("g", cursor_fsync="sync")
            assert not (qdir / "cursor-g.k7").exists()
        assert q.enqueue(b"y" * 1000) > done[-1]  # the roll works again
        with q.consumer_group("g", cursor_fsync="sync") as g:
            got = [bytes(m.payload) for m in g.poll(max_batch=10, timeout=0)]
    assert got == read_dir(qdir) == [b"x" * 1000] * 4 + [b"y" * 1000]
