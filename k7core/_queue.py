"""The queue: the public face over its parts (one writer per directory, recovery on open,
retention, reads without a group, stats). Each part lives in its own module; see
docs/architecture.md."""

from __future__ import annotations

import array
import contextlib
import os
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ._checks import check_int, check_timeout, message_list
from ._columnar import BulkReader, ColumnarBatch
from ._errors import (
    ClosedError,
    LockFileLostError,
    NotAQueueError,
    QueueLockedError,
    ReadOnlyError,
    StorageError,
)
from ._format import (
    DEFAULT_SEGMENT_SIZE,
    MAX_OFFSET,
    POSITION_FILE,
    POSITION_FILE_SIZE,
    WRITER_LOCK,
    Fsync,
    segment_name,
)
from ._group import ConsumerGroup, OpenGroups
from ._kernel import ffi, owned
from ._log import LogView
from ._native._fast import Appender
from ._options import DEFAULT_LOCK_TIMEOUT, QueueOptions
from ._reader import count_frames, lag_messages
from ._recovery import recover
from ._resource import Resource
from ._retention import Retention, lock_drained, remove_queue_files
from ._shared import Presence, SharedWriters, shared_live, shared_pids, writer_live, writer_presence
from ._stats import (
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
    frames_end,
    held_by,
    list_segments,
    open_fd,
    preallocate,
    try_lock,
)
from ._writer import SegmentWriter


def _lock_with_retry(fd: int, *, exclusive: bool) -> bool:
    """Take the writer lock (shared writers: a shared flock); a readonly opener may hold a
    probe of it for microseconds."""
    for delay in (0.0, 0.001, 0.005, 0.02):
        time.sleep(delay)
        if try_lock(fd, exclusive=exclusive):
            return True
    return False


class _Resources:
    """OS resources of a queue, released exactly once (by close() or by the finalizer)."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.log: LogView | None = None
        self.writer: SegmentWriter | None = None
        self.bulk: BulkReader | None = None
        self.shared: SharedWriters | None = None
        self.presence: Presence | None = None

    def release(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.bulk is not None:
            self.bulk.close()
        if self.writer is not None:
            self.writer.release()
        if self.shared is not None:
            self.shared.leave()
        if self.presence is not None:  # before the writer lock: see Presence.drop
            self.presence.close()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


class Queue(Resource):
    """A durable append-only log in a directory; creates it or recovers it on open.

    One writer per directory across processes (``QueueLockedError`` otherwise), unless every
    writer opens with ``writers="shared"``: then any number of processes (up to 64 at once)
    append to the directory through a lock in shared memory, each call's frames contiguous,
    a writer killed at any point recovered by the next (docs/concurrency.md). Shared writers
    use one ``fsync`` strategy. A shared writer waits at most ``lock_timeout`` seconds for a
    lock another process holds (stopped, not dead), then raises ``LockTimeoutError`` naming
    it. ``enqueue`` must be called from one thread at a time.
    Consumer groups are opened with :meth:`consumer_group`. ``readonly=True`` opens a queue
    that another process writes: no writer lock, ``enqueue`` raises, consumer groups work.

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
        writers: str = "exclusive",
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self._closed = True
        self._fa = Appender(0)  # the enqueue fast path: detached (CLOSED) until recovered
        self._writer: SegmentWriter | None = None
        self._retention: Retention | None = None
        self._path = Path(path)
        self._opts = QueueOptions.checked(
            segment_size=segment_size, fsync=fsync, commit_interval=commit_interval,
            readonly=readonly, retention=retention, retention_bytes=retention_bytes,
            retention_age=retention_age, remove_when_empty=remove_when_empty,
            file_mode=file_mode, writers=writers, lock_timeout=lock_timeout,
        )
        self._events: list[RecoveryEvent] = []
        self._groups = OpenGroups(self._path)
        self._r = _Resources()
        self._finalizer = weakref.finalize(self, self._r.release)
        try:
            self._open()
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    # ------------------------------------------------------------------ options

    @property
    def path(self) -> Path:
        """The queue directory."""
        return self._path

    @property
    def options(self) -> QueueOptions:
        """The options the queue was opened with (immutable)."""
        return self._opts

    @property
    def segment_size(self) -> int:
        return self._opts.segment_size

    @property
    def fsync(self) -> Fsync:
        return self._opts.fsync

    @property
    def commit_interval(self) -> float:
        return self._opts.commit_interval

    @property
    def readonly(self) -> bool:
        return self._opts.readonly

    @property
    def retention(self) -> str:
        return self._opts.retention

    @property
    def retention_bytes(self) -> int | None:
        return self._opts.retention_bytes

    @property
    def retention_age(self) -> float | None:
        return self._opts.retention_age

    @property
    def remove_when_empty(self) -> bool:
        return self._opts.remove_when_empty

    @property
    def file_mode(self) -> int:
        return self._opts.file_mode

    @property
    def writers(self) -> str:
        """``"exclusive"`` (the one writer of the directory) or ``"shared"``."""
        return self._opts.writers

    @property
    def lock_timeout(self) -> float:
        """Seconds a shared writer waits for a lock another process holds."""
        return self._opts.lock_timeout

    # ------------------------------------------------------------------ open

    def _open(self) -> None:
        path, readonly = self._path, self._opts.readonly
        try:
            if readonly:
                if not path.is_dir():
                    raise NotAQueueError(
                        f"{path} is not a queue directory", path=path,
                        hint="open it once without readonly=True to create it",
                    )
            else:
                if path.exists() and not path.is_dir():
                    raise NotAQueueError(f"{path} is not a directory", path=path)
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot {'open' if readonly else 'create'} queue directory "
                f"{path}: {exc.strerror}",
                errno_=exc.errno or 0, path=path,
            ) from exc
        if not readonly:
            if not path.is_dir():
                raise NotAQueueError(f"{path} is not a directory", path=path)
            fd = open_fd(path / WRITER_LOCK, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
            self._r.lock_fd = fd
            shared = self._opts.writers == "shared"
            if not _lock_with_retry(fd, exclusive=not shared):
                if shared:
                    raise QueueLockedError(
                        f"queue {path} is locked by an exclusive writer "
                        f"({held_by(path / WRITER_LOCK)})", path=path,
                        hint="close it, or open every writer of the queue with "
                        "writers='shared'",
                    )
                if shared_live(path, self._opts.lock_timeout):
                    raise QueueLockedError(
                        f"queue {path} is written by shared writers "
                        f"({held_by(path / WRITER_LOCK)} among them)", path=path,
                        hint="open this one with writers='shared' too, or readonly=True",
                    )
                raise QueueLockedError(
                    f"queue {path} is locked by another writer "
                    f"({held_by(path / WRITER_LOCK)})", path=path,
                    hint="close the other Queue, or open this one with readonly=True",
                )
            self._r.presence = writer_presence(path, fd, shared=shared)
        lg = self._log = self._r.log = self._open_log()
        self._r.bulk = self._bulk = BulkReader(lg)
        if readonly:
            bases = lg.segment_bases(refresh=True)
            if bases and not writer_live(path, self._opts.lock_timeout):
                lg.floor_end = bases[-1] + frames_end(path / segment_name(bases[-1]))
            return
        retention = self._retention = Retention(lg, self._opts)
        if self._opts.writers == "shared":
            assert self._r.presence is not None
            sw = self._r.shared = SharedWriters(path, self._opts, self._r.lock_fd,
                                                self._r.presence)
            with sw.joining():
                if sw.enter():  # the first: recovers the log as an exclusive writer does
                    tail = recover(path, self._opts, self._events)
                    sw.init(tail.base, tail.end)
                else:
                    tail = sw.tail()
                lg.set_segment_bases(tail.bases)
                w = self._writer = self._r.writer = SegmentWriter(
                    lg, self._opts, tail, lambda incoming: retention.apply(w.base, incoming),
                    shared=sw, events=self._events,
                )
        else:
            tail = recover(path, self._opts, self._events)
            lg.set_segment_bases(tail.bases)
            w = self._writer = self._r.writer = SegmentWriter(
                lg, self._opts, tail, lambda incoming: retention.apply(w.base, incoming),
                lock_fd=self._r.lock_fd,
            )
        self._fa = w.fa
        with owned(w.fa), w.locked():
            retention.apply(w.base)

    def _open_log(self) -> LogView:
        """Map the position file (the published end, shared by every process)."""
        path = self._path / POSITION_FILE
        try:
            fd = open_fd(path, os.O_RDWR | os.O_CREAT, self._opts.file_mode)
        except StorageError:
            if not self._opts.readonly:
                raise
            # a read-only directory: the end is private and polled
            return LogView(self._path, self._opts, ffi.new("k7_pos *"), polled=True)
        try:
            if os.fstat(fd).st_size < POSITION_FILE_SIZE:
                preallocate(fd, POSITION_FILE_SIZE, path)
            m = Mapping(fd, POSITION_FILE_SIZE, writable=True)
        finally:
            os.close(fd)
        # the view keeps the map: readers and groups still holding it never see it unmapped
        return LogView(self._path, self._opts, ffi.cast("k7_pos *", m.ptr), polled=False, keep=m)

    # ------------------------------------------------------------------ writing

    def enqueue(self, data: bytes | bytearray | memoryview) -> int:
        """Append one message; return its global offset.

        Durable per the queue's ``fsync`` strategy when this returns (``"sync"``: msync'd).
        """
        off = self._fa.append(data)
        if off >= 0:
            return off
        return self._active_writer().enqueue_slow(data, off)

    def enqueue_many(self, items: Iterable[bytes | bytearray | memoryview]) -> list[int]:
        """Append a batch (one kernel call per segment); return the offsets in order.

        A message too large for a segment fails the whole batch before anything is written.
        """
        if not isinstance(items, (list, tuple)):
            items = message_list(items)
        out = self._fa.append_many(items, 0)
        if type(out) is list and len(out) == len(items):
            return out
        return self._active_writer().enqueue_many_slow(items, out)

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
        return self._active_writer().append_columnar(data, mv, n)

    def check_message_size(self, n: int) -> None:
        """Raise ``MessageTooLargeError`` if a message of ``n`` bytes cannot be enqueued
        (for callers that check before they hand a message on)."""
        self._check_open()
        self._opts.check_message_size(n, self._path)

    def _active_writer(self) -> SegmentWriter:
        """The writer, or the error of a queue that cannot write (closed first)."""
        w = self._writer
        if w is None:
            self._check_open()
            raise ReadOnlyError(
                f"queue {self._path} was opened with readonly=True", path=self._path,
                hint="open it without readonly=True to write (one writer per directory)",
            )
        return w

    def sync(self) -> None:
        """Make everything enqueued so far durable (msync) and visible now, any strategy."""
        self._active_writer().sync()

    # ------------------------------------------------------------------ retention

    def enforce_retention(self) -> list[int]:
        """Apply the retention policy now (it also runs at open and at every roll); return
        the base offsets of the segments deleted."""
        w = self._active_writer()
        with owned(w.fa), w.locked():
            self._check_open()
            assert self._retention is not None
            return self._retention.apply(w.base)

    def delete_before(self, offset: int) -> list[int]:
        """Delete the sealed segments whose messages all lie below ``offset`` (for a layer
        that keeps what it needs elsewhere, such as a snapshot); return their base
        offsets. The segment being written is kept. A group whose cursor lies in a deleted
        segment then meets ``DataLossError`` (see ``on_data_loss``)."""
        offset = check_int(offset, "offset", 0, MAX_OFFSET)
        w = self._active_writer()
        with owned(w.fa), w.locked():
            self._check_open()
            assert self._retention is not None
            return self._retention.delete_before(offset, w.base)

    # ------------------------------------------------------------------ reading

    def wait(self, after: int, timeout: float | None) -> int:
        """Wait, asleep until the writer publishes (futex), up to ``timeout`` seconds (None:
        no limit) for the visible end to pass ``after``; return the visible end. For readers
        without a group, such as a tail that calls ``read_columnar(after)`` again when this
        is larger."""
        self._check_open()
        after = check_int(after, "after", -1, MAX_OFFSET)
        deadline = time.monotonic() + check_timeout(timeout)
        while True:
            self._check_open()  # closed by another thread meanwhile
            end = self._log.visible_end()
            left = deadline - time.monotonic()
            if end > after or left <= 0:
                return end
            self._log.wait(end, left)

    @property
    def end(self) -> int:
        """The visible end of the log: readers see every message below this offset."""
        self._check_open()
        return self._log.visible_end()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"queue {self._path} is closed", path=self._path)

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
        self._check_open()
        return ConsumerGroup(
            self._log, name, cursor_fsync=cursor_fsync, on_data_loss=on_data_loss,
            registry=self._groups, parent=self,
        )

    def read_columnar(self, offset: int, max_messages: int = 65536) -> ColumnarBatch:
        """Read up to ``max_messages`` (1 .. ``MAX_BATCH``) frames from ``offset`` (a frame
        boundary) in one scan.

        Returns global offsets and payload positions/lengths into one read-only view (a single
        segment), without a Python object per message. No consumer group is involved.
        """
        self._check_open()
        return self._bulk.read(offset, max_messages)

    # ------------------------------------------------------------------ introspection

    def earliest(self) -> int:
        """The first offset still in the log (the base of the oldest segment)."""
        self._check_open()
        bases = list_segments(self._path)
        return bases[0] if bases else 0

    def count_messages(self, start: int, end: int) -> int | None:
        """How many frames lie in [start, end) (``start`` a frame boundary), by a CRC-checked
        scan; None if that range is unreadable (deleted, corrupt)."""
        self._check_open()
        return count_frames(self._log, start, end)

    def stats(self) -> QueueStats:
        """A snapshot of the queue: offsets, segments, every group's cursor and lag, syncs,
        recovery events and retention. Reads the directory; takes no lock; works on a
        ``readonly`` queue too."""
        self._check_open()
        path, opts = self._path, self._opts
        segs = list_segment_infos(path)
        end = self._log.visible_end()
        earliest = segs[0].base if segs else 0
        groups = []
        locks = LockTable()
        for name, committed in read_cursors(path):
            lag = max(0, end - committed)
            msgs = None if committed < earliest else lag_messages(self._log, committed, end)
            groups.append(GroupInfo(name, committed, lag, msgs, group_owned(path, name, locks)))
        w = self._writer.c if self._writer is not None else None
        ret = self._retention
        pids = shared_pids(path)
        return QueueStats(
            path=str(path),
            readonly=opts.readonly,
            writer_active=not opts.readonly or locks.locked(path / WRITER_LOCK) or bool(pids),
            fsync=None if opts.readonly else opts.fsync.value,
            segment_size=None if opts.readonly else opts.segment_size,
            earliest_offset=earliest,
            next_offset=end,
            segment_count=len(segs),
            segment_bytes=sum(sg.size for sg in segs),
            disk_bytes=disk_bytes(path),
            segments=tuple(segs),
            groups=tuple(groups),
            log_syncs=int(w.nsyncs) if w is not None else None,
            log_sync=SyncLatency.from_writer(w) if w is not None else None,
            recovery_events=tuple(self._events),
            retention=opts.retention,
            retention_deleted_segments=ret.deleted_segments if ret is not None else 0,
            retention_deleted_bytes=ret.deleted_bytes if ret is not None else 0,
            writer_pids=pids,
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the open groups, make everything durable, release files. Idempotent."""
        if self._closed:
            return
        # Another thread inside enqueue or poll: refuse (ConcurrentUseError) before anything
        # is released under it; owned until closed, so that none enters meanwhile.
        with self._groups.owned(), owned(self._fa):
            self._close()

    def _close(self) -> None:
        self._closed = True
        first_error: BaseException | None = self._groups.close_all()
        self._bulk.close()
        w = self._writer
        err = 0
        if w is not None:
            try:
                w.check_segment()
            except (StorageError, LockFileLostError) as exc:
                first_error = first_error or exc
            err = self._log.close()  # the background flush's last pass, and its errors
            err = w.close() or err
        else:
            self._log.close()
        removed = (
            self._remove_drained(w.end())
            if self._opts.remove_when_empty and w is not None and not err and first_error is None
            else False
        )
        self._finalizer()
        if removed:
            with contextlib.suppress(OSError):
                os.rmdir(self._path)
        if first_error is not None:
            raise first_error
        if err:
            raise StorageError(
                f"final msync of {self._path} failed: {os.strerror(err)}", errno_=err,
                path=self._path, hint="recently enqueued messages may not be durable",
            )

    def _remove_drained(self, end: int) -> bool:
        """``remove_when_empty``: delete the queue's files if every group has committed
        ``end`` (shared writers: the last one to close, under the join lock)."""
        sw = self._r.shared
        with sw.joining() if sw is not None else contextlib.nullcontext():
            if sw is not None and not sw.last():
                return False
            held = lock_drained(self._path, end)
            if held is None:
                return False
            try:
                remove_queue_files(self._path)
            finally:
                for fd in held:
                    os.close(fd)
        return True

    def __repr__(self) -> str:
        opts = self._opts
        state = "closed" if self._closed else ("readonly" if opts.readonly else opts.fsync.value)
        return f"<k7core.Queue {str(self._path)!r} {state}>"
