"""Permission denied and a read-only queue directory: clear errors at open, never a crash,
and what can still be done (read with ``readonly=True``) works.

The test acts as an unprivileged user: when the suite runs as root, whom permissions do not
stop, it drops its effective uid and gid to ``nobody`` for the block (``os.seteuid``)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import read_all

NOBODY = 65534


@contextmanager
def unprivileged() -> Iterator[None]:
    """Run the block as a user that file permissions apply to."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def qdir() -> Iterator[Path]:
    """A queue of three messages in a directory that ``nobody`` can reach (pytest's tmp_path
    is private to its user), removed afterwards whatever its modes."""
    top = Path(tempfile.mkdtemp(prefix="k7-perm-"))
    top.chmod(0o755)
    path = top / "q"
    with k7core.Queue(path, segment_size=4096, file_mode=0o644) as q:
        q.enqueue_many([b"a", b"b", b"c"])
    try:
        yield path
    finally:
        for p in [path, *path.iterdir()]:
            p.chmod(0o700 if p.is_dir() else 0o600)
        shutil.rmtree(top)


def test_permission_denied(qdir: Path) -> None:
    qdir.chmod(0)
    with unprivileged():
        for readonly in (False, True):
            with pytest.raises(k7core.K7Error) as info:
                k7core.Queue(qdir, readonly=readonly)
            assert isinstance(info.value, k7core.StorageError | k7core.NotAQueueError)
            assert str(qdir) in str(info.value)
        with pytest.raises(k7core.StorageError) as info:
            k7core.Queue(qdir / "new")  # creating a queue inside it
        assert info.value.errno == errno.EACCES


def test_read_only_directory(qdir: Path) -> None:
    with k7core.Queue(qdir) as q, q.consumer_group("g") as g:  # a group exists already
        assert g.poll(max_batch=1, timeout=0)
    for p in qdir.iterdir():
        p.chmod(0o444)
    qdir.chmod(0o555)
    with unprivileged():
        with pytest.raises(k7core.StorageError) as info:
            k7core.Queue(qdir)
        assert info.value.errno == errno.EACCES and "readonly" in str(info.value)
        with k7core.Queue(qdir, readonly=True) as q:
            assert read_all(q, q.earliest()) == [b"a", b"b", b"c"]  # reading needs no write access
            for group in ("g", "new"):  # a group must write its cursor: a clear error
                with pytest.raises(k7core.StorageError) as info:
                    q.consumer_group(group)
                assert info.value.errno == errno.EACCES
                assert f"cursor-{group}.k7" in str(info.value)
            assert q.stats().next_offset == q.end
    assert sorted(p.name for p in qdir.iterdir()) == [
        "cursor-g.k7", "k7py-position", "k7py-writer.lock", "seg-00000000000000000000.k7"
    ]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in qdir.iterdir())
