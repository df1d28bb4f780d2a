"""A queue's options: checked once at open, immutable after (the C writer keeps a copy)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._checks import check_int, check_seconds
from ._errors import MessageTooLargeError
from ._format import (
    DEFAULT_SEGMENT_SIZE,
    FRAME_ALIGN,
    FRAME_HEADER,
    MAX_PAYLOAD,
    MAX_SEGMENT_SIZE,
    WRITERS,
    Fsync,
    frame_size,
    parse_fsync,
)
from ._storage import FILE_MODE

RETENTION_POLICIES = ("none", "consumed")
#: Seconds a shared writer waits for a lock another process holds (docs/concurrency.md).
DEFAULT_LOCK_TIMEOUT = 30.0
MAX_LOCK_TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Everything ``Queue(...)`` takes besides the path, validated. See :class:`Queue`."""

    segment_size: int = DEFAULT_SEGMENT_SIZE
    fsync: Fsync = Fsync.ASYNC
    commit_interval: float = 50e-6
    readonly: bool = False
    retention: str = "none"
    retention_bytes: int | None = None
    retention_age: float | None = None
    remove_when_empty: bool = False
    file_mode: int = FILE_MODE
    writers: str = "exclusive"
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT

    @classmethod
    def checked(
        cls,
        *,
        segment_size: object = DEFAULT_SEGMENT_SIZE,
        fsync: str | Fsync = Fsync.ASYNC,
        commit_interval: object = 50e-6,
        readonly: object = False,
        retention: object = "none",
        retention_bytes: object = None,
        retention_age: object = None,
        remove_when_empty: object = False,
        file_mode: object = FILE_MODE,
        writers: object = "exclusive",
        lock_timeout: object = DEFAULT_LOCK_TIMEOUT,
    ) -> QueueOptions:
        """The options a caller passed, each checked (``TypeError``/``ValueError`` naming it)."""
        size = check_int(segment_size, "segment_size", 64)
        if size % FRAME_ALIGN:
            raise ValueError(
                f"segment_size must be a multiple of {FRAME_ALIGN}, not {segment_size!r}"
            )
        if size > MAX_SEGMENT_SIZE:
            raise ValueError(
                f"segment_size must be at most {MAX_SEGMENT_SIZE} (2 GiB - 8), not "
                f"{segment_size}: k7 on the JVM maps a segment as one buffer of at most "
                "2^31-1 bytes, and each segment is preallocated on disk at this size"
            )
        if retention not in RETENTION_POLICIES:
            raise ValueError(f"retention must be 'none' or 'consumed', not {retention!r}")
        mode = check_int(file_mode, "file_mode", 0)
        if mode > 0o777 or mode & 0o600 != 0o600:
            raise ValueError(
                f"file_mode must give the owner read and write (0o600 .. 0o777), not {file_mode!r}"
            )
        if writers not in WRITERS:
            raise ValueError(f"writers must be 'exclusive' or 'shared', not {writers!r}")
        if writers == "shared" and readonly:
            raise ValueError("writers='shared' is for writers; a readonly queue does not write")
        return cls(
            segment_size=size,
            fsync=parse_fsync(fsync, "fsync"),
            commit_interval=check_seconds(commit_interval, "commit_interval", 10),
            readonly=bool(readonly),
            retention=str(retention),
            retention_bytes=(
                None if retention_bytes is None
                else check_int(retention_bytes, "retention_bytes", 0)
            ),
            retention_age=(
                None if retention_age is None else check_seconds(retention_age, "retention_age")
            ),
            remove_when_empty=bool(remove_when_empty),
            file_mode=mode,
            writers=str(writers),
            lock_timeout=check_seconds(lock_timeout, "lock_timeout", MAX_LOCK_TIMEOUT,
                                       positive=True),
        )

    @property
    def durable(self) -> bool:
        """Whether files are fsynced when created, renamed or deleted (not under ``"flush"``)."""
        return self.fsync is not Fsync.FLUSH

    @property
    def trims(self) -> bool:
        """Whether any retention policy is set."""
        return (
            self.retention != "none"
            or self.retention_bytes is not None
            or self.retention_age is not None
        )

    @property
    def max_message_size(self) -> int:
        """The largest message, in bytes, that fits a segment (frames are aligned)."""
        return min(MAX_PAYLOAD, self.segment_size // FRAME_ALIGN * FRAME_ALIGN - FRAME_HEADER)

    def check_message_size(self, n: int, path: Path | str | os.PathLike[str]) -> None:
        """Raise ``MessageTooLargeError`` if a message of ``n`` bytes cannot fit a segment."""
        if n > MAX_PAYLOAD or frame_size(n) > self.segment_size:
            raise MessageTooLargeError(
                f"a message of {n} bytes does not fit in a segment of {self.segment_size} "
                f"bytes (frame header {FRAME_HEADER} bytes, {FRAME_ALIGN}-byte aligned)",
                path=Path(path),
                hint="raise segment_size or split the message",
            )
