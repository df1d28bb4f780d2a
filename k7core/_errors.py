"""Exceptions: one base class, specific subclasses that say who broke what and what to do."""

from __future__ import annotations

import os
from typing import Any


class K7Error(Exception):
    """Base class of every error raised by k7core.

    ``path`` names the file or directory involved, ``offset`` the global offset where one
    applies, ``hint`` what to do about it. ``written``: the offsets of the messages of a
    batch call (``enqueue_many``, ``enqueue_columnar``) written before it failed, in order
    (a batch that spans segments is written up to the roll that failed); retry only the
    others.
    """

    written: tuple[int, ...] = ()

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset
        self.hint = hint
        text = message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class LockedError(K7Error):
    """Another owner (this process or another) holds a lock this call needs: the queue's
    writer lock (:class:`QueueLockedError`), a consumer group's (:class:`GroupBusyError`),
    a queue's sink (``k7async.SinkBusyError``). Retry later, or close the other owner."""


class IntegrityError(K7Error):
    """What the queue directory holds cannot be read as asked: a corrupt frame
    (:class:`CorruptFrameError`), a cursor no reader can start at (:class:`CursorError`),
    offsets deleted before they were read (:class:`DataLossError`). ``offset`` says where."""


class QueueLockedError(LockedError):
    """Another writer (this process or another) holds the queue's writer lock."""


class LockFileLostError(QueueLockedError):
    """A lock file of the queue (``k7py-writer.lock``, ``k7py-writers``) was deleted or
    replaced while writers held it, so another writer could take the queue as free and hand
    out the same offsets. The writer that finds it stops writing (at a roll, ``sync()``,
    ``close()``, or when joining shared writers). Close every writer of the queue, then open
    them again; never delete ``k7py-*`` files of an open queue."""


class GroupBusyError(LockedError):
    """Another owner (this process or another) holds the consumer group's lock."""


class LockTimeoutError(LockedError):
    """Another process held a lock this call waits for (the shared writers' lock of
    appends) for longer than the queue's ``lock_timeout``: it is stopped (SIGSTOP, a
    debugger) or stuck, not dead (a dead holder's lock passes on at once). Nothing of the
    call was written. ``pid`` is the holder's process id (0 when unknown)."""

    def __init__(self, message: str, *, pid: int, **where: Any) -> None:
        super().__init__(message, **where)  # path, hint
        self.pid = pid


class ConcurrentUseError(K7Error, RuntimeError):
    """A queue's writer (``enqueue``...) or a consumer group was used from a second thread
    while another thread was inside a call on it. Use each from one thread at a time."""


class ClosedError(K7Error):
    """The queue or consumer group was closed; it cannot be used any more."""


class ReadOnlyError(K7Error):
    """A write was attempted on a queue opened with ``readonly=True``."""


class CorruptFrameError(IntegrityError):
    """A frame failed validation (magic, flags, length or CRC32C) below the visible end.

    ``offset`` is the global offset of the bad frame; ``seek`` past it to continue.
    """


class DataLossError(IntegrityError):
    """The offset to read was deleted by retention (it lies before the earliest segment).

    ``offset`` is the position that was asked for; ``earliest`` the first offset still in
    the log. ``seek(earliest)`` to continue, or open the group with
    ``on_data_loss="earliest"`` to jump there automatically.
    """

    def __init__(
        self,
        message: str,
        *,
        earliest: int,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, path=path, offset=offset, hint=hint)
        self.earliest = earliest


class CursorError(IntegrityError, ValueError):
    """An offset a consumer group cannot read from: negative, beyond the end of the log,
    inside a frame, or past damage where no valid frame starts. Raised by ``seek`` for such
    an offset; and by ``poll`` when the group's stored cursor is one (a damaged or foreign
    cursor file, or a cursor synced while the log's tail was lost), until ``seek``
    repositions the group.

    ``offset`` is the offset, ``end`` the log's end, ``boundary`` the next offset a reader
    may start at when ``offset`` is inside the log (else None).
    """

    def __init__(
        self,
        message: str,
        *,
        end: int,
        boundary: int | None = None,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, path=path, offset=offset, hint=hint)
        self.end = end
        self.boundary = boundary


class MessageTooLargeError(K7Error, ValueError):
    """The message cannot fit in an empty segment (or exceeds the 2 GiB frame limit)."""


class InvalidNameError(K7Error, ValueError):
    """A consumer group name that could escape the directory or is unreasonable."""


class NotAQueueError(K7Error):
    """The path exists but is not a queue directory (or cannot be opened as one)."""


class StorageError(K7Error, OSError):
    """The operating system refused an I/O operation (disk full, EIO, permissions)."""

    def __init__(
        self,
        message: str,
        *,
        errno_: int = 0,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        K7Error.__init__(self, message, path=path, offset=offset, hint=hint)
        self.errno = errno_
        self.strerror = os.strerror(errno_) if errno_ else message
        self.filename = self.path

    def __str__(self) -> str:
        # OSError's own str() would show only "[Errno N] strerror: 'path'": keep the
        # message and the hint.
        return str(self.args[0]) if self.args else super().__str__()


class MissingExtraError(ModuleNotFoundError):
    """An optional part of k7core was imported without the pip extra that installs what it
    needs (``k7core.spark``: ``spark``, ``k7core.metrics``: ``metrics``, the CLI: ``cli``)."""

    def __init__(self, what: str, extra: str, cause: ImportError) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra ({cause}): pip install 'k7py[{extra}]'",
            name=cause.name,
        )
        self.extra = extra
