"""A worker on a job store whose disk is full (a small tmpfs or loop-mounted ext4, as in
tests/k7core/test_full_disk.py): a job that ran but whose delete the store cannot journal
stays reserved and is not run again; its delete is retried until space returns.

Mounting needs root; elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from k7core.jobs import JobStore
from k7core.workers import Worker
from tests.k7core.test_full_disk import small_fs  # noqa: F401 (a fixture)
from tests.k7core.workers._fullhelp import (  # noqa: F401 (deletes: a fixture)
    Deletes,
    check_logs,
    deletes,
    fill_to_the_roll,
)


def full_disk_worker(store: JobStore, mnt: Path, fn: Callable[[Any], Any]
                     ) -> tuple[Worker, int, Path]:
    """A worker (not started) running ``fn`` on tube ``q``, a job put there, and the disk
    then full (returned: the file filling it) with the journal at a roll."""
    w = Worker(store, poll=0.05)
    w.consumer("q", fn, ttr=3.0)
    job_id = w.put("q", "mail")
    return w, job_id, fill_to_the_roll(store, mnt)


def test_a_job_whose_delete_the_full_disk_refuses_runs_once(
    small_fs: Path, deletes: Deletes, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    caplog.set_level(logging.INFO, logger="k7core.workers")
    with JobStore(small_fs / "j") as store:
        runs: list[Any] = []
        ran = threading.Event()

        def consume(p: Any) -> None:
            runs.append(p)
            ran.set()

        w, job_id, filler = full_disk_worker(store, small_fs, consume)
        try:
            w.start()
            assert ran.wait(60)
            assert deletes.reached(4), "the worker stopped trying the delete"
            assert runs == ["mail"], "the job ran again while its delete was refused"
            assert not deletes.recorded.is_set()
            job = store.peek(job_id)
            assert job is not None and job.state == "reserved"
        finally:
            filler.unlink()
        assert deletes.recorded.wait(60)
        w.close()
        assert not w.source.exists(job_id)
        assert runs == ["mail"]
    check_logs(caplog)


def test_a_worker_stopping_while_a_delete_is_refused_releases_the_job(
    small_fs: Path, deletes: Deletes, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    with JobStore(small_fs / "j") as store:
        w, job_id, filler = full_disk_worker(store, small_fs, lambda p: None)
        try:
            w.start()
            assert deletes.reached(2)
            w.stop(timeout=60)  # returns once the slot gave up: no wait of 60 s
            job = store.peek(job_id)
            assert job is not None and job.state == "ready"  # released: it runs again
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert any("stops" in r.getMessage() for r in caplog.records)
        finally:
            filler.unlink()
