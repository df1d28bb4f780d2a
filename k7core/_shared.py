"""Shared writers (``Queue(path, writers="shared")``): who writes a directory, and the state
every writing process maps.

- Each shared writer holds a shared flock on the writer lock (so no exclusive writer opens
  while it lives, and it cannot open while one does) and a shared flock on ``k7py-writers``
  (it is live).
- Joining and leaving happen under an exclusive flock on ``k7py-writers.lock``. The first
  writer to join (nobody holds ``k7py-writers``) recovers the log as an exclusive writer
  would and makes the state (:func:`k7_shared_init`); later ones attach to it. The last one
  to leave is the only one that then finds ``k7py-writers`` free.
- The state itself (the lock of appends and rolls, the lock of msyncs, the end, the writing
  processes) is a ``k7_shared`` of the C kernel, which owns its layout; this module maps it
  and reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import QueueLockedError, StorageError
from ._format import (
    SHARED_FILE,
    SHARED_FILE_SIZE,
    SHARED_LOCK,
    SHARED_PIDS,
    SHARED_SPARE_RE,
    SPARE_SEGMENT,
    WRITER_LOCK,
    Fsync,
    segment_name,
    shared_spare_name,
)
from ._kernel import ffi, lib
from ._options import QueueOptions
from ._recovery import Tail
from ._storage import Mapping, list_segments, lock_is_free, map_file, open_fd, preallocate, try_lock


@dataclass(frozen=True, slots=True)
class SharedState:
    """What the shared state says now (read without its lock: a moment's view)."""

    base: int
    pos: int
    end: int
    synced: int
    recovering: bool
    deaths: int
    syncs: int
    mode: int
    writers: int


def read_state(sh: Any) -> SharedState:
    out = ffi.new("int64_t[9]")
    lib.k7_shared_state(sh, out)
    return SharedState(int(out[0]), int(out[1]), int(out[2]), int(out[3]), bool(out[4]),
                       int(out[5]), int(out[6]), int(out[7]), int(out[8]))


def read_pids(sh: Any) -> list[int]:
    out = ffi.new(f"int32_t[{SHARED_PIDS}]")
    n = int(lib.k7_shared_pids(sh, out, SHARED_PIDS))
    return [int(out[i]) for i in range(n)]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a writer that died without leaving does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedWriters:
    """This process's membership in the shared writers of ``path``: the flocks and the map
    of the state. :meth:`join` under the join lock; :meth:`leave` (idempotent) at close."""

    def __init__(self, path: Path, options: QueueOptions) -> None:
        self.path = path
        self._opts = options
        self._fd = -1
        self._map: Mapping | None = None
        self.sh: Any = ffi.NULL
        self.first = False

    @contextlib.contextmanager
    def joining(self) -> Any:
        """The join lock, held for the block (a few milliseconds: a first writer's
        recovery at most)."""
        fd = open_fd(self.path / SHARED_LOCK, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def enter(self) -> bool:
        """Under the join lock: take the live flock on the state file; True when this is the
        first writer (the caller recovers the log, then calls :meth:`init`)."""
        path = self.path / SHARED_FILE
        fd = self._fd = open_fd(path, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
        if os.fstat(fd).st_size < SHARED_FILE_SIZE:
            preallocate(fd, SHARED_FILE_SIZE, path)
        self.first = try_lock(fd)
        if not self.first:
            fcntl.flock(fd, fcntl.LOCK_SH)  # the others hold it shared: granted at once
        self._map = Mapping(fd, SHARED_FILE_SIZE, writable=True)
        if self.first:
            self._remove_spares()
            return True
        sh = lib.k7_shared_attach(self._map.ptr, SHARED_FILE_SIZE)
        if sh == ffi.NULL:
            raise StorageError(
                f"{path} is not a valid shared-writer state while shared writers hold it",
                path=path, hint="close every writer of the queue, then open it again",
            )
        self.sh = sh
        mode = read_state(sh).mode
        if mode != self._opts.fsync.code:
            theirs = next((f.value for f in Fsync if f.code == mode), mode)
            raise QueueLockedError(
                f"queue {self.path} is written by shared writers with fsync="
                f"{theirs!r}, not {self._opts.fsync.value!r}",
                path=self.path, hint="every shared writer of a queue uses the same fsync strategy",
            )
        return False

    def init(self, base: int, pos: int) -> None:
        """The first writer, after recovery: make the state (the log ends at base + pos)."""
        assert self._map is not None and self.first
        rc = lib.k7_shared_init(self._map.ptr, SHARED_FILE_SIZE, base, pos,
                                self._opts.fsync.code)
        if rc:
            raise StorageError(f"cannot make the shared-writer state: {os.strerror(rc)}",
                               errno_=rc, path=self.path / SHARED_FILE)
        fcntl.flock(self._fd, fcntl.LOCK_SH)  # under the join lock: nobody slips in
        self.sh = lib.k7_shared_attach(self._map.ptr, SHARED_FILE_SIZE)

    def tail(self) -> Tail:
        """A later writer: where the log ends now (mapped), to start from. A roll meanwhile
        is followed at the first append."""
        for _ in range(8):
            state = read_state(self.sh)
            seg = self.path / segment_name(state.base)
            m = map_file(seg, writable=True)
            if m is not None:
                return Tail(m, state.base, min(state.pos, m.size), list_segments(self.path))
        raise StorageError(f"the segment the shared writers of {self.path} write is missing",
                           path=self.path, hint="another program changed the queue directory")

    def state(self) -> SharedState:
        return read_state(self.sh)

    def _remove_spares(self) -> None:
        """The first writer: spares that writers before it left (none of them lives)."""
        for name in os.listdir(self.path):
            if name == SPARE_SEGMENT or SHARED_SPARE_RE.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / name)

    def remove_dead(self, w: Any) -> list[int]:
        """Under the shared lock: forget the writing processes that no longer exist (and
        their spares); return their pids."""
        dead = [pid for pid in read_pids(self.sh) if not alive(pid)]
        for pid in dead:
            lib.k7_shared_swap_pid(w, pid, 0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / shared_spare_name(pid))
        return dead

    def last(self) -> bool:
        """Under the join lock, at close: whether no other shared writer lives."""
        fd = self._fd
        if fd < 0:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return try_lock(fd)

    def leave(self) -> None:
        """Unmap the state and drop the live flock (closing the file). Idempotent."""
        if self._map is not None:
            self._map.close()
            self._map = None
        self.sh = ffi.NULL
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def writer_live(path: Path) -> bool:
    """Whether any writer holds the queue in ``path``: an exclusive one (its flock on the
    writer lock) or shared ones (theirs on the state file, probed under the join lock, so
    that the probe can never make a joining writer take itself for the first)."""
    return not lock_is_free(path / WRITER_LOCK) or shared_live(path)


def shared_live(path: Path) -> bool:
    """Whether shared writers hold the queue in ``path``."""
    try:
        lock = open_fd(path / SHARED_LOCK, os.O_RDONLY)
    except StorageError:
        return False  # no shared writer ever opened the queue
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            fd = open_fd(path / SHARED_FILE, os.O_RDONLY)
        except StorageError:
            return False
        try:
            if try_lock(fd):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            return True
        finally:
            os.close(fd)
    finally:
        os.close(lock)


def _live_state(path: Path) -> tuple[tuple[int, ...], Fsync] | None:
    """The live shared writers of ``path`` and their fsync strategy, read from the state
    file without taking its lock; None when no shared writer holds the queue."""
    if not shared_live(path):
        return None
    try:
        fd = open_fd(path / SHARED_FILE, os.O_RDONLY)
    except StorageError:
        return None
    try:
        m = Mapping(fd, SHARED_FILE_SIZE, writable=False)
    finally:
        os.close(fd)
    try:
        sh = lib.k7_shared_attach(m.ptr, SHARED_FILE_SIZE)
        if sh == ffi.NULL:
            return None
        mode = read_state(sh).mode
        fsync = next((f for f in Fsync if f.code == mode), None)
        if fsync is None:
            return None
        return tuple(sorted({p for p in read_pids(sh) if alive(p)})), fsync
    finally:
        m.close()


def shared_pids(path: Path) -> tuple[int, ...]:
    """The live processes that write the queue in ``path`` with writers="shared" (empty when
    none does)."""
    live = _live_state(path)
    return () if live is None else live[0]


def shared_fsync(path: Path) -> Fsync | None:
    """The fsync strategy of the shared writers that hold the queue in ``path`` (None when
    none does): a process joining them must open with it."""
    live = _live_state(path)
    return None if live is None else live[1]
