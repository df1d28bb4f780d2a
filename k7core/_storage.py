"""Files, locks and memory maps. Everything here owns an OS resource and closes it once."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ._errors import LockTimeoutError, StorageError
from ._format import FRAME_ALIGN, segment_base, segment_name
from ._kernel import ffi, lib


class Mapping:
    """A shared memory map of a whole file (``ptr``, a C pointer) that holds no file
    descriptor: the kernel maps it directly (Python's ``mmap`` would keep a duplicate fd
    open per map, so held payload views could exhaust the process's descriptors).

    Payload memoryviews handed to users are slices of ``view`` (read-only maps). ``close()``
    drops this object's hold on the map; the map itself is unmapped when the last slice of
    ``view`` is released too, so a view never dangles.
    """

    __slots__ = ("_bus", "_owner", "ptr", "size", "view")

    def __init__(self, fd: int, size: int, *, writable: bool) -> None:
        self._bus = -1
        self._owner: Any = None
        self.ptr: Any = ffi.NULL
        self.view: memoryview | None = None
        self.size = size
        raw = lib.k7_map(fd, size, int(writable))
        if raw == ffi.NULL:
            err = ffi.errno
            raise OSError(err, os.strerror(err))
        # the map lives as long as this owner: held by us until close(), and by the buffer
        # under ``view`` while any slice of it is alive
        self._owner = ffi.gc(raw, lambda p: lib.k7_unmap(p, size))
        self.ptr = raw
        if not writable:
            self.view = memoryview(ffi.buffer(self._owner, size)).toreadonly()
        # guarded against SIGBUS while open (see k7_bus.c); views kept after close are not
        self._bus = int(lib.k7_bus_register(raw, size))

    def prefetch(self) -> None:
        """Ask the kernel to bring the file's pages into the page cache now (asynchronous
        readahead; zero-filled for preallocated space), so that writing into a fresh
        segment does not take a page-cache miss per 4 KiB page on the hot path."""
        if self._owner is not None:
            lib.k7_willneed(self.ptr, self.size)

    def read(self, start: int, end: int) -> bytes:
        """A copy of bytes [start, end) of the map."""
        return bytes(ffi.buffer(self.ptr + start, end - start))

    def zero(self, start: int, end: int) -> None:
        """Write zeros over bytes [start, end) of a writable map."""
        ffi.memmove(self.ptr + start, bytes(end - start), end - start)

    def __del__(self) -> None:
        if self._bus >= 0:  # dropped without close(): the map goes with it
            lib.k7_bus_unregister(self._bus)

    @property
    def closed(self) -> bool:
        return self._owner is None

    def close(self) -> None:
        if self._owner is None:
            return
        lib.k7_bus_unregister(self._bus)
        self._bus = -1
        self.ptr = ffi.NULL
        view, self.view = self.view, None
        if view is not None:
            with contextlib.suppress(BufferError):  # exported further: the GC unmaps later
                view.release()
        self._owner = None  # unmapped now unless slices of ``view`` are still held


FILE_MODE = 0o600
"""Permissions of the files a queue creates (before the umask): owner read and write."""


def open_fd(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """Open a file of a queue directory: the one door every file of k7core goes through.

    Never through a symbolic link (``O_NOFOLLOW``); with ``O_NONBLOCK``, so that a FIFO or a
    device named like a queue file cannot block the open; and only a regular file (a
    directory with ``O_DIRECTORY``): anything else is a StorageError naming it.
    """
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    try:
        kind = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise _open_error(path, exc) from exc
    want_dir = bool(flags & os.O_DIRECTORY)
    if stat.S_ISDIR(kind) if want_dir else stat.S_ISREG(kind):
        return fd
    os.close(fd)
    raise StorageError(
        f"cannot open {path}: it is not a {'directory' if want_dir else 'regular file'}",
        errno_=errno.ENOTDIR if want_dir else errno.EINVAL, path=path,
        hint="only k7core's own files may carry its file names in a queue directory; "
        "move this one away",
    )


def _open_error(path: Path, exc: OSError) -> StorageError:
    if exc.errno == errno.ELOOP:
        return StorageError(
            f"cannot open {path}: it is a symbolic link", errno_=exc.errno, path=path,
            hint="k7core does not follow links inside a queue directory; replace the "
            "link with the file itself",
        )
    hint = None
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = (
            "a writer needs to create and write files in the queue directory; a "
            "readonly Queue only reads segments, but each of its consumer groups "
            "creates and writes its cursor file (see docs/security.md)"
        )
    return StorageError(
        f"cannot open {path}: {exc.strerror}", errno_=exc.errno or 0, path=path, hint=hint,
    )


def read_file(path: Path) -> bytes:
    """The whole content of a (small) file of the queue directory, through :func:`open_fd`."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file_atomic(
    path: Path, data: bytes | Iterable[bytes], mode: int = FILE_MODE
) -> None:
    """Replace ``path`` with ``data`` (bytes, or chunks of bytes written in turn, for content
    too large to hold twice) atomically and durably: a temporary file (created through
    :func:`open_fd`), written and fsynced, renamed over ``path``, directory fsynced. A crash
    leaves the old content or the new one, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # one left by a crash
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(fd, view):]
                except OSError as exc:  # a full disk: say so, as every other path does
                    raise storage_error(exc, tmp, "write") from exc
        fsync_file(fd, tmp)
        os.close(fd)
        fd = -1
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise storage_error(exc, path, "rename a new version over") from exc
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # nothing half-written stays behind
        raise
    fsync_dir(path.parent)


def storage_error(exc: OSError, path: Path, doing: str) -> StorageError:
    """An OSError met ``doing`` something to ``path`` as the StorageError every k7core path
    raises, with a hint for a full disk (a StorageError passes through)."""
    if isinstance(exc, StorageError):
        return exc
    hint = None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "the file system is full: free space, then retry"
    return StorageError(
        f"cannot {doing} {path}: {exc.strerror}", errno_=exc.errno or 0, path=path, hint=hint,
    )


def try_lock(fd: int, *, exclusive: bool = True) -> bool:
    """Take a non-blocking flock; False when another open file holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_within(fd: int, path: Path, timeout: float, what: str) -> None:
    """Take an exclusive flock on ``fd`` (the file ``path``), waiting at most ``timeout``
    seconds: a holder that keeps a lock held for milliseconds longer than that is stopped
    (SIGSTOP) or stuck, and a waiter must not wait for it forever. Past the timeout,
    ``LockTimeoutError`` names the holder."""
    deadline = time.monotonic() + timeout
    sleep = 0.0005
    while not try_lock(fd):
        left = deadline - time.monotonic()
        if left <= 0:
            pid = flock_holder(path)
            who = f"process {pid}" if pid else "another process"
            raise LockTimeoutError(
                f"{what} {path} has been held by {who} for more than {timeout:g} s",
                pid=pid or 0, path=path,
                hint=f"that process is stopped or stuck: resume it (kill -CONT "
                f"{pid or '<pid>'}) or end it; the lock is released when it dies",
            )
        time.sleep(min(sleep, left))
        sleep = min(sleep * 2, 0.01)


def flock_holder(path: Path) -> int | None:
    """The pid of a process holding a ``flock`` on ``path`` now, read from ``/proc/locks``
    (Linux; the pid as this process's namespace sees it), or None when unknown."""
    return next((pid for kind, _, pid in _proc_locks(path) if kind == "FLOCK"), None)


def held_by(path: Path) -> str:
    """Who holds a ``flock`` on ``path``, for an error: ``process <pid>``, ``this process``
    or, when ``/proc/locks`` does not say, ``another process``."""
    pid = flock_holder(path)
    return ("another process" if pid is None else
            "this process" if pid == os.getpid() else f"process {pid}")


def posix_writer(path: Path) -> int | None:
    """The pid of another process holding a POSIX (``fcntl``) write lock on a part of
    ``path`` now (SQLite's locks), read from ``/proc/locks``, or None when unknown."""
    own = os.getpid()
    return next((pid for kind, access, pid in _proc_locks(path)
                 if kind == "POSIX" and access == "WRITE" and pid != own), None)


def _proc_locks(path: Path) -> list[tuple[str, str, int]]:
    """The locks on ``path`` in ``/proc/locks``: (kind, access, pid) each; none when the
    file or ``/proc/locks`` cannot be read."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    for line in lines:
        parts = line.split()  # "1: FLOCK ADVISORY WRITE <pid> <maj:min:inode> 0 EOF"
        if len(parts) >= 6 and parts[5] == inode:
            with contextlib.suppress(ValueError):
                found.append((parts[1], parts[3], int(parts[4])))
    return found


def same_file(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file named ``path`` (neither deleted nor
    replaced): a lock held on a file no longer in the directory guards nothing."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot stat {path}: {exc.strerror}", errno_=exc.errno or 0,
                           path=path) from exc
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def lock_is_free(path: Path) -> bool:
    """True when nobody holds an exclusive flock on ``path`` (tested without keeping it)."""
    try:
        fd = open_fd(path, os.O_RDONLY)
    except StorageError as exc:
        if exc.errno == errno.ENOENT:
            return True
        raise
    try:
        if try_lock(fd, exclusive=False):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        return False
    finally:
        os.close(fd)


FAULTS: dict[str, int] = {}
"""Fault injection seam (tests, through :mod:`k7core._faults`): operation -> errno."""


def fsync_file(fd: int, path: Path) -> None:
    """fsync a file of the queue; a failure is a StorageError naming it, never swallowed."""
    try:
        if FAULTS.get("fsync"):
            raise OSError(FAULTS["fsync"], os.strerror(FAULTS["fsync"]))
        os.fsync(fd)
    except OSError as exc:
        raise StorageError(
            f"fsync of {path} failed: {exc.strerror}", errno_=exc.errno or 0, path=path,
            hint="the file's creation or contents may not be durable; check the disk",
        ) from exc


def fsync_dir(path: Path) -> None:
    """fsync a directory, so that the files created or deleted in it are durable."""
    fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync_file(fd, path)
    finally:
        os.close(fd)


def list_segments(directory: Path) -> list[int]:
    """Sorted base offsets of the segment files in ``directory``."""
    bases = []
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise StorageError(
            f"cannot list queue directory {directory}: {exc.strerror}",
            errno_=exc.errno or 0, path=directory,
            hint="readers and writers need to list the directory (r and x permissions)"
            if exc.errno in (errno.EACCES, errno.EPERM) else None,
        ) from exc
    for name in names:
        base = segment_base(name, directory)
        if base is not None:
            bases.append(base)
    bases.sort()
    return bases


def preallocate(fd: int, size: int, path: Path) -> None:
    """Reserve real blocks so a full disk fails here, not with SIGBUS on a later write."""
    try:
        if FAULTS.get("preallocate"):
            raise OSError(FAULTS["preallocate"], os.strerror(FAULTS["preallocate"]))
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            os.ftruncate(fd, size)  # filesystems without fallocate
            return
        hint = "free disk space and retry; the queue stays readable" if exc.errno in (
            errno.ENOSPC,
            errno.EDQUOT,
        ) else None
        raise StorageError(
            f"cannot preallocate {size} bytes for {path.name}: {exc.strerror}",
            errno_=exc.errno or 0,
            path=path,
            hint=hint,
        ) from exc


def create_segment(
    directory: Path, base: int, size: int, *, durable: bool, mode: int = FILE_MODE,
    replace: bool = False,
) -> Path:
    """Create and preallocate a new segment (``replace``: re-create an empty, short one left
    by a crash). On failure no file is left: a partly created segment would otherwise be
    taken as the last segment of the log by the next open, or fill the disk."""
    path = directory / segment_name(base)
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | (0 if replace else os.O_EXCL), mode)
    try:
        preallocate(fd, size, path)
        if durable:
            fsync_file(fd, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    if durable:
        fsync_dir(directory)
    return path


PREFAULT_CHUNK = 4 << 20


class SpareSegment:
    """The next segment, prepared by a background thread while the current one fills:
    created under a temporary name, preallocated, fsynced (``durable``), mapped and
    prefetched. A roll then only renames it (:meth:`take`), off the hot path of writes.

    A spare left by a crash is an all-zero file that no segment listing matches; the next
    writer replaces it.
    """

    def __init__(
        self, path: Path, size: int, *, durable: bool, prefault: bool, mode: int = FILE_MODE
    ) -> None:
        self.path = path
        self._size = size
        self._mode = mode
        self._durable = durable
        self._prefault = prefault
        self._map: Mapping | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._prepare, name=f"k7-spare-{path.parent.name}", daemon=True
        )
        self._thread.start()

    def _prepare(self) -> None:
        try:
            fd = open_fd(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, self._mode)
            try:
                preallocate(fd, self._size, self.path)
                if self._durable:
                    fsync_file(fd, self.path)
                m = Mapping(fd, self._size, writable=True)
            finally:
                os.close(fd)
            self._map = m
            m.prefetch()
            if self._prefault:
                # Fault every page in now: a writer's first touch of a page of a shared file
                # mapping costs microseconds. In chunks, so that the process's memory-map
                # lock is free in between (other threads map segments too). Older kernels
                # (no MADV_POPULATE_WRITE) keep the readahead hint only.
                for off in range(0, m.size, PREFAULT_CHUNK):
                    if lib.k7_prefault(m.ptr + off, min(PREFAULT_CHUNK, m.size - off)):
                        break
        except BaseException as exc:  # reported by take(): the roll then creates in place
            self._error = exc
            if self._map is None:  # a partly allocated spare must not hold the disk
                with contextlib.suppress(OSError):
                    os.unlink(self.path)

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def take(self, dest: Path) -> Mapping | None:
        """Rename the prepared file to ``dest`` and return its mapping; None if preparing
        it failed (the caller creates the segment itself)."""
        self._join()
        m, self._map = self._map, None
        if m is None:
            self.discard()
            return None
        try:
            os.rename(self.path, dest)
        except OSError:
            m.close()
            self.discard()
            return None
        try:
            if self._durable:
                fsync_dir(dest.parent)
        except OSError:
            m.close()
            with contextlib.suppress(OSError):  # no segment file left that the log lacks
                os.unlink(dest)
            return None
        return m

    def discard(self) -> None:
        """Join the thread, unmap and delete the spare. Idempotent."""
        self._join()
        if self._map is not None:
            self._map.close()
            self._map = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def map_file(path: Path, *, writable: bool) -> Mapping | None:
    """Map a whole file; None when it is empty (a segment left by a crash during a roll)."""
    fd = open_fd(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            return None
        try:
            return Mapping(fd, st.st_size, writable=writable)
        except OSError as exc:
            raise StorageError(
                f"cannot map {path}: {exc.strerror}", errno_=exc.errno or 0, path=path
            ) from exc
    finally:
        os.close(fd)


def frames_end(path: Path) -> int:
    """Where the valid frames of the segment file at ``path`` end (its position), by a scan
    from byte 0; 0 for an empty file. Read-only."""
    m = map_file(path, writable=False)
    if m is None:
        return 0
    try:
        return valid_end(m, m.size)
    finally:
        m.close()


def frame_at(path: Path, local: int) -> bool:
    """True when the segment file at ``path`` holds a valid (CRC-checked) frame at byte
    ``local``; False when it does not, is empty or is too short."""
    m = map_file(path, writable=False)
    if m is None:
        return False
    try:
        return 0 <= local < m.size and _frame_end(m, local, m.size) >= 0
    finally:
        m.close()


def last_data(ptr: Any, path: Path, start: int, size: int) -> int:
    """The end of the last non-zero byte in [start, size) of ``path`` mapped at ``ptr``;
    ``start`` when there is none. Only the file's data regions are read: holes, and the
    all-zero blocks a JVM k7 writes at the end of a sparse segment, cost nothing more."""
    last = start
    for lo, hi in data_regions(path, start, size):
        lo = max(lo, start)
        found = int(lib.k7_last_nonzero(ptr, lo, hi))
        if found > lo:  # k7_last_nonzero returns ``lo`` itself when [lo, hi) is all zeros
            last = max(last, found)
    return last


def valid_end(m: Mapping, limit: int, start: int = 0) -> int:
    """Where the valid (CRC-checked) frames of the mapped segment ``m`` from position
    ``start`` (a frame boundary) stop, by ``limit``: at the first that is not valid or does
    not end by ``limit``."""
    count, status = ffi.new("int64_t *"), ffi.new("int32_t *")
    limit = min(limit, m.size)
    if start >= limit:
        return start
    return start + int(lib.k7_scan_end(m.ptr + start, limit - start, count, status))


def _frame_end(m: Mapping, pos: int, limit: int) -> int:
    """Where the valid frame at ``pos`` of the mapped segment ``m`` ends (by ``limit``);
    -1 when no valid frame starts there."""
    out = ffi.new("int64_t[2]")
    nxt, status = ffi.new("int64_t *"), ffi.new("int32_t *")
    n = lib.k7_scan(m.ptr, m.size, pos, limit, 1, out, out + 1, nxt, status)
    return int(nxt[0]) if n else -1


def next_frame(m: Mapping, start: int, limit: int) -> int:
    """The first 8-aligned position in [start, limit) of the mapped segment ``m`` where a
    valid frame (CRC-checked, ending by ``limit``) starts; ``limit`` when there is none.
    Where reading resumes after damage (``k7 verify`` and the readers' hints)."""
    return int(lib.k7_next_frame(m.ptr, m.size, start, limit))


def frame_start_error(m: Mapping, local: int, limit: int) -> tuple[int, int] | None:
    """None when a reader may start at position ``local`` of the mapped segment ``m``
    (whose frames end by ``limit``): a frame boundary on the chain of frame headers from
    position 0 (one header walk), or, where the valid frames from 0 break off before it
    (damage), the start of a valid frame. Else ``(start, after)``: the start of the valid
    frame that holds ``local`` (-1 after damage) and the next position a reader may start
    at (``limit`` when none is found)."""
    if int(lib.k7_walk(m.ptr, m.size, 0, local)) == local:
        return None
    pos = valid_end(m, local)  # rare (refused, or past damage): a CRC scan up to it
    if pos == local:
        return None
    end = _frame_end(m, pos, limit)
    if end >= 0:  # a valid frame from before ``local`` holds it
        return pos, end
    if local % FRAME_ALIGN == 0 and _frame_end(m, local, limit) >= 0:
        return None  # damage before it, a valid frame at it
    return -1, next_frame(m, local, limit)


def data_regions(path: Path, start: int, size: int) -> list[tuple[int, int]]:
    """Byte ranges of ``path`` in [start, size) that may hold data (SEEK_DATA / SEEK_HOLE).

    Preallocated but never written blocks are holes, so the search for a torn tail does not
    read a whole empty segment. Where the filesystem cannot tell, the whole range is data.
    """
    fd = open_fd(path, os.O_RDONLY)
    regions = []
    try:
        pos = start
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break
                return [(start, size)]
            if data >= size:
                break
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
            regions.append((data, hole))
            pos = hole
    finally:
        os.close(fd)
    return regions
