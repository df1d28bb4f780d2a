"""Shared writers (``Queue(path, writers="shared")``): who writes a directory, and the state
every writing process maps.

- Each shared writer holds a shared flock on the writer lock (so no exclusive writer opens
  while it lives, and it cannot open while one does), a shared flock on ``k7py-writers``
  (shared writers live), and, as every writer does, its :class:`Presence` in the directory
  (a writer lives, whatever the lock files became).
- A writer's identity is a random 64-bit id, never its pid: pids repeat across PID
  namespaces (two containers sharing a volume both run pid 1). It holds slot ``i`` of the
  state's table by an exclusive byte lock on byte ``SHARED_FILE_SIZE + i`` of
  ``k7py-writers``; the kernel drops it when the writer closes or dies, so a slot whose lock
  is free belongs to a dead writer: whoever finds it (a join, a roll, a recovery) frees it
  and removes that writer's spare segment (``k7py-spare-<id>.seg``).
- Joining and leaving happen under an exclusive flock on ``k7py-writers.lock``. The first
  writer to join (nobody holds ``k7py-writers``) recovers the log as an exclusive writer
  would and makes the state (:func:`k7_shared_init`); later ones attach to it. The last one
  to leave is the only one that then finds ``k7py-writers`` free.
- The state itself (the lock of appends and rolls, the lock of msyncs, the end, the table of
  writers) is a ``k7_shared`` of the C kernel, which owns its layout; this module maps it
  and reads it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import LockFileLostError, QueueLockedError, StorageError
from ._format import (
    SHARED_FILE,
    SHARED_FILE_SIZE,
    SHARED_LOCK,
    SHARED_SPARE_RE,
    SHARED_WRITERS,
    SPARE_SEGMENT,
    WRITER_LOCK,
    Fsync,
    segment_name,
    shared_spare_name,
)
from ._kernel import ffi, lib
from ._options import DEFAULT_LOCK_TIMEOUT, QueueOptions
from ._recovery import Tail
from ._storage import (
    Mapping,
    list_segments,
    lock_is_free,
    lock_within,
    map_file,
    open_fd,
    preallocate,
    same_file,
    try_lock,
)

SLOT_BASE = SHARED_FILE_SIZE  # the writer in slot i locks byte SLOT_BASE + i of k7py-writers
_JOIN_TRIES = 8  # k7py-writers.lock replaced between our open and our flock: open it again


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
    writers: int  # slots in use (dead writers not swept yet included)


@dataclass(frozen=True, slots=True)
class Member:
    """A writer in the state's table: its slot, its id, and (for reports) its pid as it sees
    itself and its PID namespace (0: unknown)."""

    slot: int
    id: int
    pid: int
    pidns: int


def read_state(sh: Any) -> SharedState:
    out = ffi.new("int64_t[9]")
    lib.k7_shared_state(sh, out)
    return SharedState(int(out[0]), int(out[1]), int(out[2]), int(out[3]), bool(out[4]),
                       int(out[5]), int(out[6]), int(out[7]), int(out[8]))


def read_members(sh: Any) -> list[Member]:
    """The slots in use (a moment's view, without the lock)."""
    out = ffi.new(f"k7_member[{SHARED_WRITERS}]")
    lib.k7_shared_members(sh, out)
    return [Member(i, int(m.id), int(m.pid), int(m.pidns))
            for i, m in enumerate(out) if m.id]


def slot_held(fd: int, slot: int) -> bool:
    """Whether a live writer (another open file than ``fd``) holds ``slot``. An error of
    the probe counts as held: a writer is never forgotten on a doubt."""
    return int(lib.k7_range_held(fd, SLOT_BASE + slot)) != 0


class Presence:
    """A writer's presence in its queue directory: every writer, exclusive or shared, holds
    a shared byte lock on the directory itself, which nobody can replace while it holds
    files. A writer that takes the writer lock (or finds ``k7py-writers`` free) and still
    finds another writer present knows that lock file was deleted or replaced under it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)
        self._held = False

    def others(self) -> bool:
        """Whether another writer is present. Looked at again a few times: a writer that
        just died or closed may still be closing its files."""
        for delay in (0.0, 0.001, 0.005, 0.02):
            time.sleep(delay)
            if int(lib.k7_range_held(self._fd, 0)) != 1:
                return False
        return True

    def take(self) -> None:
        rc = int(lib.k7_range_lock(self._fd, 0, 0))
        if rc:
            raise StorageError(f"cannot lock the queue directory {self.path}: "
                               f"{os.strerror(rc)}", errno_=rc, path=self.path)
        self._held = True

    def drop(self) -> None:
        """Leave (before the writer's other locks go, so that whoever finds them free
        finds no presence either). Idempotent."""
        if self._held:
            self._held = False
            lib.k7_range_unlock(self._fd, 0)

    def close(self) -> None:
        """Drop the presence and the directory's descriptor. Idempotent."""
        self._held = False
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def pid_namespace() -> int:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``; 0 when unknown)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def lost_lock(path: Path, what: str) -> LockFileLostError:
    return LockFileLostError(
        f"queue {path}: {what}; two writers could hand out the same offsets, so this one "
        "stops", path=path,
        hint="close every writer of the queue, then open them again (never delete k7py-* "
        "files of an open queue)",
    )


def writer_presence(path: Path, lock_fd: int, *, shared: bool) -> Presence:
    """A writer that holds the writer lock ``lock_fd``: check that it is the directory's,
    and (an exclusive writer) that no other writer is present, which would mean that the
    lock file was deleted or replaced under it; then take the presence (a shared writer
    takes it when it joins)."""
    if not same_file(lock_fd, path / WRITER_LOCK):
        raise lost_lock(path, f"{WRITER_LOCK} was replaced while this writer opened")
    presence = Presence(path)
    try:
        if not shared:
            if presence.others():
                raise lost_lock(path, "another writer holds the queue, but not "
                                f"{WRITER_LOCK}: it was deleted or replaced under it")
            presence.take()
    except BaseException:
        presence.close()
        raise
    return presence


class SharedWriters:
    """This process's membership in the shared writers of ``path``: the flocks, its slot and
    the map of the state. :meth:`join` under the join lock; :meth:`leave` (idempotent) at
    close. ``lock_fd``: the writer lock the queue holds (shared); ``presence``: the
    queue's, taken when this writer joins."""

    def __init__(self, path: Path, options: QueueOptions, lock_fd: int, presence: Presence,
                 ) -> None:
        self.path = path
        self._opts = options
        self._lock_fd = lock_fd
        self._fd = -1
        self._map: Mapping | None = None
        self._presence = presence
        self.sh: Any = ffi.NULL
        self.first = False
        self.id = secrets.randbits(64) or 1
        self.slot = -1
        self.spare_name = shared_spare_name(self.id)

    @contextlib.contextmanager
    def joining(self) -> Any:
        """The join lock, held for the block (a few milliseconds: a first writer's
        recovery at most). A lock file replaced meanwhile is opened again."""
        path = self.path / SHARED_LOCK
        for _ in range(_JOIN_TRIES):
            fd = open_fd(path, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
            try:
                lock_within(fd, path, self._opts.lock_timeout, "the shared writers' join lock")
                if same_file(fd, path):
                    yield
                    return
            finally:
                os.close(fd)
        raise lost_lock(self.path, f"{SHARED_LOCK} keeps being deleted or replaced")

    def enter(self) -> bool:
        """Under the join lock: take the live flock on the state file and a slot; True when
        this is the first writer (the caller recovers the log, then calls :meth:`init`)."""
        path = self.path / SHARED_FILE
        fd = self._fd = open_fd(path, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
        if os.fstat(fd).st_size < SHARED_FILE_SIZE:
            preallocate(fd, SHARED_FILE_SIZE, path)
        self.first = try_lock(fd)
        if not self.first:
            fcntl.flock(fd, fcntl.LOCK_SH)  # the others hold it shared: granted at once
        self.check_files()
        if self.first and self._presence.others():
            raise lost_lock(self.path, f"other writers hold the queue, but not {SHARED_FILE}: "
                            "it was deleted or replaced under them")
        self._claim()
        self._map = Mapping(fd, SHARED_FILE_SIZE, writable=True)
        if self.first:
            self._remove_spares()
            return True
        sh = lib.k7_shared_attach(self._map.ptr, SHARED_FILE_SIZE)
        if sh == ffi.NULL:
            raise StorageError(
                f"{path} is not a shared-writer state of this version of k7core (an older "
                "or newer one made it, or it is damaged), and shared writers hold it",
                path=path, hint="close every writer of the queue, then open them again with "
                "one version: the first to open makes the state anew",
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

    def _claim(self) -> None:
        """Take the first slot whose byte lock is free (its last writer, if any, is dead),
        and the presence."""
        for i in range(SHARED_WRITERS):
            rc = int(lib.k7_range_lock(self._fd, SLOT_BASE + i, 1))
            if rc == 0:
                self.slot = i
                break
            if rc != errno.EAGAIN:
                raise StorageError(f"cannot lock a writer slot of {self.path / SHARED_FILE}: "
                                   f"{os.strerror(rc)}", errno_=rc, path=self.path / SHARED_FILE)
        else:
            raise QueueLockedError(
                f"queue {self.path} has {SHARED_WRITERS} live shared writers already",
                path=self.path, hint="close some of them (at most that many at once)",
            )
        self._presence.take()

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

    def holder_pid(self) -> int | None:
        """The pid (as it sees itself) of the writer that holds the append lock now, None
        when none does or it is not known: for messages only, never for identity."""
        slot = int(lib.k7_shared_holder(self.sh)) if self.sh != ffi.NULL else -1
        return next((m.pid for m in read_members(self.sh) if m.slot == slot), None)

    def check_files(self) -> None:
        """Raise LockFileLostError if ``k7py-writers`` or ``k7py-writer.lock`` is no longer
        the file this writer holds (deleted or replaced): a writer opening now would take
        itself for the first and recover the log under the live ones. Two stats."""
        for fd, name in ((self._fd, SHARED_FILE), (self._lock_fd, WRITER_LOCK)):
            if fd >= 0 and not same_file(fd, self.path / name):
                raise lost_lock(self.path, f"{name} was deleted or replaced while this shared "
                            "writer held it")

    # ------------------------------------------------------------------ the table

    def register(self, w: Any) -> list[int]:
        """Under the shared lock: enter this writer in its slot (freeing what a dead writer
        left there), and forget the other dead writers; return their pids."""
        me = ffi.new("k7_member *", {"id": self.id, "pid": os.getpid(),
                                     "pidns": pid_namespace()})
        old = int(lib.k7_shared_set_member(w, self.slot, me))
        if old and old != self.id:
            self._remove_spare(old)
        return self.sweep(w)

    def unregister(self, w: Any) -> None:
        """Under the shared lock, at close: free this writer's slot."""
        lib.k7_shared_set_member(w, self.slot, ffi.new("k7_member *"))

    def sweep(self, w: Any) -> list[int]:
        """Under the shared lock: free the slots of writers that died (their byte lock is
        free) and remove their spares; return their pids. At every join, roll and
        recovery, so dead writers never fill the table while others live."""
        dead = []
        empty = ffi.new("k7_member *")
        for m in read_members(self.sh):
            if m.slot != self.slot and not slot_held(self._fd, m.slot):
                lib.k7_shared_set_member(w, m.slot, empty)
                self._remove_spare(m.id)
                dead.append(m.pid)
        return dead

    def _remove_spare(self, writer_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / shared_spare_name(writer_id))

    def _remove_spares(self) -> None:
        """The first writer: spares that writers before it left (none of them lives)."""
        for name in os.listdir(self.path):
            if name == SPARE_SEGMENT or SHARED_SPARE_RE.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / name)

    # ------------------------------------------------------------------ leaving

    def last(self) -> bool:
        """Under the join lock, at close: whether no other shared writer lives."""
        fd = self._fd
        if fd < 0:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return try_lock(fd)

    def leave(self) -> None:
        """Unmap the state, drop the presence lock, then the live flock and the slot (closing
        the file): a writer that then finds the state free finds no presence either.
        Idempotent."""
        if self._map is not None:
            self._map.close()
            self._map = None
        self.sh = ffi.NULL
        self._presence.drop()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def writer_live(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> bool:
    """Whether any writer holds the queue in ``path``: an exclusive one (its flock on the
    writer lock) or shared ones (theirs on the state file, probed under the join lock, so
    that the probe can never make a joining writer take itself for the first; waited for
    at most ``timeout`` seconds)."""
    return not lock_is_free(path / WRITER_LOCK) or shared_live(path, timeout)


def shared_live(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> bool:
    """Whether shared writers hold the queue in ``path`` (probed under the join lock, waited
    for at most ``timeout`` seconds)."""
    try:
        lock = open_fd(path / SHARED_LOCK, os.O_RDONLY)
    except StorageError:
        return False  # no shared writer ever opened the queue
    try:
        lock_within(lock, path / SHARED_LOCK, timeout, "the shared writers' join lock")
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
    """The pids of the live shared writers of ``path`` (one per process: a pid appears twice
    for two processes of different PID namespaces) and their fsync strategy, read from the
    state file without taking its lock; None when no shared writer holds the queue."""
    if not shared_live(path):
        return None
    try:
        fd = open_fd(path / SHARED_FILE, os.O_RDONLY)
    except StorageError:
        return None
    try:
        m = Mapping(fd, SHARED_FILE_SIZE, writable=False)
        try:
            sh = lib.k7_shared_attach(m.ptr, SHARED_FILE_SIZE)
            if sh == ffi.NULL:
                return None
            mode = read_state(sh).mode
            fsync = next((f for f in Fsync if f.code == mode), None)
            if fsync is None:
                return None
            live = {(mb.pidns, mb.pid) for mb in read_members(sh) if slot_held(fd, mb.slot)}
            return tuple(sorted(pid for _, pid in live)), fsync
        finally:
            m.close()
    finally:
        os.close(fd)


def shared_pids(path: Path) -> tuple[int, ...]:
    """The live processes that write the queue in ``path`` with writers="shared" (empty when
    none does): their pids, each as its process sees itself."""
    live = _live_state(path)
    return () if live is None else live[0]


def shared_fsync(path: Path) -> Fsync | None:
    """The fsync strategy of the shared writers that hold the queue in ``path`` (None when
    none does): a process joining them must open with it."""
    live = _live_state(path)
    return None if live is None else live[1]
