"""Where a JobStore cannot be: a file, a directory it may not write, a k7 queue's
directory, a store another process has open, a full disk under a torn journal. Each is a
K7Error with a hint, never a raw OSError, and leaves nothing behind."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core
from k7core.jobs import JobStore, NotAJobStoreError
from k7core.jobs._files import JOURNAL
from tests._queuehelp import run_python
from tests.k7core.test_permissions import unprivileged


def test_a_file_is_no_job_store(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_bytes(b"x")
    for path in (file, file / "store"):
        with pytest.raises(NotAJobStoreError) as info:
            JobStore(path)
        assert str(file) in str(info.value) and info.value.hint
    assert file.read_bytes() == b"x"


def test_a_directory_it_may_not_write(tmp_path: Path) -> None:
    top = Path(tempfile.mkdtemp(prefix="k7-jobs-perm-"))
    try:
        top.chmod(0o755)  # nobody may enter it, not write in it
        for path in (top / "store", top / "a" / "b"):
            with unprivileged(), pytest.raises(k7core.StorageError) as info:
                JobStore(path)
            assert info.value.errno == errno.EACCES and info.value.hint
            assert str(path) in str(info.value)
        assert os.listdir(top) == []
    finally:
        shutil.rmtree(top)


def test_a_queue_directory_is_refused(tmp_path: Path) -> None:
    """A k7 queue's directory is not taken for a job store (which would make journal/ in
    it, next to the queue's segments)."""
    path = tmp_path / "q"
    with k7core.Queue(path) as q:
        q.enqueue(b"message")
    before = sorted(os.listdir(path))
    with pytest.raises(NotAJobStoreError) as info:
        JobStore(path)
    assert "k7 queue" in str(info.value) and info.value.hint
    assert sorted(os.listdir(path)) == before and not (path / JOURNAL).exists()
    with JobStore(tmp_path / "other") as store:  # an empty or new directory is fine
        store.put(b"job")
    (tmp_path / "empty").mkdir()
    JobStore(tmp_path / "empty").close()


_TRY_OPEN = """
import sys
from k7core.jobs import JobStore
try:
    JobStore(sys.argv[1])
except Exception as exc:
    print(type(exc).__name__, "|", exc, "|", exc.hint)
"""


def test_a_store_open_elsewhere_is_locked_with_a_hint_for_stores(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with JobStore(path):
        name, message, hint = run_python(_TRY_OPEN, str(path)).split(" | ")
    assert name == "QueueLockedError"
    assert f"job store {path} is open in another JobStore (process {os.getpid()})" in message
    assert "readonly" not in message + hint, (message, hint)
    assert "k7 jobs" in hint
    with JobStore(path), pytest.raises(k7core.QueueLockedError, match="of this process"):
        JobStore(path)


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    """A mounted tmpfs of 64 MiB (room for a journal segment and its spare), unmounted and
    removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    top = Path(tempfile.mkdtemp(prefix="k7-jobs-full-"))
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(top)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(top)
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    try:
        yield top
    finally:
        subprocess.run(["umount", "-l", str(top)], check=False, capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _fill(top: Path) -> Path:
    """Take every free block of ``top`` with one file; return it."""
    filler = top / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1):  # big writes, then the last partial block
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(size))
    finally:
        os.close(fd)
    return filler


def test_a_torn_journal_on_a_full_disk(tmpfs: Path) -> None:
    """Cutting a torn tail saves its bytes to a side file first: on a full disk that fails
    with a StorageError that says so, leaves no empty side file, and open works again once
    there is room."""
    path = tmpfs / "store"
    with JobStore(path) as store:
        ids = [store.put(b"job %d" % i) for i in range(5)]
    (seg,) = (path / JOURNAL).glob("seg-*.k7")
    with seg.open("r+b") as f:
        f.seek(ids[-1] - 1 + 12)  # a byte of the last job's body: a torn last frame
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x20]))
    filler = _fill(tmpfs)
    for _ in range(2):
        with pytest.raises(k7core.StorageError) as info:
            JobStore(path)
        assert info.value.errno == errno.ENOSPC and info.value.hint, info.value
        assert list((path / JOURNAL).glob("k7py-torn-*")) == []
    filler.unlink()
    with JobStore(path) as store:
        assert len(store) == 4 and store.put(b"new") > ids[-1]
    assert len(list((path / JOURNAL).glob("k7py-torn-*"))) == 1
