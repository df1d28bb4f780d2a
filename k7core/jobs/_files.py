"""The files of a job store's directory (its layout: ``_store``): the journal's directory,
the snapshots (their names, listing, writing, the temporaries a crash left), and the
directory itself."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .._errors import StorageError
from .._format import WRITER_LOCK, queue_file
from .._storage import flock_holder, write_file_atomic
from ._codec import dump_snapshot
from ._errors import NotAJobStoreError
from ._machine import JobMachine

JOURNAL = "journal"
"""The journal's directory inside the store's directory."""
_SNAPSHOT = re.compile(r"snapshot-(\d{20})\.k7jobs")
_SNAPSHOT_TMP = re.compile(r"snapshot-\d{20}\.k7jobs\.tmp")  # write_file_atomic's


def remove_dead_temporaries(path: Path) -> None:
    """Delete the temporary files of snapshots that a crash cut short (call it holding the
    journal's writer lock: no snapshot of the store is being written)."""
    with os.scandir(path) as entries:
        for entry in entries:
            if _SNAPSHOT_TMP.fullmatch(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def snapshot_name(offset: int) -> str:
    """The file name of the snapshot that covers the journal below ``offset``."""
    return f"snapshot-{offset:020d}.k7jobs"


def list_snapshots(path: Path) -> list[tuple[int, Path]]:
    """The store's snapshots, newest first, as (journal offset covered, file)."""
    found = []
    with os.scandir(path) as entries:
        for entry in entries:
            m = _SNAPSHOT.fullmatch(entry.name)
            if m is not None:
                found.append((int(m.group(1)), Path(entry.path)))
    return sorted(found, reverse=True)


def make_store_dir(path: Path) -> None:
    """Create the store's directory ``path`` if missing; NotAJobStoreError for a file or a
    k7 queue's directory, StorageError (with a hint) when the system refuses."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        names = [] if (path / JOURNAL).is_dir() else os.listdir(path)
    except (FileExistsError, NotADirectoryError) as exc:
        raise NotAJobStoreError(
            f"{path} cannot be a job store's directory: {exc.filename} is a file", path=path,
            hint="give the path of a directory (created if missing)") from exc
    except OSError as exc:
        raise StorageError(
            f"cannot create or read the job store's directory {path}: {exc.strerror}",
            errno_=exc.errno or 0, path=path,
            hint="check the permissions of the directory and of its parents, or give "
                 "another path") from exc
    if any(queue_file(name) for name in names):
        raise NotAJobStoreError(
            f"{path} is a k7 queue's directory, not a job store's", path=path,
            hint="a job store keeps its journal queue in DIR/journal/: give it a directory "
                 "of its own")


def save_snapshot(path: Path, machine: JobMachine, covered: int) -> int:
    """Write the snapshot of ``machine`` as of journal offset ``covered`` into the store's
    directory ``path`` (a temporary file, fsynced, renamed); return its size."""
    size = 0

    def counted() -> Iterator[bytes]:
        nonlocal size
        for chunk in dump_snapshot(machine, covered):
            size += len(chunk)
            yield chunk

    write_file_atomic(path / snapshot_name(covered), counted())
    return size


def journal_holder(path: Path) -> int | None:
    """The pid of the process holding the writer lock of the journal of the store in
    ``path`` (read from ``/proc/locks``: Linux), or None when unknown."""
    return flock_holder(path / JOURNAL / WRITER_LOCK)
