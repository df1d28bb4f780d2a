"""Introspection: plain frozen dataclasses returned by ``Queue.stats()`` and
``ConsumerGroup.stats()``, and the directory reads behind them (no lock taken, nothing
written)."""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import InvalidNameError, StorageError
from ._format import (
    CURSOR_SIZE,
    check_group_name,
    cursor_group,
    cursor_name,
    decode_cursor,
    segment_base,
)
from ._storage import lock_is_free, open_fd

#: ``lag_messages`` is counted (a CRC-checked scan of the frames) only when the lag is at
#: most this many bytes; above it, it is ``None``. A scan of 4 MiB takes about a millisecond.
LAG_COUNT_LIMIT = 4 << 20


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment file: its base offset, its file size and the bytes the disk holds for it
    (``st_blocks``; preallocated space counts)."""

    base: int
    size: int
    disk_bytes: int
    mtime: float


@dataclass(frozen=True, slots=True)
class RecoveryEvent:
    """Something recovery did when the writer opened the queue.

    ``kind`` is ``"torn-tail-cut"`` (bytes after the last valid frame of the last segment
    were saved to ``side_file`` and zeroed) or ``"short-segment-reset"`` (a zero-length or
    short last segment left by a crash during a roll was re-created empty). ``offset`` is
    the global offset of the cut, ``nbytes`` how many bytes were removed.
    """

    kind: str
    segment: int
    offset: int
    nbytes: int
    side_file: str | None
    time: float


@dataclass(frozen=True, slots=True)
class SyncLatency:
    """Durations of the writer's msyncs of the log since open (in seconds).

    Timed in the C kernel around each msync (two clock reads); ``p50`` / ``p99`` come from
    power-of-two buckets, so they are upper bounds within a factor of two. ``buckets[k]``
    counts the msyncs that took less than ``2**k`` ns (and at least ``2**(k-1)``).
    """

    count: int
    total_seconds: float
    max_seconds: float
    p50_seconds: float
    p99_seconds: float
    buckets: tuple[int, ...]

    @property
    def mean_seconds(self) -> float:
        return self.total_seconds / self.count if self.count else 0.0

    @classmethod
    def from_writer(cls, w: Any) -> SyncLatency:
        hist = tuple(int(x) for x in w.sync_hist)
        return cls(int(w.nsyncs), int(w.sync_ns) / 1e9, int(w.sync_max_ns) / 1e9,
                   _quantile(hist, 0.5), _quantile(hist, 0.99), hist)


def _quantile(hist: tuple[int, ...], q: float) -> float:
    n = sum(hist)
    if not n:
        return 0.0
    rank, seen = q * n, 0
    for k, c in enumerate(hist):
        seen += c
        if seen >= rank:
            return (1 << k) / 1e9
    return (1 << (len(hist) - 1)) / 1e9


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as its cursor file tells: ``committed`` offset, ``lag_bytes`` from
    there to the visible end, ``lag_messages`` (``None`` when the lag is larger than
    ``LAG_COUNT_LIMIT`` or unreadable), and whether some process owns it now."""

    name: str
    committed: int
    lag_bytes: int
    lag_messages: int | None
    owned: bool


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of a queue (``Queue.stats()``).

    ``earliest_offset``: first offset still in the log (the first segment's base);
    ``next_offset``: the visible end (the offset the next message will get, once visible).
    ``log_syncs`` counts the writer's msyncs of the log since open and ``log_sync`` sums up
    their durations (both ``None`` on a ``readonly`` queue, as are ``fsync`` and
    ``segment_size``, which belong to the writer). ``recovery_events``: what the
    writer's recovery did at open.
    ``retention_deleted_*`` count what retention deleted since open. ``writer_pids``: the
    processes writing with ``writers="shared"`` (empty with an exclusive writer or none).
    """

    path: str
    readonly: bool
    writer_active: bool
    fsync: str | None
    segment_size: int | None
    earliest_offset: int
    next_offset: int
    segment_count: int
    segment_bytes: int
    disk_bytes: int
    segments: tuple[SegmentInfo, ...]
    groups: tuple[GroupInfo, ...]
    log_syncs: int | None
    log_sync: SyncLatency | None
    recovery_events: tuple[RecoveryEvent, ...]
    retention: str
    retention_deleted_segments: int
    retention_deleted_bytes: int
    writer_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupStats:
    """A snapshot of an open consumer group (``ConsumerGroup.stats()``).

    ``lag_bytes``: visible end minus ``committed``; ``unread_bytes``: visible end minus
    ``position`` (what ``poll`` has not delivered yet); ``lag_messages`` as in
    :class:`GroupInfo`. ``data_loss_jumps`` counts the jumps to the earliest offset made
    with ``on_data_loss="earliest"``, ``skipped_bytes`` the log they skipped.
    """

    name: str
    committed: int
    position: int
    in_flight: int
    next_offset: int
    earliest_offset: int
    lag_bytes: int
    unread_bytes: int
    lag_messages: int | None
    cursor_fsync: str
    data_loss_jumps: int
    skipped_bytes: int


def list_segment_infos(directory: Path) -> list[SegmentInfo]:
    """The segment files, oldest first (a file deleted while listing is skipped)."""
    out = []
    for name in os.listdir(directory):
        base = segment_base(name, directory)
        if base is None:
            continue
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(directory / name)
            out.append(SegmentInfo(base, st.st_size, st.st_blocks * 512, st.st_mtime))
    out.sort(key=lambda s: s.base)
    return out


def read_cursors(directory: Path) -> list[tuple[str, int]]:
    """``(group, committed)`` for every ``cursor-*.k7`` file, sorted by name. A file shorter
    than the cursor (being created) reads as 0."""
    out = []
    for name in os.listdir(directory):
        group = cursor_group(name)
        if group is None:
            continue
        try:  # foreign files (bad group name, not a regular file, a link) are not cursors
            check_group_name(group)
            fd = open_fd(directory / name, os.O_RDONLY)
        except InvalidNameError:
            continue
        except StorageError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EINVAL):
                continue
            raise
        try:
            head = os.pread(fd, CURSOR_SIZE, 0)
        finally:
            os.close(fd)
        out.append((group, decode_cursor(head)))
    out.sort()
    return out


class LockTable:
    """Which files some process holds a ``flock`` on, read once from ``/proc/locks`` (Linux):
    asking this way takes no lock, so it can never make a consumer or a writer that opens at
    the same instant fail. Elsewhere it falls back to a non-blocking shared probe."""

    def __init__(self) -> None:
        self._held: set[tuple[int, int, int]] | None = None
        try:
            with open("/proc/locks") as f:
                text = f.read()
        except OSError:
            return
        held = set()
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 6 or parts[1] != "FLOCK":  # "->" lines are blocked waiters
                continue
            try:
                major, minor, ino = parts[5].split(":")
                held.add((int(major, 16), int(minor, 16), int(ino)))
            except ValueError:
                continue
        self._held = held

    def locked(self, path: Path) -> bool:
        if self._held is None:
            return not lock_is_free(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in self._held


def group_owned(directory: Path, group: str, locks: LockTable | None = None) -> bool:
    """True when some consumer (any process, this one included) holds the group's lock."""
    return (locks or LockTable()).locked(directory / cursor_name(group))


def disk_bytes(directory: Path) -> int:
    """Bytes the disk holds for every file of the queue directory (``st_blocks``)."""
    total = 0
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total
