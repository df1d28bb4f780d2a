"""The writer of a queue: appends frames to the last segment, rolls to the next one,
prepares the spare segment, and watches the file it writes.

The per-message fast path is C (``Appender`` over a ``k7_writer``); this module holds the
slow paths the fast path returns to (a full segment, an error, a closed queue).
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
from collections.abc import Callable
from typing import Any

from ._errors import ClosedError, K7Error, LockFileLostError, LockTimeoutError, StorageError
from ._format import (
    SPARE_MIN_SIZE,
    SPARE_SEGMENT,
    WRITER_LOCK,
    Fsync,
    orphaned_name,
    segment_name,
)
from ._kernel import (
    BADOFFSETS,
    BUSY,
    EIO,
    LOCKTIMEOUT,
    NOFIT,
    RECOVER,
    REMAP,
    TOOLARGE,
    address,
    ffi,
    lib,
    owned,
)
from ._log import LogView
from ._native._fast import CLOSED, Appender
from ._options import QueueOptions
from ._recovery import Tail, cut_tail, discard_stray, msync_range
from ._shared import SharedWriters, lost_lock
from ._stats import RecoveryEvent
from ._storage import (
    SpareSegment,
    create_segment,
    frame_at,
    fsync_file,
    list_segments,
    map_file,
    open_fd,
    same_file,
    valid_end,
)

log = logging.getLogger("k7core")

SLOW_TRIES = 8  # fixes a slow path may need in a row (wait, recover, follow, roll, ...)

_from_buffer = ffi.from_buffer


class SegmentWriter:
    """Appends to the log of ``log.path`` from the recovered ``tail``. ``retain(incoming)``
    applies retention: after every roll (``incoming`` 0), and before a roll's new segment
    that a full disk refused (``incoming``: its size, counted as ``retention_bytes`` would
    count it after the roll); it returns the bases it deleted. ``fa`` is the C fast path;
    ``c`` the ``k7_writer`` (counters).

    With ``shared`` (writers="shared"), every append, roll and recovery happens under the
    directory's shared lock: the kernel takes it on the fast path and returns BUSY, RECOVER,
    REMAP or NOFIT with it held (or to be waited for), and the slow paths here fix the cause
    under it, then release it (``k7_shared_release``, a no-op for an exclusive writer).
    ``tail`` is then where the log ended when this writer joined. ``lock_fd``: the writer
    lock the queue holds, checked at every roll, ``sync()`` and ``close()``."""

    def __init__(
        self, log_view: LogView, options: QueueOptions, tail: Tail,
        retain: Callable[[int], list[int]],
        *, shared: SharedWriters | None = None, events: list[RecoveryEvent] | None = None,
        lock_fd: int = -1,
    ) -> None:
        self._log = log_view
        self._lock_fd = lock_fd
        self._shared = shared
        self._events = events if events is not None else []
        self._opts = options
        self._path = log_view.path
        self._retain = retain
        self._closed = False
        self._spare: SpareSegment | None = None
        self._seg_id: tuple[int, int] | None = None  # (device, inode) of the segment written
        # the segment file, or a lock file (LockFileLostError), was deleted or replaced
        self._seg_lost: StorageError | LockFileLostError | None = None
        m = self._seg_map = tail.segment
        self._note_segment(tail.base)
        m.prefetch()
        w = self.c = ffi.new("k7_writer *")
        w.seg, w.cap, w.base = m.ptr, m.size, tail.base
        w.pos = w.written = w.synced = tail.end
        w.pub = log_view.pub
        w.mode = options.fsync.code
        w.max_frame = options.segment_size
        w.slot = -1
        if shared is not None:
            w.sh, w.slot = shared.sh, shared.slot
            w.pid = os.getpid()
            w.lock_timeout_ns = round(options.lock_timeout * 1e9)
        self.fa = Appender(address(w))
        seg = self._path / segment_name(tail.base)
        if shared is None or shared.first:
            if options.durable and tail.end and msync_range(m, 0, tail.end):
                raise StorageError(f"msync of {seg} failed at open", path=seg)
            # Frames recovered after a crash are made durable before readers may see them.
            lib.k7_publish(log_view.pub, tail.base + tail.end)
        if options.fsync is Fsync.ASYNC:
            slot = log_view.flush_slot()
            w.bell = slot.bell
            slot.set_writer(w)
            log_view.set_written(self._written)
        self._spare_name = SPARE_SEGMENT if shared is None else shared.spare_name
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path / self._spare_name)  # one left by a crash
        if shared is not None:
            self._register(True)
        self._prepare_spare(prefault=False)

    # ------------------------------------------------------------------ state

    @property
    def base(self) -> int:
        """Base offset of the segment being written."""
        return int(self.c.base)

    def end(self) -> int:
        """The offset after the last frame written (visible or not yet)."""
        return int(self.c.base + self.c.pos)

    def _written(self) -> int:
        with self._lock():  # a roll moves base and pos together under it
            return int(self.c.base + self.c.pos)

    def _lock(self) -> Any:
        return self._log.flush_slot().lock if self._log.has_flush_slot else _NO_LOCK

    # ------------------------------------------------------------------ slow paths

    def enqueue_slow(self, data: Any, rc: int) -> int:
        """``enqueue`` after the fast path returned ``rc`` < 0."""
        with owned(self.fa), self._released():
            for _ in range(SLOW_TRIES):
                if rc == CLOSED:
                    self._raise_closed()
                elif rc == EIO:
                    self.raise_eio()
                elif rc == TOOLARGE:
                    self._check_size(memoryview(data).nbytes)
                elif rc == NOFIT:
                    self._check_size(memoryview(data).nbytes)
                    self.roll()
                elif rc in (BUSY, RECOVER, REMAP):
                    self._hold()
                elif rc == LOCKTIMEOUT:
                    self._raise_lock_timeout()
                else:
                    return rc
                rc = self.fa.append(data)
            if rc < 0:
                self.raise_eio() if rc == EIO else self._check_size(memoryview(data).nbytes)
            return rc

    def enqueue_many_slow(
        self, items: list[Any] | tuple[Any, ...], out: list[int] | int
    ) -> list[int]:
        """``enqueue_many`` after the fast path returned ``out`` (a short list or a code)."""
        offsets: list[int] = []
        try:
            return self._enqueue_many_slow(items, out, offsets)
        except K7Error as exc:
            partly_written(exc, offsets, len(items))
            raise

    def _enqueue_many_slow(
        self, items: list[Any] | tuple[Any, ...], out: list[int] | int, offsets: list[int]
    ) -> list[int]:
        with owned(self.fa), self._released():
            while True:
                if isinstance(out, list):
                    offsets += out
                    if len(offsets) == len(items):
                        return offsets
                elif out == CLOSED:
                    self._raise_closed()
                elif out == EIO:
                    self.raise_eio()
                elif out == TOOLARGE:
                    self._check_size(max(memoryview(x).nbytes for x in items[len(offsets):]))
                elif out in (0, NOFIT):
                    self._check_size(memoryview(items[len(offsets)]).nbytes)
                    self.roll()
                elif out in (BUSY, RECOVER, REMAP):
                    self._hold()
                elif out == LOCKTIMEOUT:
                    self._raise_lock_timeout()
                else:
                    raise AssertionError(f"unexpected append_many result {out}")
                out = self.fa.append_many(items, len(offsets))

    def append_columnar(self, data: Any, offsets: memoryview, n: int) -> array.array[int]:
        """``enqueue_columnar``: ``n`` messages of ``data`` cut at ``offsets``."""
        with owned(self.fa), self._released():
            if self._closed:
                self._raise_closed()
            out = array.array("q", bytes(8 * n))
            if n == 0:
                return out
            dbuf = _from_buffer(data)
            wide = offsets.itemsize == 8
            obuf = ffi.cast("int64_t *" if wide else "int32_t *", _from_buffer(offsets))
            fn = lib.k7_append_columnar if wide else lib.k7_append_columnar32
            optr = ffi.cast("int64_t *", _from_buffer(out))
            done = [0]  # messages written so far, for the error of a failed roll
            try:
                self._append_columnar(fn, dbuf, obuf, optr, offsets, n, done)
            except K7Error as exc:
                partly_written(exc, out[:done[0]].tolist(), n)
                raise
            return out

    def _append_columnar(
        self, fn: Any, dbuf: Any, obuf: Any, optr: Any, offsets: memoryview, n: int,
        done: list[int],
    ) -> None:
        while done[0] < n:
            d = done[0]
            rc = fn(self.c, dbuf, len(dbuf), obuf + d, n - d, optr + d)
            if rc > 0:
                done[0] += rc
                continue
            if rc == BADOFFSETS:
                raise ValueError("offsets must be non-decreasing and within the data buffer")
            if rc == TOOLARGE:
                self._check_size(max(offsets[i + 1] - offsets[i] for i in range(d, n)))
            if rc == EIO:
                self.raise_eio()
            if rc in (BUSY, RECOVER, REMAP):
                self._hold()
                continue
            if rc == LOCKTIMEOUT:
                self._raise_lock_timeout()
            self._check_size(offsets[d + 1] - offsets[d])
            self.roll()

    def _check_size(self, n: int) -> None:
        self._opts.check_message_size(n, self._path)

    def _raise_closed(self) -> None:
        raise ClosedError(f"queue {self._path} is closed", path=self._path)

    def raise_eio(self) -> None:
        """Raise the ``StorageError`` of the failed msync the kernel reported."""
        if self._seg_lost is not None:
            raise self._seg_lost
        w = self.c
        err = int(w.err)
        if self._opts.fsync is Fsync.SYNC:
            w.err = 0  # the failed frames were rolled back; later writes may succeed
        raise StorageError(
            f"msync of {self._path} failed: {os.strerror(err) if err else 'I/O error'}",
            errno_=err, path=self._path,
            hint="the affected messages are not durable; check the disk, then reopen the queue",
        )

    # ------------------------------------------------------------------ sync and roll

    def sync(self) -> None:
        """msync and publish everything written (any strategy); check the segment file."""
        with owned(self.fa):
            if self._closed:
                self._raise_closed()
            with self._lock():
                if lib.k7_writer_sync(self.c):
                    self.raise_eio()
            self.check_segment()

    def roll(self) -> None:
        """Seal the current segment where the next frame did not fit and start the next one
        (a shared writer: under the shared lock, at the shared end, which it holds)."""
        w = self.c
        new_base = int(w.base + w.pos)
        durable = self._opts.durable
        self.check_segment()
        if durable or self._shared is not None:  # shared: every roll msyncs (synced >= base)
            with self._lock():
                if lib.k7_writer_sync(w):
                    self.raise_eio()
        self._remove_strays(int(w.base))
        if self._shared is not None:
            self._shared.sweep(w)  # dead writers' slots and spares
        dest = self._path / segment_name(new_base)
        spare, self._spare = self._spare, None
        m = spare.take(dest) if spare is not None else None
        if m is None:
            self._create_segment(new_base)
            try:
                m = map_file(dest, writable=True)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(dest)
                raise
            assert m is not None
            m.prefetch()
        self._prepare_spare()
        with self._lock():
            w.seg, w.cap, w.base = m.ptr, m.size, new_base
            w.pos = w.written = w.synced = 0
            if self._shared is not None:
                lib.k7_shared_rolled(w)
            old, self._seg_map = self._seg_map, m
        old.close()
        self._log.set_segment_bases([*self._log.segment_bases(), new_base])
        self._note_segment(new_base)
        self._retain(0)

    def _create_segment(self, base: int) -> None:
        """Create the segment a roll goes to. On a full disk, retention runs first (what it
        deletes was sealed before; without it, a disk filled by a consumed log would refuse
        every roll): the creation is tried once more if it deleted something. On failure
        no file is left, and the writer goes on in the segment it writes."""
        size, mode, durable = self._opts.segment_size, self._opts.file_mode, self._opts.durable
        try:
            create_segment(self._path, base, size, durable=durable, mode=mode)
        except StorageError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._retain(size):
                raise
            create_segment(self._path, base, size, durable=durable, mode=mode)

    def _prepare_spare(self, *, prefault: bool = True) -> None:
        """Start preparing the next segment. Pre-faulting dirties its pages (the kernel may
        write those zeros back before the data), so only a writer that has filled a segment
        since it opened, and so will likely fill the next one, gets it."""
        if self._opts.segment_size >= SPARE_MIN_SIZE:
            self._spare = SpareSegment(
                self._path / self._spare_name, self._opts.segment_size,
                durable=self._opts.durable, prefault=prefault, mode=self._opts.file_mode,
            )

    def _remove_strays(self, current: int) -> None:
        """Delete segment files above the one being written, before a roll: only a roll
        that failed half-way (and could not clean up) leaves one, never with a frame."""
        for base in list_segments(self._path):
            if base <= current:
                continue
            seg = self._path / segment_name(base)
            if frame_at(seg, 0):
                raise StorageError(
                    f"{segment_name(base)} lies beyond the segment this writer is writing "
                    f"({segment_name(current)}) and holds frames", path=seg, offset=base,
                    hint="another program wrote into the queue directory; move that file "
                    "away, then roll again",
                )
            side = discard_stray(self._path, base)
            log.warning("k7core: removed %s, left by a failed roll%s", segment_name(base),
                        f" (kept as {side})" if side else "")

    # ------------------------------------------------------------------ shared writers

    @contextlib.contextmanager
    def _released(self) -> Any:
        """A slow path: whatever happens in it, the shared lock is not kept after it."""
        try:
            yield
        finally:
            lib.k7_shared_release(self.c)

    @contextlib.contextmanager
    def locked(self) -> Any:
        """The block runs under the shared lock (for retention); nothing for an exclusive
        writer. The caller owns ``fa``."""
        if self._shared is None:
            yield
            return
        with self._released():
            self._hold()
            yield

    def _hold(self) -> None:
        """Take the shared lock (waiting, without the GIL) and bring this writer up to date:
        cut the tail of a writer that died holding it, follow another writer's roll."""
        for _ in range(SLOW_TRIES):
            rc = lib.k7_shared_lock(self.c)
            if rc == 0:
                return
            if rc == RECOVER:
                self._recover_dead()
            elif rc == REMAP:
                self._follow()
            elif rc == LOCKTIMEOUT:
                self._raise_lock_timeout()
            else:
                self.raise_eio()
        raise AssertionError("the shared state did not settle")  # pragma: no cover

    def _raise_lock_timeout(self) -> None:
        """The shared lock stayed taken for ``lock_timeout`` (the kernel named its holder)."""
        assert self._shared is not None
        pid = self._shared.holder_pid() or process_of(int(self.c.holder))
        who = f"process {pid}" if pid else "another process (its id is not known here)"
        raise LockTimeoutError(
            f"{who} held the shared writers' lock of {self._path} for more than "
            f"lock_timeout={self._opts.lock_timeout:g} s; nothing was written",
            pid=pid, path=self._path,
            hint=f"that process is stopped (SIGSTOP, a debugger) or stuck: resume (kill -CONT "
            f"{pid or '<pid>'}) or end it, then retry; a dead holder's lock passes on by itself",
        )

    def _follow(self) -> None:
        """Under the shared lock: map the segment another writer rolled to, and write there."""
        assert self._shared is not None
        w = self.c
        base = self._shared.state().base
        seg = self._path / segment_name(base)
        m = map_file(seg, writable=True)
        if m is None:
            raise StorageError(f"{seg}, where the shared writers write, is missing or empty",
                               path=seg, hint="another program changed the queue directory")
        m.prefetch()
        with self._lock():
            w.seg, w.cap, w.base = m.ptr, m.size, base
            lib.k7_shared_follow(w)
            old, self._seg_map = self._seg_map, m
        old.close()
        self._log.segment_bases(refresh=True)
        self._note_segment(base)

    def _recover_dead(self) -> None:
        """Under the shared lock, which a writer held when it died: recover the tail as
        open-time recovery does (the whole valid frames it wrote past the shared end stay, as
        an exclusive writer's do; what follows them is saved to a side file and zeroed),
        drop a segment its roll left, forget it, then let the writers go on."""
        assert self._shared is not None
        w = self.c
        state = self._shared.state()
        if state.base != int(w.base):
            self._follow()
        base = int(w.base)
        end = valid_end(self._seg_map, self._seg_map.size, state.pos)
        cut_tail(self._path, self._opts, self._seg_map, base, end, self._events)
        self._remove_strays(base)
        dead = self._shared.sweep(w)
        lib.k7_shared_recovered(w, end)
        log.warning("k7core: a shared writer of %s died holding its lock (dead writer "
                    "processes, the holder among them: %s); %d bytes of whole frames it wrote "
                    "past the end kept; the log goes on at offset %d", self._path,
                    ", ".join(map(str, dead)) or "none left registered", end - state.pos,
                    base + end)

    def _register(self, joining: bool) -> None:
        """Enter this writer in the shared state's table (forgetting dead writers), or
        leave it."""
        assert self._shared is not None
        with self._released():
            self._hold()
            if joining:
                self._shared.register(self.c)
            else:
                self._shared.unregister(self.c)

    # ------------------------------------------------------------------ the segment file

    def _note_segment(self, base: int) -> None:
        st = os.stat(self._path / segment_name(base), follow_symlinks=False)
        self._seg_id = (st.st_dev, st.st_ino)

    def check_segment(self) -> None:
        """Raise (and from then on refuse writes) if the file of the segment being written
        was deleted, replaced or shrunk underneath the queue: what was written into it since
        would be gone with the mapping. Its frames are saved to a side file first. One stat:
        run at every roll, ``sync()`` and ``close()``, not per message."""
        if self._seg_lost is not None:
            raise self._seg_lost
        self._check_segment_file()  # first: a lost segment says which messages are gone
        self._check_locks()

    def _check_segment_file(self) -> None:
        w, m = self.c, self._seg_map
        if m.closed:
            return
        if self._shared is not None and self._shared.state().base != int(w.base):
            return  # another writer rolled: the segment this one maps is sealed (and msynced)
        base, written = int(w.base), int(w.pos)
        seg = self._path / segment_name(base)
        try:
            st = os.stat(seg, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._seg_id and st.st_size >= m.size:
                return
        except FileNotFoundError:
            pass
        w.err = errno.ESTALE  # the kernel refuses every later append
        side = self._path / orphaned_name(base)
        try:  # a segment image: renamed back, it restores the frames
            fd = open_fd(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self._opts.file_mode)
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
            f"segment file {seg} was deleted, replaced or truncated while this queue was "
            "writing it: "
            f"the messages from offset {base} to {base + written} are not in the directory",
            errno_=errno.ESTALE, path=seg, offset=base, hint=hint,
        )
        log.error("k7core: %s", self._seg_lost)
        raise self._seg_lost

    def _check_locks(self) -> None:
        """Stop writing (LockFileLostError, from then on) if a lock file this writer holds
        was deleted or replaced: another writer could open as if the queue were free."""
        try:
            if self._shared is not None:
                self._shared.check_files()
            elif self._lock_fd >= 0 and not same_file(self._lock_fd, self._path / WRITER_LOCK):
                raise lost_lock(self._path, f"{WRITER_LOCK} was deleted or replaced while "
                                "this writer held it")
        except LockFileLostError as exc:
            self.c.err = errno.ESTALE  # the kernel refuses every later append
            self._seg_lost = exc
            log.error("k7core: %s", exc)
            raise

    # ------------------------------------------------------------------ lifetime

    def close(self) -> int:
        """Detach the fast path and make everything written durable; the first msync errno
        met (by this final sync or earlier), 0 if none. The caller holds ``fa``. Releases
        the spare; the segment stays mapped until :meth:`release`."""
        if self._closed:
            return 0
        self._closed = True
        self.fa.detach()
        with self._lock():
            # an earlier failure stays reported: pages whose writeback failed may be
            # gone even if this msync succeeds
            err = int(lib.k7_writer_sync(self.c)) or int(self.c.err)
        if self._shared is not None:
            try:
                self._register(False)
            except LockTimeoutError as exc:  # close anyway: its slot frees when it is gone
                log.warning("k7core: closing %s without leaving the shared writers' table: "
                            "%s", self._path, exc)
            except StorageError:  # a dead state: nobody to tell
                pass
        return err

    def release(self) -> None:
        """Unmap the segment and drop the spare. Idempotent; also run by the finalizer."""
        if self._spare is not None:
            self._spare.discard()
            self._spare = None
        self._seg_map.close()


def process_of(tid: int) -> int:
    """The process of thread ``tid`` (Linux: its ``Tgid``); ``tid`` itself where that cannot
    be read (the first thread of a process has the process's id)."""
    try:
        with open(f"/proc/{tid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


def partly_written(exc: K7Error, written: list[int], total: int) -> None:
    """Say on ``exc`` which messages of a batch of ``total`` were written before it failed
    (``exc.written``, and in its message), so that a retry does not write them twice."""
    if not written:
        return
    exc.written = tuple(written)
    note = (f"the first {len(written)} of the {total} messages of this call were written "
            f"(offsets {written[0]} to {written[-1]}, in the error's .written): retry only "
            "the others")
    exc.args = (f"{exc.args[0]}; {note}" if exc.args else note, *exc.args[1:])
