"""The queue: one writer per directory, recovery on open, publication of the visible end."""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._checks import check_count, check_int, check_seconds, check_timeout
from ._errors import (
    ClosedError,
    K7Error,
    MessageTooLargeError,
    NotAQueueError,
    QueueLockedError,
    ReadOnlyError,
    StorageError,
)
from ._format import (
    DEFAULT_SEGMENT_SIZE,
    FRAME_ALIGN,
    FRAME_HEADER,
    MAX_OFFSET,
    MAX_PAYLOAD,
    MAX_SEGMENT_SIZE,
    OWN_PREFIX,
    POSITION_FILE,
    POSITION_FILE_SIZE,
    SEGMENT_RE,
    SPARE_MIN_SIZE,
    SPARE_SEGMENT,
    WRITER_LOCK,
    Fsync,
    cursor_group,
    cursor_name,
    frame_size,
    orphaned_name,
    parse_fsync,
    segment_name,
    stray_name,
    torn_name,
)
from ._kernel import BADOFFSETS, EIO, NOFIT, TOOLARGE, address, ffi, lib, owned
from ._native._fast import CLOSED, Appender
from ._reader import Reader
from ._resource import Resource
from ._stats import (
    LAG_COUNT_LIMIT,
    GroupInfo,
    LockTable,
    QueueStats,
    RecoveryEvent,
    SyncLatency,
    disk_bytes,
    group_owned,
    list_segment_infos,
    read_cursors,
)
from ._storage import (
    FILE_MODE,
    Mapping,
    SpareSegment,
    create_segment,
    frame_at,
    frames_end,
    fsync_dir,
    fsync_file,
    last_data,
    list_segments,
    lock_is_free,
    map_file,
    open_fd,
    preallocate,
    try_lock,
)

if TYPE_CHECKING:
    from ._group import ConsumerGroup

log = logging.getLogger("k7core")

RETENTION_POLICIES = ("none", "consumed")
WAIT_SLICE = 3600.0  # seconds: the kernel's wait takes int64 nanoseconds

_from_buffer = ffi.from_buffer
_ZERO = array.array("q", [0])


def _lock_with_retry(fd: int) -> bool:
    """Take the writer lock; a readonly opener may hold a shared probe of it for microseconds."""
    for delay in (0.0, 0.001, 0.005, 0.02):
        time.sleep(delay)
        if try_lock(fd):
            return True
    return False


def k7_msync_range(m: Mapping, start: int, end: int) -> int:
    return int(lib.k7_msync(m.ptr, start, end))


def message_list(items: object) -> list[Any]:
    """The messages of ``enqueue_many(items)`` as a list. One bytes-like object or str is
    refused: iterating it would give ints or characters, not messages."""
    what = "enqueue_many needs an iterable of bytes-like messages"
    if isinstance(items, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            f"{what}, not one {type(items).__name__} object: enqueue(data) appends one "
            "message, enqueue_many([data]) a batch of one"
        )
    try:
        it = iter(items)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{what}, not {type(items).__name__}") from None
    return list(it)


class _Flusher:
    """The ``"async"`` background thread: msyncs the log and the async cursors, publishes.

    Its loop is C (``k7_flusher_run``) and never takes the GIL, so it does not slow the
    writer or the readers down. ``lock`` (a C mutex) serialises it with segment rolls.
    """

    def __init__(self, interval: float, name: str) -> None:
        f = lib.k7_flusher_new(int(interval * 1e9))
        if f == ffi.NULL:
            raise MemoryError("cannot allocate the flusher")
        self._f: Any = ffi.gc(f, lib.k7_flusher_free)
        self.bell: Any = lib.k7_flusher_bell(self._f)
        self.lock = _CLock(self._f)
        self._thread: threading.Thread | None = threading.Thread(
            target=lib.k7_flusher_run, args=(self._f,), name=name, daemon=True
        )
        self._thread.start()

    @property
    def error(self) -> int:
        return int(lib.k7_flusher_error(self._f))

    def set_writer(self, w: Any) -> None:
        with self.lock:
            lib.k7_flusher_set_writer(self._f, w)

    def add_cursor(self, c: Any) -> None:
        with self.lock:
            if lib.k7_flusher_add_cursor(self._f, c):
                raise MemoryError("cannot register the cursor with the flusher")

    def remove_cursor(self, c: Any) -> None:
        with self.lock:
            lib.k7_flusher_remove_cursor(self._f, c)

    def stop(self) -> None:
        """Final sync, then join the thread. Idempotent."""
        if self._thread is not None:
            lib.k7_flusher_stop(self._f)
            self._thread.join()
            self._thread = None


class _CLock:
    """Context manager over the flusher's C mutex."""

    __slots__ = ("_f",)

    def __init__(self, f: Any) -> None:
        self._f = f

    def __enter__(self) -> None:
        lib.k7_flusher_lock(self._f)

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        lib.k7_flusher_unlock(self._f)


class _Resources:
    """OS resources of a queue, released exactly once (by close() or by the finalizer)."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.pos_map: Mapping | None = None
        self.seg_map: Mapping | None = None
        self.flusher: _Flusher | None = None
        self.spare: SpareSegment | None = None

    def release(self) -> None:
        if self.flusher is not None:
            self.flusher.stop()
            self.flusher = None
        if self.spare is not None:
            self.spare.discard()
            self.spare = None
        for m in (self.seg_map, self.pos_map):
            if m is not None:
                m.close()
        self.seg_map = self.pos_map = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


class Queue(Resource):
    """A durable append-only log in a directory; creates it or recovers it on open.

    One writer per directory across processes (``QueueLockedError`` otherwise). ``enqueue``
    must be called from one thread at a time. Consumer groups are opened with
    :meth:`consumer_group`. ``readonly=True`` opens a queue that another process writes:
    no writer lock, ``enqueue`` raises, consumer groups work.

    Retention (writer only; applied at open and at every segment roll, never to the segment
    being written; oldest segments first): ``retention="consumed"`` deletes a sealed segment
    once every cursor file of the directory has committed past its end (nothing while the
    directory has no cursor file); ``retention_bytes`` deletes the oldest sealed segments
    while the segment files total more than that; ``retention_age`` (seconds) deletes sealed
    segments last written longer ago than that. The limits apply even to unconsumed data.
    ``remove_when_empty=True`` deletes every file of the queue (and the directory, if then
    empty) on ``close()`` when every group has committed the whole log.

    Files are created with ``file_mode`` (default ``0o600``: the owner only; the umask
    applies on top) and never opened through a symbolic link. To share a queue with a group
    of users, pass ``file_mode=0o660`` and give the directory to that group (see
    docs/security.md).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        fsync: str | Fsync = Fsync.ASYNC,
        commit_interval: float = 50e-6,
        readonly: bool = False,
        retention: str = "none",
        retention_bytes: int | None = None,
        retention_age: float | None = None,
        remove_when_empty: bool = False,
        file_mode: int = FILE_MODE,
    ) -> None:
        self._closed = True
        self._w: Any = None
        self._fa = Appender(0)  # the enqueue fast path; detached (no writer) until recovery
        # read_columnar's readers, kept across calls (mapping a segment costs more than a
        # scan); a call takes one for itself, so calls from several threads never share one
        self._bulk_readers: list[Reader] = []
        self.path = Path(path)
        self.segment_size = check_int(segment_size, "segment_size", 64)
        if self.segment_size % FRAME_ALIGN:
            raise ValueError(
                f"segment_size must be a multiple of {FRAME_ALIGN}, not {segment_size!r}"
            )
        if self.segment_size > MAX_SEGMENT_SIZE:
            raise ValueError(
                f"segment_size must be at most {MAX_SEGMENT_SIZE} (2 GiB - 8), not "
                f"{segment_size}: k7 on the JVM maps a segment as one buffer of at most "
                "2^31-1 bytes, and each segment is preallocated on disk at this size"
            )
        self.fsync = parse_fsync(fsync, "fsync")
        self.commit_interval = check_seconds(commit_interval, "commit_interval", 10)
        self.readonly = bool(readonly)
        if retention not in RETENTION_POLICIES:
            raise ValueError(f"retention must be 'none' or 'consumed', not {retention!r}")
        self.retention = retention
        self.retention_bytes = (
            None if retention_bytes is None else check_int(retention_bytes, "retention_bytes", 0)
        )
        self.retention_age = (
            None if retention_age is None else check_seconds(retention_age, "retention_age")
        )
        self.remove_when_empty = bool(remove_when_empty)
        self.file_mode = check_int(file_mode, "file_mode", 0)
        if self.file_mode > 0o777 or self.file_mode & 0o600 != 0o600:
            raise ValueError(
                f"file_mode must give the owner read and write (0o600 .. 0o777), not {file_mode!r}"
            )
        self._events: list[RecoveryEvent] = []
        self._seg_id: tuple[int, int] | None = None  # (device, inode) of the segment written
        self._seg_lost: StorageError | None = None  # that file was deleted or replaced
        self._deleted_segments = 0
        self._deleted_bytes = 0
        self._groups: weakref.WeakSet[ConsumerGroup] = weakref.WeakSet()
        self._bases: list[int] = []
        self._floor_end = 0
        self._r = _Resources()
        self._finalizer = weakref.finalize(self, self._r.release)
        try:
            self._open()
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    # ------------------------------------------------------------------ open / recover

    def _open(self) -> None:
        try:
            if self.readonly:
                if not self.path.is_dir():
                    raise NotAQueueError(
                        f"{self.path} is not a queue directory", path=self.path,
                        hint="open it once without readonly=True to create it",
                    )
            else:
                if self.path.exists() and not self.path.is_dir():
                    raise NotAQueueError(f"{self.path} is not a directory", path=self.path)
                self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot {'open' if self.readonly else 'create'} queue directory "
                f"{self.path}: {exc.strerror}",
                errno_=exc.errno or 0, path=self.path,
            ) from exc
        if not self.readonly:
            if not self.path.is_dir():
                raise NotAQueueError(f"{self.path} is not a directory", path=self.path)
            fd = open_fd(self.path / WRITER_LOCK, os.O_RDWR | os.O_CREAT, self.file_mode)
            self._r.lock_fd = fd
            if not _lock_with_retry(fd):
                raise QueueLockedError(
                    f"queue {self.path} is locked by another writer", path=self.path,
                    hint="close the other Queue, or open this one with readonly=True",
                )
        self._open_position()
        self._bases = list_segments(self.path)
        if self.readonly:
            if self._bases and lock_is_free(self.path / WRITER_LOCK):
                base = self._bases[-1]
                self._floor_end = base + frames_end(self.path / segment_name(base))
        else:
            self._recover()
            self._apply_retention()

    def _open_position(self) -> None:
        path = self.path / POSITION_FILE
        try:
            fd = open_fd(path, os.O_RDWR | os.O_CREAT, self.file_mode)
        except StorageError:
            if not self.readonly:
                raise
            self._pub: Any = ffi.new("k7_pos *")  # read-only directory: private, polled
            return
        try:
            if os.fstat(fd).st_size < POSITION_FILE_SIZE:
                preallocate(fd, POSITION_FILE_SIZE, path)
            self._r.pos_map = Mapping(fd, POSITION_FILE_SIZE, writable=True)
        finally:
            os.close(fd)
        self._pub = ffi.cast("k7_pos *", self._r.pos_map.ptr)

    def _recover(self) -> None:
        durable = self.fsync is not Fsync.FLUSH
        if not self._bases:
            create_segment(self.path, 0, self.segment_size, durable=durable,
                           mode=self.file_mode)
            self._bases = [0]
        self._drop_stray_segments(durable)
        base = self._bases[-1]
        path = self.path / segment_name(base)
        size = path.stat().st_size
        if size % FRAME_ALIGN:  # cut by hand inside a frame's padding: keep offsets aligned
            os.truncate(path, size + FRAME_ALIGN - size % FRAME_ALIGN)
        m = map_file(path, writable=True)
        count, status = ffi.new("int64_t *"), ffi.new("int32_t *")
        end = 0 if m is None else int(lib.k7_scan_end(m.ptr, m.size, count, status))
        if m is None or (end == 0 and m.size < self.segment_size):
            if m is not None:
                self._cut_tail(m, base, 0)
                m.close()
            self._events.append(RecoveryEvent(
                "short-segment-reset", base, base, size, None, time.time()
            ))
            create_segment(self.path, base, self.segment_size, durable=durable,
                           mode=self.file_mode, replace=True)
            m = map_file(path, writable=True)
            assert m is not None
            end = 0
        else:
            self._cut_tail(m, base, end)
        self._r.seg_map = m
        self._note_segment(base)
        m.prefetch()
        w = ffi.new("k7_writer *")
        w.seg, w.cap, w.base = m.ptr, m.size, base
        w.pos = w.written = w.synced = end
        w.pub = self._pub
        w.mode = self.fsync.code
        w.max_frame = self.segment_size
        self._w = w
        self._fa = Appender(address(w))
        if durable and end and k7_msync_range(m, 0, end):
            raise StorageError(f"msync of {path} failed at open", path=path)
        # Frames recovered after a crash are made durable before readers may see them.
        lib.k7_publish(self._pub, base + end)
        if self.fsync is Fsync.ASYNC:
            fl = self._flusher()
            w.bell = fl.bell
            fl.set_writer(w)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / SPARE_SEGMENT)  # one left by a crash
        self._prepare_spare(prefault=False)

    def _drop_stray_segments(self, durable: bool) -> None:
        """Remove a last segment that holds no frame while its predecessor's frames run to
        or past its base: a roll created it, then failed (a full disk), and the writer went
        on in the predecessor. Taking it as the end of the log would hand out again the
        offsets written after it; its predecessor is where the log goes on."""
        while len(self._bases) >= 2:
            prev, last = self._bases[-2], self._bases[-1]
            path = self.path / segment_name(last)
            if frame_at(path, 0) or not frame_at(self.path / segment_name(prev), last - prev):
                return
            size = os.stat(path, follow_symlinks=False).st_size
            side = self._discard_stray(last)
            if durable:
                fsync_dir(self.path)
            self._bases.pop()
            self._events.append(RecoveryEvent(
                "stray-segment-removed", last, last, size, side, time.time()
            ))
            log.warning(
                "k7core: %s holds no frame and its predecessor's frames run past its base "
                "(a failed roll): removed it%s; the log goes on in %s",
                segment_name(last), f" (kept as {side})" if side else "", segment_name(prev),
            )

    def _discard_stray(self, base: int) -> str | None:
        """Remove the segment file at ``base``, which holds no frame: deleted, or renamed
        to ``k7py-stray-seg-<base>.k7`` (returned) if it holds any non-zero byte."""
        path = self.path / segment_name(base)
        side = None
        m = map_file(path, writable=False)
        if m is not None:
            try:
                if last_data(m.ptr, path, 0, m.size):  # never lose a byte: keep it aside
                    side = stray_name(base)
                    os.rename(path, self.path / side)
            finally:
                m.close()
        if side is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return side

    def _prepare_spare(self, *, prefault: bool = True) -> None:
        """Start preparing the next segment. Pre-faulting dirties its pages (the kernel may
        write those zeros back before the data), so only a writer that has filled a segment
        since it opened, and so will likely fill the next one, gets it."""
        if self.segment_size >= SPARE_MIN_SIZE:
            self._r.spare = SpareSegment(
                self.path / SPARE_SEGMENT, self.segment_size,
                durable=self.fsync is not Fsync.FLUSH, prefault=prefault, mode=self.file_mode,
            )

    def _cut_tail(self, m: Mapping, base: int, end: int) -> None:
        """Save and zero whatever follows the last valid frame, so it can never reappear."""
        last = last_data(m.ptr, self.path / segment_name(base), end, m.size)
        if last <= end:
            return
        side = self.path / torn_name(base, end, time.time_ns())
        side_fd = open_fd(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode)
        with os.fdopen(side_fd, "wb") as f:
            f.write(m.read(end, last))
            f.flush()
            fsync_file(f.fileno(), side)
        m.zero(end, last)
        err = k7_msync_range(m, end, last)
        if err:
            raise StorageError(f"msync of {segment_name(base)} failed: {os.strerror(err)}",
                               errno_=err, path=self.path / segment_name(base))
        self._events.append(RecoveryEvent(
            "torn-tail-cut", base, base + end, last - end, side.name, time.time()
        ))
        log.warning(
            "k7core: cut the torn or corrupt tail of %s at offset %d (position %d): "
            "%d bytes discarded, saved to %s",
            segment_name(base), base + end, end, last - end, side.name,
        )

    def _flusher(self) -> _Flusher:
        fl = self._r.flusher
        if fl is None:
            fl = self._r.flusher = _Flusher(self.commit_interval, f"k7-flusher-{self.path.name}")
        return fl

    # ------------------------------------------------------------------ writing

    def enqueue(self, data: bytes | bytearray | memoryview) -> int:
        """Append one message; return its global offset.

        Durable per the queue's ``fsync`` strategy when this returns (``"sync"``: msync'd).
        """
        off = self._fa.append(data)
        if off >= 0:
            return off
        return self._enqueue_slow(data, off)

    def _enqueue_slow(self, data: Any, rc: int) -> int:
        with owned(self._fa):
            for _ in range(2):
                if rc == CLOSED:
                    self._check_writable()
                elif rc == EIO:
                    self._raise_eio()
                elif rc == TOOLARGE:
                    self._check_size(memoryview(data).nbytes)
                elif rc == NOFIT:
                    self._check_size(memoryview(data).nbytes)
                    self._roll()
                else:
                    return rc
                rc = self._fa.append(data)
            if rc < 0:
                self._raise_eio() if rc == EIO else self._check_size(memoryview(data).nbytes)
            return rc

    def enqueue_many(self, items: Iterable[bytes | bytearray | memoryview]) -> list[int]:
        """Append a batch (one kernel call per segment); return the offsets in order.

        A message too large for a segment fails the whole batch before anything is written.
        """
        if not isinstance(items, (list, tuple)):
            items = message_list(items)
        out = self._fa.append_many(items, 0)
        if type(out) is list and len(out) == len(items):
            return out
        return self._enqueue_many_slow(items, out)

    def _enqueue_many_slow(
        self, items: list[Any] | tuple[Any, ...], out: list[int] | int
    ) -> list[int]:
        with owned(self._fa):
            offsets: list[int] = []
            while True:
                if isinstance(out, list):
                    offsets += out
                    if len(offsets) == len(items):
                        return offsets
                elif out == CLOSED:
                    self._check_writable()
                elif out == EIO:
                    self._raise_eio()
                elif out == TOOLARGE:
                    self._check_size(max(memoryview(x).nbytes for x in items[len(offsets):]))
                elif out in (0, NOFIT):
                    self._check_size(memoryview(items[len(offsets)]).nbytes)
                    self._roll()
                else:
                    raise AssertionError(f"unexpected append_many result {out}")
                out = self._fa.append_many(items, len(offsets))

    def enqueue_columnar(
        self, data: bytes | bytearray | memoryview, offsets: Any
    ) -> array.array[int]:
        """Append ``n`` messages given in the layout of an Arrow binary column.

        ``data`` is one contiguous buffer; ``offsets`` holds ``n + 1`` int32 or int64 byte
        positions into it (message ``i`` is ``data[offsets[i]:offsets[i+1]]``). Returns the
        global offsets as an ``array('q')``: no Python object per message.
        """
        mv = memoryview(offsets)
        if mv.format not in ("i", "l", "q") or mv.ndim != 1:
            raise TypeError("offsets must be a 1-d int32 or int64 array (n + 1 entries)")
        n = len(mv) - 1
        if n < 0:
            raise ValueError("offsets must hold at least one entry")
        return self._append_columnar(data, mv, n)

    def _append_columnar(self, data: Any, offsets: Any, n: int) -> array.array[int]:
        with owned(self._fa):
            out = array.array("q", bytes(8 * n))
            if n == 0:
                self._check_writable()
                return out
            w = self._w
            if w is None:
                self._check_writable()
            dbuf = _from_buffer(data)
            mv = memoryview(offsets)
            wide = mv.itemsize == 8
            obuf = ffi.cast("int64_t *" if wide else "int32_t *", _from_buffer(mv))
            fn = lib.k7_append_columnar if wide else lib.k7_append_columnar32
            optr = ffi.cast("int64_t *", _from_buffer(out))
            done = 0
            while done < n:
                rc = fn(self._w, dbuf, len(dbuf), obuf + done, n - done, optr + done)
                if rc > 0:
                    done += rc
                    continue
                if rc == BADOFFSETS:
                    raise ValueError("offsets must be non-decreasing and within the data buffer")
                if rc == TOOLARGE:
                    self._check_size(max(mv[i + 1] - mv[i] for i in range(done, n)))
                if rc == EIO:
                    self._raise_eio()
                self._check_size(mv[done + 1] - mv[done])
                self._roll()
            return out

    def _check_writable(self) -> None:
        if self._closed:
            raise ClosedError(f"queue {self.path} is closed", path=self.path)
        if self.readonly:
            raise ReadOnlyError(
                f"queue {self.path} was opened with readonly=True", path=self.path,
                hint="open it without readonly=True to write (one writer per directory)",
            )

    def _check_size(self, n: int) -> None:
        if n > MAX_PAYLOAD or frame_size(n) > self.segment_size:
            raise MessageTooLargeError(
                f"a message of {n} bytes does not fit in a segment of {self.segment_size} "
                f"bytes (frame header {FRAME_HEADER} bytes, {FRAME_ALIGN}-byte aligned)",
                path=self.path,
                hint="raise segment_size or split the message",
            )

    def _note_segment(self, base: int) -> None:
        st = os.stat(self.path / segment_name(base), follow_symlinks=False)
        self._seg_id = (st.st_dev, st.st_ino)

    def _check_segment(self) -> None:
        """Raise (and from then on refuse writes) if the file of the segment being written
        was deleted, replaced or shrunk underneath the queue: what was written into it since would
        be gone with the mapping. Its frames are saved to a side file first. One stat: run
        at every roll, ``sync()`` and ``close()``, not per message."""
        if self._seg_lost is not None:
            raise self._seg_lost
        w, m = self._w, self._r.seg_map
        if w is None or m is None or m.closed:
            return
        base, written = int(w.base), int(w.pos)
        path = self.path / segment_name(base)
        try:
            st = os.stat(path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._seg_id and st.st_size >= m.size:
                return
        except FileNotFoundError:
            pass
        w.err = errno.ESTALE  # the kernel refuses every later append
        side = self.path / orphaned_name(base)
        try:  # a segment image: renamed back, it restores the frames
            fd = open_fd(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
            try:
                os.write(fd, m.read(0, written))
                os.ftruncate(fd, m.size)
                fsync_file(fd, side)
            finally:
                os.close(fd)
            hint = (f"they were saved to {side.name}; close the queue, then rename that file "
                    f"to {segment_name(base)} to restore them")
        except OSError as exc:
            hint = f"saving them to {side.name} failed too: {exc}"
        self._seg_lost = StorageError(
            f"segment file {path} was deleted, replaced or truncated while this queue was "
            "writing it: "
            f"the messages from offset {base} to {base + written} are not in the directory",
            errno_=errno.ESTALE, path=path, offset=base, hint=hint,
        )
        log.error("k7core: %s", self._seg_lost)
        raise self._seg_lost

    def _raise_eio(self) -> None:
        if self._seg_lost is not None:
            raise self._seg_lost
        w = self._w
        err = int(w.err) if w is not None else 0
        if self.fsync is Fsync.SYNC and w is not None:
            w.err = 0  # the failed frames were rolled back; later writes may succeed
        raise StorageError(
            f"msync of {self.path} failed: {os.strerror(err) if err else 'I/O error'}",
            errno_=err, path=self.path,
            hint="the affected messages are not durable; check the disk, then reopen the queue",
        )

    def _roll(self) -> None:
        """Seal the current segment where the next frame did not fit and start the next one."""
        w = self._w
        new_base = int(w.base + w.pos)
        durable = self.fsync is not Fsync.FLUSH
        self._check_segment()
        if durable:
            with self._flusher_lock():
                if lib.k7_writer_sync(w):
                    self._raise_eio()
        self._remove_strays(int(w.base))
        dest = self.path / segment_name(new_base)
        spare, self._r.spare = self._r.spare, None
        m = spare.take(dest) if spare is not None else None
        if m is None:
            # on failure (a full disk) no file is left: the writer goes on in this segment
            create_segment(self.path, new_base, self.segment_size, durable=durable,
                           mode=self.file_mode)
            try:
                m = map_file(dest, writable=True)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(dest)
                raise
            assert m is not None
            m.prefetch()
        self._prepare_spare()
        with self._flusher_lock():
            w.seg, w.cap, w.base = m.ptr, m.size, new_base
            w.pos = w.written = w.synced = 0
            old, self._r.seg_map = self._r.seg_map, m
        if old is not None:
            old.close()
        self._bases.append(new_base)
        self._note_segment(new_base)
        self._apply_retention()

    def _remove_strays(self, current: int) -> None:
        """Delete segment files above the one being written, before a roll: only a roll
        that failed half-way (and could not clean up) leaves one, never with a frame."""
        for base in list_segments(self.path):
            if base <= current:
                continue
            path = self.path / segment_name(base)
            if frame_at(path, 0):
                raise StorageError(
                    f"{segment_name(base)} lies beyond the segment this writer is writing "
                    f"({segment_name(current)}) and holds frames", path=path, offset=base,
                    hint="another program wrote into the queue directory; move that file "
                    "away, then roll again",
                )
            side = self._discard_stray(base)
            log.warning("k7core: removed %s, left by a failed roll%s", segment_name(base),
                        f" (kept as {side})" if side else "")

    # ------------------------------------------------------------------ retention

    def enforce_retention(self) -> list[int]:
        """Apply the retention policy now (it also runs at open and at every roll); return
        the base offsets of the segments deleted."""
        with owned(self._fa):
            self._check_writable()
            return self._apply_retention()

    def _apply_retention(self) -> list[int]:
        """Delete the oldest sealed segments the policy allows, one at a time, oldest first,
        each unlink made durable before the next: a crash in between leaves a shorter log
        that starts at a segment base, never a gap."""
        if self.retention == "none" and self.retention_bytes is None and (
            self.retention_age is None
        ):
            return []
        w = self._w
        if w is None:
            return []
        current = int(w.base)
        segs = list_segment_infos(self.path)
        sealed = [sg for sg in segs if sg.base < current]
        ends = [sg.base for sg in segs[1:]]  # sealed[i] ends where the next segment starts
        k = 0
        if self.retention == "consumed":
            cursors = read_cursors(self.path)
            if cursors:
                end = self._visible_end()  # a cursor outside the log holds everything back
                low = min(c if 0 <= c <= end else 0 for _, c in cursors)
                while k < len(sealed) and ends[k] <= low:
                    k += 1
        if self.retention_bytes is not None:
            total = sum(sg.size for sg in segs)
            j = 0
            while j < len(sealed) and total > self.retention_bytes:
                total -= sealed[j].size
                j += 1
            k = max(k, j)
        if self.retention_age is not None:
            cutoff = time.time() - self.retention_age
            j = 0
            while j < len(sealed) and sealed[j].mtime < cutoff:
                j += 1
            k = max(k, j)
        deleted = []
        durable = self.fsync is not Fsync.FLUSH
        for sg in sealed[:k]:
            try:
                os.unlink(self.path / segment_name(sg.base))
            except FileNotFoundError:
                pass
            except OSError as exc:  # never fail a write or an open because of retention
                log.warning("k7core: retention could not delete %s: %s",
                            segment_name(sg.base), exc.strerror)
                break
            else:
                self._deleted_segments += 1
                self._deleted_bytes += sg.size
            deleted.append(sg.base)
            if durable:
                try:  # the unlink is durable before the next one: no gap after a crash
                    fsync_dir(self.path)
                except OSError as exc:
                    log.warning("k7core: retention stopped: fsync of %s failed: %s",
                                self.path, exc.strerror)
                    break
        if deleted:
            self._bases = [b for b in self._bases if b > deleted[-1]]
            log.info("k7core: retention deleted %d segment(s) of %s up to base %d",
                     len(deleted), self.path, deleted[-1])
        return deleted

    def _flusher_lock(self) -> Any:
        fl = self._r.flusher
        return fl.lock if fl is not None else _NO_LOCK

    def sync(self) -> None:
        """Make everything enqueued so far durable (msync) and visible now, any strategy."""
        with owned(self._fa):
            self._check_writable()
            with self._flusher_lock():
                if lib.k7_writer_sync(self._w):
                    self._raise_eio()
            self._check_segment()

    # ------------------------------------------------------------------ reading

    def _visible_end(self) -> int:
        end: int = lib.k7_load_end(self._pub)
        return end if end > self._floor_end else self._floor_end

    def _readable_end(self) -> int:
        """Up to where a group may be positioned: the visible end, or with ``fsync="async"``
        what this writer has written (visible within ``commit_interval``)."""
        w, fl = self._w, self._r.flusher
        if w is None or fl is None:
            return self._visible_end()
        with fl.lock:  # a roll moves base and pos together under it
            written = int(w.base + w.pos)
        return max(written, self._visible_end())

    def _segment_bases(self, refresh: bool = False) -> list[int]:
        if refresh or not self._bases:
            self._bases = list_segments(self.path)
        return self._bases

    def wait(self, after: int, timeout: float | None) -> int:
        """Wait, asleep until the writer publishes (futex), up to ``timeout`` seconds (None:
        no limit) for the visible end to pass ``after``; return the visible end. For readers
        without a group, such as a tail that calls ``read_columnar(after)`` again when this
        is larger."""
        self._check_open()
        after = check_int(after, "after", -1, MAX_OFFSET)
        deadline = time.monotonic() + check_timeout(timeout)
        while True:
            end = self._visible_end()
            left = deadline - time.monotonic()
            if end > after or left <= 0:
                return end
            self._wait(end, left)

    def _wait(self, known_end: int, timeout: float) -> None:
        """Sleep until the writer publishes past ``known_end`` or for ``timeout`` seconds,
        at most ``WAIT_SLICE`` (callers loop until their deadline, which may be infinite)."""
        if self._r.pos_map is None:
            time.sleep(min(timeout, 0.001))
            return
        lib.k7_wait(self._pub, known_end, int(min(timeout, WAIT_SLICE) * 1e9))

    @property
    def end(self) -> int:
        """The visible end of the log: readers see every message below this offset."""
        self._check_open()
        return self._visible_end()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"queue {self.path} is closed", path=self.path)

    def consumer_group(
        self,
        name: str,
        *,
        cursor_fsync: str | Fsync = Fsync.ASYNC,
        on_data_loss: str = "raise",
    ) -> ConsumerGroup:
        """Open (or create) the consumer group ``name``; one owner at a time.

        ``on_data_loss``: what ``poll`` does when the next offset was deleted by retention:
        ``"raise"`` (``DataLossError``) or ``"earliest"`` (jump to the earliest offset). A
        new group starts at the earliest offset of the log.
        """
        from ._group import ConsumerGroup

        self._check_open()
        return ConsumerGroup(self, name, cursor_fsync=cursor_fsync, on_data_loss=on_data_loss)

    def read_columnar(self, offset: int, max_messages: int = 65536) -> ColumnarBatch:
        """Read up to ``max_messages`` (1 .. ``MAX_BATCH``) frames from ``offset`` (a frame
        boundary) in one scan.

        Returns global offsets and payload positions/lengths into one read-only view (a single
        segment), without a Python object per message. No consumer group is involved.
        """
        self._check_open()
        offset = check_int(offset, "offset", 0, MAX_OFFSET)
        max_messages = check_count(max_messages, "max_messages")
        starts = _ZERO * max_messages
        lens = _ZERO * max_messages
        try:
            reader = self._bulk_readers.pop()  # atomic: each reader has one user at a time
        except IndexError:
            reader = Reader(self, 1)
        try:
            batch = self._read_columnar(reader, offset, max_messages, starts, lens)
        except BaseException:
            reader.close()
            raise
        if self._closed:
            reader.close()
        else:
            self._bulk_readers.append(reader)
        return batch

    def _read_columnar(
        self, reader: Reader, offset: int, max_messages: int,
        starts: array.array[int], lens: array.array[int],
    ) -> ColumnarBatch:
        c = reader.c
        with _from_buffer(starts) as sbuf, _from_buffer(lens) as lbuf:
            try:
                c.starts, c.lens = ffi.cast("int64_t *", sbuf), ffi.cast("int64_t *", lbuf)
                c.capacity = max_messages
                c.pos = offset
                n = reader.read(max_messages)
                view = reader.view[:] if n and reader.view is not None else memoryview(b"")
                offsets = _ZERO * n
                if n:
                    lib.k7_add_const(ffi.cast("int64_t *", _from_buffer(offsets)),
                                     c.starts, n, reader.base10)
                next_offset = int(c.pos)
            finally:
                c.starts = c.lens = ffi.NULL
                c.capacity = 0
        del starts[n:]
        del lens[n:]
        return ColumnarBatch(offsets, starts, lens, view, next_offset)

    # ------------------------------------------------------------------ introspection

    def earliest(self) -> int:
        """The first offset still in the log (the base of the oldest segment)."""
        self._check_open()
        bases = list_segments(self.path)
        return bases[0] if bases else 0

    def count_messages(self, start: int, end: int) -> int | None:
        """How many frames lie in [start, end) (``start`` a frame boundary), by a CRC-checked
        scan; None if that range is unreadable (deleted, corrupt)."""
        self._check_open()
        if end <= start:
            return 0
        r = Reader(self, 4096)
        r.c.pos = start
        n = 0
        try:
            while int(r.c.pos) < end:
                got = r.read(4096)
                if not got:
                    break
                if int(r.c.pos) <= end:
                    n += got
                else:
                    n += sum(1 for i in range(got) if r.base10 + int(r.c.starts[i]) < end)
        except K7Error:
            return None
        finally:
            r.close()
        return n

    def _lag_messages(self, start: int, end: int) -> int | None:
        return self.count_messages(start, end) if end - start <= LAG_COUNT_LIMIT else None

    def stats(self) -> QueueStats:
        """A snapshot of the queue: offsets, segments, every group's cursor and lag, syncs,
        recovery events and retention. Reads the directory; takes no lock; works on a
        ``readonly`` queue too."""
        self._check_open()
        segs = list_segment_infos(self.path)
        end = self._visible_end()
        earliest = segs[0].base if segs else 0
        groups = []
        locks = LockTable()
        for name, committed in read_cursors(self.path):
            lag = max(0, end - committed)
            msgs = None if committed < earliest else self._lag_messages(committed, end)
            groups.append(GroupInfo(name, committed, lag, msgs,
                                    group_owned(self.path, name, locks)))
        w = self._w
        return QueueStats(
            path=str(self.path),
            readonly=self.readonly,
            writer_active=not self.readonly or locks.locked(self.path / WRITER_LOCK),
            fsync=None if self.readonly else self.fsync.value,
            segment_size=None if self.readonly else self.segment_size,
            earliest_offset=earliest,
            next_offset=end,
            segment_count=len(segs),
            segment_bytes=sum(sg.size for sg in segs),
            disk_bytes=disk_bytes(self.path),
            segments=tuple(segs),
            groups=tuple(groups),
            log_syncs=int(w.nsyncs) if w is not None else None,
            log_sync=SyncLatency.from_writer(w) if w is not None else None,
            recovery_events=tuple(self._events),
            retention=self.retention,
            retention_deleted_segments=self._deleted_segments,
            retention_deleted_bytes=self._deleted_bytes,
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the open groups, stop the flusher after a final sync, release files. Idempotent."""
        if self._closed:
            return
        # Another thread inside enqueue or poll: refuse (ConcurrentUseError) before anything
        # is released under it.
        for g in list(self._groups):
            g._check_owner()
        with owned(self._fa):
            self._close()

    def _close(self) -> None:
        self._closed = True
        first_error: BaseException | None = None
        for g in list(self._groups):
            try:
                g.close()
            except K7Error as exc:  # keep closing; report the first failure at the end
                first_error = first_error or exc
        self._fa.detach()
        while self._bulk_readers:
            self._bulk_readers.pop().close()
        try:
            self._check_segment()
        except StorageError as exc:
            first_error = first_error or exc
        w, self._w = self._w, None
        err = 0
        fl = self._r.flusher
        if fl is not None:
            fl.stop()
            err = fl.error
        if w is not None:
            with self._flusher_lock():
                # an earlier failure stays reported: pages whose writeback failed may be
                # gone even if this msync succeeds
                err = lib.k7_writer_sync(w) or int(w.err) or err
        held = (
            self._lock_drained(int(w.base + w.pos))
            if self.remove_when_empty and w is not None and not err and first_error is None
            else None
        )
        remove = held is not None
        if held is not None:
            try:
                self._remove_files()
            finally:
                for fd in held:
                    os.close(fd)
        self._finalizer()
        if remove:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
        if first_error is not None:
            raise first_error
        if err and not self.readonly:
            raise StorageError(
                f"final msync of {self.path} failed: {os.strerror(err)}", errno_=err,
                path=self.path, hint="recently enqueued messages may not be durable",
            )

    def _lock_drained(self, end: int) -> list[int] | None:
        """If every group has committed ``end`` (with no group: if the log holds no message),
        lock every cursor file (so no consumer opens one meanwhile) and return the locked
        fds; None, with nothing locked, otherwise or when a consumer owns a group."""
        cursors = read_cursors(self.path)
        if not cursors:
            bases = list_segments(self.path)
            return [] if not bases or end == bases[0] else None
        if any(c < end for _, c in cursors):
            return None
        fds: list[int] = []
        try:
            for name, _ in cursors:
                fd = open_fd(self.path / cursor_name(name), os.O_RDONLY)
                fds.append(fd)
                if not try_lock(fd):
                    raise BlockingIOError
            if all(c >= end for _, c in read_cursors(self.path)):  # unchanged since
                return fds
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        return None

    def _remove_files(self) -> None:
        """Delete every file of the queue, the writer lock last (we still hold it)."""
        for name in os.listdir(self.path):
            if SEGMENT_RE.match(name) or cursor_group(name) is not None or (
                name.startswith(OWN_PREFIX) and name != WRITER_LOCK and name != "k7py-staging"
            ):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(self.path / name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / WRITER_LOCK)
        log.info("k7core: removed the drained queue %s", self.path)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("readonly" if self.readonly else self.fsync.value)
        return f"<k7core.Queue {str(self.path)!r} {state}>"


class ColumnarBatch:
    """A batch read without per-message objects: ``payload i`` is
    ``view[starts[i]:starts[i] + lengths[i]]``; ``next`` is the offset after the batch."""

    __slots__ = ("lengths", "next", "offsets", "starts", "view")

    def __init__(
        self,
        offsets: array.array[int],
        starts: array.array[int],
        lengths: array.array[int],
        view: memoryview,
        next_offset: int,
    ) -> None:
        self.offsets = offsets
        self.starts = starts
        self.lengths = lengths
        self.view = view
        self.next = next_offset

    def __len__(self) -> int:
        return len(self.offsets)

    def payload(self, i: int) -> memoryview:
        s = self.starts[i]
        return self.view[s : s + self.lengths[i]]

    def gather(self) -> tuple[bytes, array.array[int]]:
        """Copy the payloads into one contiguous buffer with int32 Arrow-style offsets."""
        n = len(self.offsets)
        total = sum(self.lengths)
        dst = bytearray(total)
        offs = array.array("i", bytes(4 * (n + 1)))
        if n:
            src = ffi.from_buffer(self.view)
            rc = lib.k7_gather(
                src, len(src),
                ffi.cast("int64_t *", ffi.from_buffer(self.starts)),
                ffi.cast("int64_t *", ffi.from_buffer(self.lengths)),
                n, ffi.from_buffer(dst), total,
                ffi.cast("int32_t *", ffi.from_buffer(offs)),
            )
            if rc < 0:
                raise ValueError("batch too large to gather into int32 offsets")
        return bytes(dst), offs


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()
