"""A consumer group's cursor as the source sees it: read without taking the group (where a
query starts), and moved as a streaming query commits (so lag and retention follow it)."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

from .. import GroupBusyError, Queue, StorageError
from .._format import check_group_name, cursor_name, decode_cursor
from .._group import check_cursor
from .._storage import read_file

log = logging.getLogger("k7core.spark")


def committed(path: Path, group: str, end: int) -> int | None:
    """A group's committed cursor as stored on disk, None if the group has no cursor file;
    ``CursorError`` when the group could not read from there in the log that ends at
    ``end`` (as its ``poll`` would say)."""
    cursor = path / cursor_name(check_group_name(group))
    try:
        offset = decode_cursor(read_file(cursor))
    except StorageError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    err = check_cursor(path, group, offset, end)
    if err is not None:
        raise err
    return offset


def move_cursor(path: Path, group: str, offset: int) -> None:
    """Seek ``group`` to ``offset`` (the cursor is advisory: Spark's checkpoint decides where
    a restart resumes). Skipped with a warning if another process owns the group: the next
    move is absolute, so nothing accumulates."""
    try:
        with Queue(path, readonly=True) as q, q.consumer_group(group, cursor_fsync="sync") as cg:
            cg.seek(offset)
    except GroupBusyError:
        log.warning("%s: group %r is busy; its cursor was not moved to %s", path, group, offset)
