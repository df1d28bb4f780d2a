"""A process frozen (SIGSTOP) while it owns a queue's writer lock, a consumer group or a
job store: a second owner is refused at once (no wait), with an error naming that process
(read from ``/proc/locks``), from the API and from the ``k7`` commands (one line, no
traceback). Every call is bounded by ``BOUND`` seconds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import k7core
from k7core.jobs import JobStore
from tests._childproc import Child, bounded, stopped
from tests._queuehelp import child_env

PROGRAM = "tests.k7core._frozen_children"
BOUND = 60.0


@contextmanager
def frozen(mode: str, d: Path) -> Iterator[int]:
    """A child owning ``d`` (``mode``: ``own``, a queue and its group ``g``; ``store``, a
    job store), stopped with SIGSTOP for the block; yields its pid."""
    with Child(mode, str(d), "flush", program=PROGRAM) as child:
        assert child.line() == b"held"
        with stopped(child) as pid:
            yield pid


def refused(exc: object, kind: type[k7core.LockedError], pid: int) -> None:
    assert isinstance(exc, kind), exc
    assert f"process {pid}" in str(exc), exc


@pytest.mark.parametrize("writers", ["exclusive", "shared"])
def test_a_second_writer_names_the_frozen_writer(tmp_path: Path, writers: str) -> None:
    qdir = tmp_path / "q"
    with frozen("own", qdir) as pid:
        refused(bounded(lambda: k7core.Queue(qdir, writers=writers), BOUND),
                k7core.QueueLockedError, pid)


def test_a_second_owner_of_a_group_names_the_frozen_owner(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with frozen("own", qdir) as pid, k7core.Queue(qdir, readonly=True) as ro:
        refused(bounded(lambda: ro.consumer_group("g"), BOUND), k7core.GroupBusyError, pid)
        assert bounded(lambda: ro.consumer_group("h").poll(10, 0), BOUND)  # others go on


def k7(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "k7core", *args], capture_output=True,
                          timeout=BOUND, env=child_env(), text=True)


@pytest.mark.parametrize("command", [("produce", "{d}"), ("tail", "{d}", "-g", "g"),
                                     ("group", "{d}", "seek", "g", "0"),
                                     ("group", "{d}", "delete", "g"),
                                     ("jobs", "kick", "{d}", "t", "1"),
                                     ("jobs", "delete", "{d}", "1")])
def test_the_commands_name_the_frozen_owner(tmp_path: Path, command: tuple[str, ...]) -> None:
    d = tmp_path / "d"
    with frozen("store" if command[0] == "jobs" else "own", d) as pid:
        done = k7(*(a.format(d=d) for a in command))
    assert done.returncode == 3, done
    assert "Traceback" not in done.stderr
    assert f"process {pid}" in done.stderr, done.stderr


def test_a_second_job_store_names_the_frozen_owner(tmp_path: Path) -> None:
    d = tmp_path / "store"
    with frozen("store", d) as pid:
        refused(bounded(lambda: JobStore(d), BOUND), k7core.QueueLockedError, pid)
