"""Things in a queue directory that are not what their names say: a FIFO named like a
segment or a cursor, an empty segment file in the middle of the log. Nothing blocks and
nothing stops silently: a StorageError or CorruptFrameError names the file, or the foreign
file is ignored where it cannot be a queue file.

The FIFO cases run in a child process with a deadline: opening a FIFO for reading blocks until
a writer comes, which would hang the suite instead of failing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import run_python, seg_bases, seg_name

SEGMENT = 4096


def _queue(qdir: Path, n: int = 300) -> list[int]:
    with k7core.Queue(qdir, segment_size=SEGMENT, fsync="flush") as q:
        return q.enqueue_many([b"m%04d" % i + b"." * 40 for i in range(n)])


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _child(qdir: Path, code: str) -> str:
    """Run ``code`` (with ``k7core``, ``qdir`` bound) in a child; its stdout, or fail."""
    prog = f"import k7core, pathlib\nqdir = pathlib.Path({str(qdir)!r})\n"
    prog += textwrap.dedent(code)
    try:
        return run_python(prog, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("blocked on the FIFO")


EXPECT_STORAGE = """
try:
    {call}
except k7core.StorageError as exc:
    print("StorageError", exc.path, exc)
"""


def test_fifo_as_the_last_segment(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    _queue(qdir)
    last = qdir / seg_name(seg_bases(qdir)[-1])
    _fifo(last)
    for call in ("k7core.Queue(qdir, readonly=True)",
                 f"k7core.Queue(qdir, segment_size={SEGMENT})"):
        out = _child(qdir, EXPECT_STORAGE.format(call=call))
        assert out.startswith(f"StorageError {last}") and "not a regular file" in out


def test_fifo_as_a_middle_segment(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    offs = _queue(qdir)
    middle = seg_bases(qdir)[2]
    _fifo(qdir / seg_name(middle))
    out = _child(qdir, """
        q = k7core.Queue(qdir, readonly=True)
        g = q.consumer_group("g")
        n = 0
        try:
            while batch := g.poll(max_batch=100, timeout=0):
                n += len(batch)
                g.ack_many(batch)
        except k7core.StorageError as exc:
            print(n, exc.path, exc)
    """)
    before = sum(1 for o in offs if o < middle)
    assert out.startswith(f"{before} {qdir / f'seg-{middle:020d}.k7'}")
    assert "not a regular file" in out


def test_fifo_cursor_file_is_not_a_cursor(tmp_path: Path) -> None:
    """stats(), the writer's retention pass at every roll, and a group of that name."""
    qdir = tmp_path / "q"
    _queue(qdir)
    _fifo(qdir / "cursor-x.k7")
    out = _child(qdir, f"""
        q = k7core.Queue(qdir, segment_size={SEGMENT}, retention="consumed", fsync="flush")
        with q.consumer_group("g") as g:
            while batch := g.poll(max_batch=100, timeout=0):
                g.ack_many(batch)
        q.enqueue_many([b"y" * 1000] * 20)  # rolls, each running retention
        print(sorted(gi.name for gi in q.stats().groups), q.earliest() > 0)
        try:
            q.consumer_group("x")
        except k7core.StorageError as exc:
            print("StorageError", exc.path)
        q.close()
    """)
    assert out.splitlines() == ["['g'] True", f"StorageError {qdir / 'cursor-x.k7'}"]


def test_empty_segment_file_in_the_middle(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    offs = _queue(qdir)
    bases = seg_bases(qdir)
    empty, after = bases[2], bases[3]
    os.truncate(qdir / seg_name(empty), 0)
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("g") as g:
        got: list[int] = []
        for _ in range(2):  # reported again on the next poll, never an empty batch
            with pytest.raises(k7core.CorruptFrameError, match="empty") as info:
                while batch := g.poll(max_batch=100, timeout=0):
                    got += [m.offset for m in batch]
                    g.ack_many(batch)
        assert got == [o for o in offs if o < empty]
        assert info.value.offset == empty and f"seek to {after}" in str(info.value)
        g.seek(after)
        rest = g.poll(max_batch=1000, timeout=0)
        assert [m.offset for m in rest] == [o for o in offs if o >= after]


def test_held_payload_views_hold_no_file_descriptor(tmp_path: Path) -> None:
    """3,000 views held from 3,000 segments under a 200-descriptor limit: each map is made
    without keeping a descriptor (Python's mmap would keep one per map)."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, segment_size=SEGMENT, fsync="flush") as q:
        q.enqueue_many([b"%04d" % i + b"v" * 3990 for i in range(3000)])  # one per segment
    out = _child(qdir, """
        import os, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        held = []
        with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("g") as g:
            while batch := g.poll(max_batch=64, timeout=0):
                held += batch
                g.ack_many(batch)
            print(len(held), len(os.listdir("/proc/self/fd")))
        print(all(bytes(m.payload[:4]) == b"%04d" % i for i, m in enumerate(held)))
    """)
    count, fds, ok = out.split()
    assert (int(count), ok) == (3000, "True") and int(fds) < 30, out


def test_a_failed_map_cleans_up_quietly(tmp_path: Path) -> None:
    from k7core._storage import Mapping

    unraisable: list[object] = []
    old, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        path = tmp_path / "f"
        path.write_bytes(b"x" * 4096)
        fd = os.open(path, os.O_WRONLY)  # cannot be mapped for reading
        try:
            with pytest.raises(OSError):
                Mapping(fd, 4096, writable=False)
        finally:
            os.close(fd)
        import gc

        gc.collect()
    finally:
        sys.unraisablehook = old
    assert unraisable == []
