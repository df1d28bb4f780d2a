"""A job store on a full disk (a small loop-mounted ext4 or tmpfs): snapshots, written by
``snapshot()`` and by the snapshot thread, fail with a StorageError that says so, leave no
temporary file, never stop the store, and succeed again once there is room; every job put
is there after a reopen."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

import k7core
from k7core.jobs import JobStore
from tests.k7core.test_full_disk import _fill_disk, small_fs  # noqa: F401 (a fixture)

DEADLINE = 30.0  # the longest wait for the snapshot thread, on a busy machine


def check_enospc(exc: BaseException | None) -> None:
    assert isinstance(exc, k7core.StorageError), repr(exc)
    assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
    assert exc.hint, exc


def wait_for(what: str, done: object) -> None:
    """Poll ``done()`` until it is true, for at most DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def test_snapshots_on_a_full_disk(
    small_fs: Path, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    path = small_fs / "store"
    with JobStore(path, snapshot_bytes=1) as store:  # every put past the last snapshot: one
        ids = [store.put(b"job %d" % i) for i in range(20)]
        wait_for("the first snapshot", lambda: list(path.glob("snapshot-*.k7jobs")))
        # the thread idle (its last snapshot written): filling races no writer of the disk
        wait_for("the snapshot thread to be idle", lambda: not store._snapshot_due)
        filler = _fill_disk(small_fs, 0)
        for i in range(2):
            # (the journal's segment has room) past the last snapshot's size: the thread tries
            ids.append(store.put(b"%d" % i * 8192))
            with pytest.raises(k7core.StorageError) as info:
                store.snapshot()
            check_enospc(info.value)
        wait_for("the snapshot thread's error", lambda: store.snapshot_error is not None)
        check_enospc(store.snapshot_error)
        assert list(path.glob("*.tmp")) == []
        ids.append(store.put(b"still working"))
        filler.unlink()
        ids.append(store.put(b"room again"))  # the snapshot thread tries again, and succeeds
        wait_for("a snapshot with room", lambda: store.snapshot_error is None)
        assert store.snapshot() >= ids[-1]  # (the offset past the last record)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "k7core.jobs"]
    assert len(said) == 2 and "No space left" in said[0][1], said  # once failed, once again
    assert all(r.exc_info is None for r in caplog.records)
    with JobStore(path) as store:
        assert [job_id for job_id in ids if store.peek(job_id) is None] == []
        assert len(store) == len(ids)
