"""What is deleted from a queue, and when: the retention policies, a trim below an offset,
and removing a drained queue's files.

Segments are deleted whole, oldest first, one at a time, each unlink made durable before
the next: a crash in between leaves a shorter log that starts at a segment base, never a
gap. The segment being written is never deleted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from pathlib import Path

from ._format import WRITER_LOCK, cursor_name, queue_file, segment_name
from ._log import LogView
from ._options import QueueOptions
from ._stats import SegmentInfo, list_segment_infos, read_cursors
from ._storage import fsync_dir, list_segments, open_fd, try_lock

log = logging.getLogger("k7core")

class Retention:
    """The writer's deletions of sealed segments, and their counters (for stats)."""

    def __init__(self, log_view: LogView, options: QueueOptions) -> None:
        self._log = log_view
        self._opts = options
        self.deleted_segments = 0
        self.deleted_bytes = 0

    def apply(self, current: int, incoming: int = 0) -> list[int]:
        """Delete the oldest sealed segments the policy allows (``current`` is the base of
        the segment being written; ``incoming`` the bytes of a segment about to be created,
        counted by ``retention_bytes``); return their bases."""
        if not self._opts.trims:
            return []
        opts = self._opts
        segs = list_segment_infos(self._log.path)
        sealed = [sg for sg in segs if sg.base < current]
        ends = [sg.base for sg in segs[1:]]  # sealed[i] ends where the next segment starts
        k = 0
        if opts.retention == "consumed":
            cursors = read_cursors(self._log.path)
            if cursors:
                end = self._log.visible_end()  # a cursor outside the log holds everything back
                low = min(c if 0 <= c <= end else 0 for _, c in cursors)
                while k < len(sealed) and ends[k] <= low:
                    k += 1
        if opts.retention_bytes is not None:
            total = incoming + sum(sg.size for sg in segs)
            j = 0
            while j < len(sealed) and total > opts.retention_bytes:
                total -= sealed[j].size
                j += 1
            k = max(k, j)
        if opts.retention_age is not None:
            cutoff = time.time() - opts.retention_age
            j = 0
            while j < len(sealed) and sealed[j].mtime < cutoff:
                j += 1
            k = max(k, j)
        return self._delete(sealed[:k])

    def delete_before(self, offset: int, current: int) -> list[int]:
        """Delete every sealed segment whose frames all lie below ``offset`` (``current`` is
        the base of the segment being written, never deleted); return their bases."""
        segs = list_segment_infos(self._log.path)
        doomed = [
            sg for sg, nxt in itertools.pairwise(segs)
            if sg.base < current and nxt.base <= offset
        ]
        return self._delete(doomed)

    def _delete(self, segments: list[SegmentInfo]) -> list[int]:
        deleted = []
        path = self._log.path
        for sg in segments:
            try:
                os.unlink(path / segment_name(sg.base))
            except FileNotFoundError:
                pass
            except OSError as exc:  # never fail a write or an open because of retention
                log.warning("k7core: retention could not delete %s: %s",
                            segment_name(sg.base), exc.strerror)
                break
            else:
                self.deleted_segments += 1
                self.deleted_bytes += sg.size
            deleted.append(sg.base)
            if self._opts.durable:
                try:  # the unlink is durable before the next one: no gap after a crash
                    fsync_dir(path)
                except OSError as exc:
                    log.warning("k7core: retention stopped: fsync of %s failed: %s",
                                path, exc.strerror)
                    break
        if deleted:
            self._log.set_segment_bases(
                [b for b in self._log.segment_bases() if b > deleted[-1]]
            )
            log.info("k7core: retention deleted %d segment(s) of %s up to base %d",
                     len(deleted), path, deleted[-1])
        return deleted


def lock_drained(path: Path, end: int) -> list[int] | None:
    """If every group has committed ``end`` (with no group: if the log holds no message),
    lock every cursor file (so no consumer opens one meanwhile) and return the locked
    fds; None, with nothing locked, otherwise or when a consumer owns a group."""
    cursors = read_cursors(path)
    if not cursors:
        bases = list_segments(path)
        return [] if not bases or end == bases[0] else None
    if any(c < end for _, c in cursors):
        return None
    fds: list[int] = []
    try:
        for name, _ in cursors:
            fd = open_fd(path / cursor_name(name), os.O_RDONLY)
            fds.append(fd)
            if not try_lock(fd):
                raise BlockingIOError
        if all(c >= end for _, c in read_cursors(path)):  # unchanged since
            return fds
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    return None


def remove_queue_files(path: Path) -> None:
    """Delete the queue's own files in ``path`` (see ``queue_file``), the writer lock last
    (we still hold it). Other layers' files and directories (Spark's staging area and sink
    records) are left."""
    for entry in os.scandir(path):
        name = entry.name
        if name != WRITER_LOCK and queue_file(name) and not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path / name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path / WRITER_LOCK)
    log.info("k7core: removed the drained queue %s", path)
