"""Consumer groups: a crash-safe cursor, in-flight tracking, ack / nack / seek."""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

from ._checks import check_count, check_timeout
from ._errors import (
    ClosedError,
    ConcurrentUseError,
    CorruptFrameError,
    DataLossError,
    GroupBusyError,
    K7Error,
    StorageError,
)
from ._flusher import FlushSlot
from ._format import (
    CURSOR_FILE_SIZE,
    CURSOR_SIZE,
    Fsync,
    check_group_name,
    cursor_name,
    encode_cursor,
    parse_fsync,
)
from ._kernel import SCAN_CORRUPT, address, ffi, lib, owned
from ._log import LogView
from ._native._fast import Fetcher, message_offset
from ._offsets import check_cursor as check_cursor
from ._offsets import check_offset as check_offset
from ._reader import Reader, lag_messages
from ._resource import Resource
from ._stats import GroupStats
from ._storage import (
    Mapping,
    fsync_dir,
    fsync_file,
    held_by,
    list_segments,
    open_fd,
    preallocate,
    try_lock,
)

log = logging.getLogger("k7core")


class _GroupResources:
    """OS resources of a group, released once: by close() or when the group is collected
    (so a dropped group frees its lock, and the flusher never sees a freed cursor)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map: Mapping | None = None
        self.c: Any = None
        self.flusher: FlushSlot | None = None
        self.reader: Reader | None = None

    def release(self) -> None:
        if self.flusher is not None:
            self.flusher.remove_cursor(self.c)
            self.flusher = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Message(tuple[int, memoryview]):
    """A delivered message: ``offset`` (global, int) and ``payload`` (read-only memoryview).

    The payload is a zero-copy view into the segment's memory map. It stays valid for as
    long as you hold it, even after the group or queue is closed: the map is released when
    the last view is. Copy it with ``bytes(msg.payload)`` to keep the data independently.
    """

    __slots__ = ()

    offset = property(itemgetter(0), doc="Global offset of the message.")
    payload = property(itemgetter(1), doc="Read-only zero-copy view of the payload.")

    def __repr__(self) -> str:
        return f"Message(offset={self[0]}, payload=<{len(self[1])} bytes>)"


_new_message = tuple.__new__


class ConsumerGroup(Resource):
    """An independent reader of a queue with its own committed cursor (at-least-once).

    Use it from one thread at a time. ``poll`` delivers messages and marks them in flight;
    ``ack`` commits the contiguous frontier (lowest offset still in flight, or the read
    position when none is); ``nack`` redelivers one message first on a later poll;
    ``seek`` repositions and persists the cursor.

    An open group keeps its queue (``parent``) alive: a queue dropped while one of its groups
    is open stays open until the group is closed or dropped. ``Queue.close()`` closes its
    groups first; they raise ``ClosedError`` afterwards.
    """

    def __init__(
        self,
        log: LogView,
        name: str,
        *,
        cursor_fsync: str | Fsync = Fsync.ASYNC,
        on_data_loss: str = "raise",
        registry: OpenGroups | None = None,
        parent: object = None,
    ) -> None:
        self._closed = True
        self._closing = False  # the queue's close owns the group (OpenGroups.owned)
        self._parent = parent  # kept alive while the group is: its flusher, lock and log
        if on_data_loss not in ("raise", "earliest"):
            raise ValueError(f"on_data_loss must be 'raise' or 'earliest', not {on_data_loss!r}")
        self.on_data_loss = on_data_loss
        self._jumps = 0
        self._skipped = 0
        self.name = check_group_name(name)
        self._log = log
        self._registry = registry
        self.cursor_fsync = parse_fsync(cursor_fsync, "cursor_fsync")
        self.path = log.path / cursor_name(name)
        res = self._res = _GroupResources(
            open_fd(self.path, os.O_RDWR | os.O_CREAT, log.options.file_mode)
        )
        self._finalizer = weakref.finalize(self, res.release)
        try:
            if not try_lock(res.fd):
                raise GroupBusyError(
                    f"consumer group {name!r} of {log.path} is owned by another consumer "
                    f"({held_by(self.path)})",
                    path=self.path, hint="close the other owner first (one owner per group)",
                )
            created = os.fstat(res.fd).st_size < CURSOR_FILE_SIZE
            if created:
                try:  # real blocks: a full disk fails here, not with SIGBUS at the first ack
                    preallocate(res.fd, CURSOR_FILE_SIZE, self.path)
                    if self.cursor_fsync is not Fsync.FLUSH:
                        fsync_file(res.fd, self.path)
                        fsync_dir(log.path)
                except StorageError:
                    with contextlib.suppress(OSError):
                        os.unlink(self.path)  # no empty cursor left to hold up retention
                    raise
            st = os.fstat(res.fd)
            self._file_id = (st.st_dev, st.st_ino)
            res.map = Mapping(res.fd, CURSOR_FILE_SIZE, writable=True)
            c = self._c = res.c = ffi.new("k7_cursor *")
            self._dummy = ffi.new(f"uint8_t[{CURSOR_SIZE}]")
            c.map = res.map.ptr
            c.mode = self.cursor_fsync.code
            if self.cursor_fsync is Fsync.ASYNC:
                fl = log.flush_slot()
                c.bell = fl.bell
                fl.add_cursor(c)
                res.flusher = fl
            committed = int(lib.k7_cursor_load(c))
            if created and committed == 0:
                bases = list_segments(log.path)
                if bases and bases[0] > 0:  # retention deleted the start: begin at the earliest
                    committed = bases[0]
                    lib.k7_cursor_store(c, committed)
            # The C reader and the arrays it points to (its Reader) are the group's for its
            # whole life, closed or not: the fetcher reads through them (py-lmdb's rule).
            self._reader: Reader = Reader(log)
            res.reader = self._reader
            self._reader.c.pos = committed
            f = lib.k7_inflight_new(self._reader.c, c, committed)
            if f == ffi.NULL:
                raise MemoryError("cannot allocate the in-flight table")
            self._f: Any = ffi.gc(f, lib.k7_inflight_free)
            self._rc = self._reader.c  # k7_inflight points at it too
            self._fetch = Fetcher(address(self._rc), address(self._f), Message)
            self._reader.fetcher = self._fetch
            self._cap = int(self._rc.capacity)  # poll's fast path takes up to this; 0 when closed
            self._bad_cursor = check_cursor(
                log.path, name, committed, log.readable_end()
            )
            if self._bad_cursor is not None:
                self._cap = 0  # poll takes the slow path, which raises it until a seek
        except BaseException:
            self._finalizer()
            raise
        self._redeliver: list[int] = []  # nacked offsets, ascending; still in flight
        self._closed = False
        if registry is not None:
            try:
                registry.add(self)  # ClosedError if the queue closed meanwhile
            except BaseException:
                self._closed = True
                self._finalizer()
                raise

    # ------------------------------------------------------------------ reading

    def poll(self, max_batch: int = 256, timeout: float | None = 0.001) -> list[Message]:
        """Return up to ``max_batch`` (1 .. ``MAX_BATCH``) messages at once if any are
        visible; otherwise wait up to ``timeout`` seconds (asleep, woken by the writer; None
        or ``math.inf``: until a message arrives) for the first one."""
        try:
            if max_batch <= self._cap and not self._redeliver and max_batch > 0:
                msgs: list[Message] = self._fetch.read(max_batch, timeout)  # checks both
                if len(msgs) == max_batch:
                    return msgs
                if msgs:
                    return self._read_on(msgs, max_batch)
        except (TypeError, ConcurrentUseError):
            pass  # a wrong argument type, another thread inside: the slow path says which
        return self._poll_slow(max_batch, timeout)

    def _poll_slow(self, max_batch: int, timeout: float | None) -> list[Message]:
        max_batch = check_count(max_batch, "max_batch")
        seconds = check_timeout(timeout)
        with self._owned():
            if self._closed:
                self._raise_closed()
            if self._bad_cursor is not None:
                raise self._bad_cursor
            if self._redeliver:
                out = self._take_redeliveries(max_batch)
                if len(out) == max_batch:
                    return out
                return out + self._read(max_batch - len(out))
            msgs = self._read(max_batch)
            if msgs or seconds == 0:
                return msgs
            lg = self._log
            deadline = time.monotonic() + seconds
            while True:
                end = lg.visible_end()
                if end > self._rc.pos:
                    msgs = self._read(max_batch)
                    if msgs:
                        return msgs
                left = deadline - time.monotonic()
                if left <= 0:
                    return msgs
                lg.wait(end, left)

    def _read(self, max_batch: int) -> list[Message]:
        for _ in range(8):  # retention may delete again while we jump
            try:
                return self._read_raw(max_batch)
            except DataLossError as exc:
                if self.on_data_loss != "earliest":
                    raise
                self._jumps += 1
                self._skipped += max(0, exc.earliest - (exc.offset or 0))
                self.seek(exc.earliest)
        return self._read_raw(max_batch)

    def _read_raw(self, max_batch: int) -> list[Message]:
        msgs = self._read_segment(max_batch)
        return self._read_on(msgs, max_batch) if 0 < len(msgs) < max_batch else msgs

    def _read_segment(self, max_batch: int) -> list[Message]:
        """Up to ``max_batch`` messages of one segment (crossing into the next when the
        current one has none left)."""
        rd = self._reader
        if max_batch > self._cap:
            rd.ensure_capacity(max_batch)
            self._cap = int(rd.c.capacity)
        msgs: list[Message] = self._fetch.read(max_batch)
        if not msgs:
            n = rd.advance(max_batch)
            if not n:
                return []
            msgs = self._fetch.collect(n)
        return msgs

    def _read_on(self, msgs: list[Message], max_batch: int) -> list[Message]:
        """A short batch continues in the next segments while data is visible beyond it
        (a loop: a batch may span any number of small segments)."""
        c = self._rc
        while len(msgs) < max_batch and c.status != SCAN_CORRUPT and c.pos < c.end:
            try:  # deliver what was read; the next poll reports the loss or the damage
                more = self._read_segment(max_batch - len(msgs))
            except (DataLossError, CorruptFrameError, StorageError):
                break
            if not more:
                break
            msgs += more
        return msgs

    def _take_redeliveries(self, max_batch: int) -> list[Message]:
        take, self._redeliver = self._redeliver[:max_batch], self._redeliver[max_batch:]
        rd = self._reader
        out = []
        for off in take:
            payload = rd.payload_at(off)
            if payload is not None:
                out.append(_new_message(Message, (off, payload)))
        return out

    # ------------------------------------------------------------------ acknowledging

    def ack(self, msg: Message | int) -> bool:
        """Mark a delivered message done; False if it was not in flight (already acked...)."""
        try:
            rc = self._fetch.ack(msg)
        except ConcurrentUseError as exc:
            raise self._busy(exc) from None
        if rc == 1:
            if self._redeliver:
                self._forget_redeliveries([msg])
            return True
        if self._closed:
            self._raise_closed()
        if rc < 0:
            self._raise_store(-rc)
        return False

    def ack_many(self, msgs: Iterable[Message | int]) -> int:
        """Ack several messages with one kernel call and one cursor store; returns how many
        were in flight."""
        if self._redeliver and not isinstance(msgs, (list, tuple)):
            msgs = list(msgs)
        try:
            rc = self._fetch.ack_many(msgs)
        except ConcurrentUseError as exc:
            raise self._busy(exc) from None
        if self._closed:
            self._raise_closed()
        if rc < 0:
            self._raise_store(-rc)
        if self._redeliver:
            self._forget_redeliveries(msgs)
        return rc

    def _forget_redeliveries(self, msgs: Iterable[Message | int]) -> None:
        acked = {m if type(m) is int else m[0] for m in msgs}  # type: ignore[index]
        self._redeliver = [o for o in self._redeliver if o not in acked]

    def nack(self, msg: Message | int) -> bool:
        """Redeliver this message (first) on a later poll, without the messages after it."""
        with self._owned():
            off = message_offset(msg)  # as ack reads it: -1 for an int beyond int64
            if not lib.k7_inflight_has(self._f, off):
                if self._closed:
                    self._raise_closed()
                return False
            i = bisect.bisect_left(self._redeliver, off)
            if i == len(self._redeliver) or self._redeliver[i] != off:
                self._redeliver.insert(i, off)
            return True

    def seek(self, offset: int) -> None:
        """Reposition to ``offset`` and persist it: a frame boundary up to the end of the
        log (``queue.end``), past damage the start of a valid frame (``CursorError``
        otherwise, naming the nearest ones), or an offset before the earliest segment (0
        replays everything; deleted data is then reported by ``poll`` per
        ``on_data_loss``).

        Messages in flight are forgotten: they are not redelivered unless the new position is
        before them."""
        with self._owned():
            if self._closed:
                self._raise_closed()
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise TypeError(f"offset must be an int, not {type(offset).__name__}")
            lg = self._log
            err = check_offset(
                lg.path, offset, lg.readable_end(), said=f"cannot seek group {self.name!r} to",
                path=self.path,
            )
            if err is not None:
                raise err
            self._redeliver.clear()
            self._reader.close()  # the next read maps the segment that holds ``offset``
            rc = lib.k7_reset(self._f, offset)
            if rc:
                self._raise_store(rc)
            if self._bad_cursor is not None:
                self._bad_cursor = None
                self._cap = int(self._rc.capacity)

    def _raise_store(self, err: int) -> None:
        raise StorageError(
            f"cursor msync of {self.path} failed: {os.strerror(err)}", errno_=err,
            path=self.path, hint="the acknowledgement is not durable",
        )

    # ------------------------------------------------------------------ state

    @property
    def committed(self) -> int:
        """The committed offset (next to deliver after a restart), as stored in the cursor."""
        return int(lib.k7_committed(self._f))

    @property
    def position(self) -> int:
        """The next offset ``poll`` reads (after redeliveries)."""
        if self._closed:
            self._raise_closed()
        return int(self._reader.c.pos)

    @property
    def lag(self) -> int:
        """Bytes of log between the committed cursor and the visible end."""
        if self._closed:
            self._raise_closed()
        return max(0, self._log.visible_end() - int(lib.k7_committed(self._f)))

    def stats(self) -> GroupStats:
        """A snapshot of this group: committed, position, in flight, lag (bytes, and
        messages when the lag is at most ``LAG_COUNT_LIMIT`` bytes), data-loss jumps."""
        if self._closed:
            self._raise_closed()
        lg = self._log
        end = lg.visible_end()
        committed = self.committed
        bases = list_segments(lg.path)
        earliest = bases[0] if bases else 0
        lag_msgs = None if committed < earliest else lag_messages(lg, committed, end)
        return GroupStats(
            name=self.name,
            committed=committed,
            position=self.position,
            in_flight=self.in_flight,
            next_offset=end,
            earliest_offset=earliest,
            lag_bytes=max(0, end - committed),
            unread_bytes=max(0, end - self.position),
            lag_messages=lag_msgs,
            cursor_fsync=self.cursor_fsync.value,
            data_loss_jumps=self._jumps,
            skipped_bytes=self._skipped,
        )

    @property
    def queue_path(self) -> Path:
        """The directory of the group's queue."""
        return self._log.path

    @property
    def in_flight(self) -> int:
        """How many delivered messages are not yet acked."""
        return int(lib.k7_inflight_count(self._f))

    @property
    def closed(self) -> bool:
        return self._closed

    def _raise_closed(self) -> None:
        raise ClosedError(f"consumer group {self.name!r} is closed", path=self.path)

    def _busy(self, exc: ConcurrentUseError) -> K7Error:
        """``exc``, or ClosedError when the thread that owns the group is closing it."""
        if self._closing or self._closed:
            return ClosedError(f"consumer group {self.name!r} was closed with its queue",
                               path=self.path)
        return exc

    @contextlib.contextmanager
    def _owned(self) -> Iterator[None]:
        """``owned(self._fetch)``, but ClosedError when a close owns the group."""
        try:
            with owned(self._fetch):
                yield
        except ConcurrentUseError as exc:
            raise self._busy(exc) from None

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Final cursor msync, release the cursor file and its lock. Idempotent."""
        if self._closed:
            return
        with owned(self._fetch):
            self._closed = True
            self._cap = 0
            self._fetch.detach()  # the reader stays: a fetcher call may still hold its arrays
            err = lib.k7_msync(self._c.map, 0, CURSOR_SIZE)  # k7 flushes it on close, always
            committed = int(lib.k7_committed(self._f))
            self._finalizer()
            # The cursor file is unmapped: point the C cursor at private memory and forget what
            # was in flight, so a late ack/seek/nack touches nothing and reports ClosedError.
            self._c.map, self._c.mode = self._dummy, lib.K7_MODE_FLUSH
            lib.k7_reset(self._f, lib.k7_committed(self._f))
            if self._registry is not None:
                self._registry.discard(self)
            self._parent = None
            if err:
                raise StorageError(
                    f"final cursor msync of {self.path} failed: {os.strerror(err)}",
                    errno_=err, path=self.path,
                )
            self._check_file(committed)

    def _check_file(self, committed: int) -> None:
        """At close: if the cursor file was deleted or truncated underneath the group, write
        it again with the committed offset (so a restart does not replay the log); if another file
        took its place, leave that one and report that the offset was not saved."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        ours = st is not None and (st.st_dev, st.st_ino) == self._file_id
        if ours and st is not None and st.st_size >= CURSOR_FILE_SIZE:
            return
        if st is None or ours:  # deleted, or ours but shrunk: write it again
            try:
                flags = os.O_RDWR | os.O_CREAT | (0 if ours else os.O_EXCL)
                fd = open_fd(self.path, flags, self._log.options.file_mode)
            except StorageError as exc:
                if exc.errno != errno.EEXIST:
                    raise
            else:
                try:
                    preallocate(fd, CURSOR_FILE_SIZE, self.path)
                    os.pwrite(fd, encode_cursor(committed), 0)
                    if self.cursor_fsync is not Fsync.FLUSH:
                        fsync_file(fd, self.path)
                        fsync_dir(self._log.path)
                finally:
                    os.close(fd)
                log.warning("k7core: the cursor file %s was deleted or truncated while group "
                            "%r was open; wrote it again at offset %d",
                            self.path, self.name, committed)
                return
        raise StorageError(
            f"the cursor file {self.path} was replaced while group {self.name!r} was open: "
            f"its committed offset {committed} was not saved",
            errno_=errno.ESTALE, path=self.path, offset=committed,
            hint=f"the group restarts from the offset in the file now there; seek({committed}) "
            "to resume where this owner stopped",
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"committed={self.committed}"
        return f"<k7core.ConsumerGroup {self.name!r} {state}>"


class OpenGroups:
    """The open groups of one queue (held weakly), closed with it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._groups: weakref.WeakSet[ConsumerGroup] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def add(self, group: ConsumerGroup) -> None:
        """Register a group just opened; ClosedError if the queue was closed meanwhile (by
        another thread), which then closes nothing for it."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"queue {self._path} is closed", path=self._path)
            self._groups.add(group)

    def discard(self, group: ConsumerGroup) -> None:
        with self._lock:
            self._groups.discard(group)

    @contextlib.contextmanager
    def owned(self) -> Iterator[None]:
        """Own every open group for the block (the queue's close): ConcurrentUseError, and
        nothing owned, if another thread is inside a call on one of them; no other thread
        enters one meanwhile."""
        with contextlib.ExitStack() as stack:
            with self._lock:
                groups = list(self._groups)
            for g in groups:  # marked before owned: another thread's call raises ClosedError
                g._closing = True
                stack.callback(setattr, g, "_closing", False)
                stack.enter_context(owned(g._fetch))
            yield

    def close_all(self) -> K7Error | None:
        """Close every group, and refuse new ones; the first error met (each is closed
        regardless)."""
        with self._lock:
            self._closed = True
        first: K7Error | None = None
        for g in list(self._groups):
            try:
                g.close()
            except K7Error as exc:
                first = first or exc
        return first
