"""A job store whose next delete needs a journal roll that a full disk refuses, and a count
of the deletes workers try on it (tests/k7core/workers/test_worker_full_disk.py and
tests/k7async/test_async_workers.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from k7core import StorageError
from k7core.jobs import JobOwner, JobStore
from tests.k7core.test_full_disk import _fill_disk

SEGMENT = 1 << 20
"""The journal's segment size in these tests (the store's 16 MiB would not fit a second
segment on the 24 MiB filesystem once the space is freed)."""


def fill_to_the_roll(store: JobStore, mnt: Path) -> Path:
    """Fill the disk, then the journal's segment with puts and deletes of jobs of tube
    ``pad`` until one is refused: the next delete of any job needs a roll the full disk
    refuses. Returns the file that fills the disk."""
    filler = _fill_disk(mnt, 0)
    pads: list[int] = []
    size = SEGMENT // 4
    while size >= 0:  # puts, halving the body at each refusal, until an empty one is refused
        try:
            pads.append(store.put(b"p" * size, tube="pad"))
        except StorageError:
            size = size // 2 if size else -1
    for job_id in pads:  # then deletes (smaller records) until one is refused
        try:
            store.delete(job_id)
        except StorageError:
            return filler
    raise AssertionError("every pad delete was recorded: the segment is not full")


class Deletes:
    """Counts the deletes of reserved jobs tried (``JobOwner.delete``) and the ones that
    were recorded; ``reached(n)`` waits until ``n`` were tried."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tried = 0
        self.recorded = threading.Event()
        self._cond = threading.Condition()
        real: Callable[[JobOwner, int], None] = JobOwner.delete

        def delete(owner: JobOwner, job_id: int) -> None:
            with self._cond:
                self.tried += 1
                self._cond.notify_all()
            real(owner, job_id)
            self.recorded.set()

        monkeypatch.setattr(JobOwner, "delete", delete)

    def reached(self, n: int, timeout: float = 60.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.tried >= n, timeout)


def check_logs(caplog: pytest.LogCaptureFixture) -> None:
    """One WARNING without a traceback when the delete is refused, one INFO when it is
    recorded, nothing else at WARNING or above."""
    mine = [r for r in caplog.records if r.name == "k7core.workers"]
    loud = [r for r in mine if r.levelno >= logging.WARNING]
    assert [r.levelname for r in loud] == ["WARNING"], [r.getMessage() for r in loud]
    assert loud[0].exc_info is None and "delete" in loud[0].getMessage()
    assert any(r.levelno == logging.INFO and "recorded" in r.getMessage() for r in mine)


@pytest.fixture
def deletes(monkeypatch: pytest.MonkeyPatch) -> Deletes:
    """Journal segments of SEGMENT bytes, and the reserved jobs' deletes counted."""
    monkeypatch.setattr("k7core.jobs._store.JOURNAL_SEGMENT", SEGMENT)
    return Deletes(monkeypatch)
