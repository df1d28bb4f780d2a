"""Files, locks and memory maps. Everything here owns an OS resource and closes it once."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import threading
from pathlib import Path
from typing import Any

from ._errors import StorageError
from ._format import FRAME_ALIGN, FRAME_MAGIC, segment_base, segment_name
from ._kernel import ffi, lib


class Mapping:
    """A shared memory map of a whole file plus a C pointer into it.

    Payload memoryviews handed to users are slices of ``view``. ``close()`` unmaps only when
    no such view is still alive; otherwise the map is left to the garbage collector, which
    unmaps it when the last view is released. A view therefore never dangles.
    """

    __slots__ = ("_bus", "_cbuf", "mm", "ptr", "size", "view")

    def __init__(self, fd: int, size: int, *, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.mm: mmap.mmap | None = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        self.size = size
        self._cbuf: Any = ffi.from_buffer(self.mm, require_writable=writable)
        self.ptr: Any = ffi.cast("uint8_t *", self._cbuf)
        self.view: memoryview | None = memoryview(self.mm) if not writable else None
        # guarded against SIGBUS while open (see k7_bus.c); views kept after close are not
        self._bus = int(lib.k7_bus_register(self.ptr, size))

    def prefetch(self) -> None:
        """Ask the kernel to bring the file's pages into the page cache now (asynchronous
        readahead; zero-filled for preallocated space), so that writing into a fresh
        segment does not take a page-cache miss per 4 KiB page on the hot path."""
        if self.mm is not None and hasattr(mmap, "MADV_WILLNEED"):
            with contextlib.suppress(OSError):
                self.mm.madvise(mmap.MADV_WILLNEED)

    def __del__(self) -> None:
        if self._bus >= 0:  # dropped without close(): the map goes with it
            lib.k7_bus_unregister(self._bus)

    def close(self) -> None:
        if self.mm is None:
            return
        lib.k7_bus_unregister(self._bus)
        self._bus = -1
        ffi.release(self._cbuf)
        self.ptr = ffi.NULL
        view, self.view = self.view, None
        mm, self.mm = self.mm, None
        if view is not None:
            try:
                view.release()
            except BufferError:
                return  # slices of it are still held by users: the GC unmaps later
        with contextlib.suppress(BufferError):
            mm.close()


FILE_MODE = 0o600
"""Permissions of the files a queue creates (before the umask): owner read and write."""


def open_fd(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """Open a file of a queue directory; never through a symbolic link (``O_NOFOLLOW``)."""
    try:
        return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(
                f"cannot open {path}: it is a symbolic link", errno_=exc.errno, path=path,
                hint="k7core does not follow links inside a queue directory; replace the "
                "link with the file itself",
            ) from exc
        hint = None
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            hint = (
                "a writer needs to create and write files in the queue directory; a "
                "readonly Queue only reads segments, but each of its consumer groups "
                "creates and writes its cursor file (see docs/security.md)"
            )
        raise StorageError(
            f"cannot open {path}: {exc.strerror}", errno_=exc.errno or 0, path=path,
            hint=hint,
        ) from exc


def try_lock(fd: int, *, exclusive: bool = True) -> bool:
    """Take a non-blocking flock; False when another open file holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_is_free(path: Path) -> bool:
    """True when nobody holds an exclusive flock on ``path`` (tested without keeping it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(
            f"cannot open directory {path}: {exc.strerror}", errno_=exc.errno or 0, path=path
        ) from exc
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
    directory: Path, base: int, size: int, *, durable: bool, mode: int = FILE_MODE
) -> Path:
    """Create (or re-create an empty, short one left by a crash) and preallocate a segment."""
    path = directory / segment_name(base)
    fd = open_fd(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        preallocate(fd, size, path)
        if durable:
            fsync_file(fd, path)
    except BaseException:
        os.close(fd)
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
            if self._durable:
                fsync_dir(dest.parent)
        except OSError:
            m.close()
            self.discard()
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
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(
                f"cannot map {path}: not a regular file", errno_=errno.EINVAL, path=path,
                hint="only k7core's own files may carry its file names in a queue directory",
            )
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


def valid_end(m: Mapping, limit: int) -> int:
    """Where the valid (CRC-checked) frames of the mapped segment ``m`` from position 0
    stop, by ``limit``: at the first that is not valid or does not end by ``limit``."""
    count, status = ffi.new("int64_t *"), ffi.new("int32_t *")
    return int(lib.k7_scan_end(m.ptr, min(limit, m.size), count, status))


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
    mm = m.mm
    assert mm is not None
    pos = start + -start % FRAME_ALIGN
    while pos < limit:
        pos = mm.find(FRAME_MAGIC, pos, limit)
        if pos < 0:
            break
        if pos % FRAME_ALIGN == 0 and _frame_end(m, pos, limit) >= 0:
            return pos
        pos += FRAME_ALIGN - pos % FRAME_ALIGN
    return limit


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
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
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
