"""The errors the topics add to the k7core tree."""

from __future__ import annotations

import os

from .._errors import IntegrityError, K7Error, LockedError


class TopicError(K7Error):
    """A topic's directory or metadata does not fit the call: a partition count or
    partitioner other than the topic was created with, a directory that is not a topic."""


class TopicDeletedError(TopicError):
    """The directory of a topic (or of one of its partitions, or of an exchange's bound
    queue) was deleted while it was open: a write would go into files nobody can open
    again. Nothing was written. Close it and open (or create) the topic again."""


class CorruptRecordError(IntegrityError):
    """A partition's payload is not a topic record envelope (written by a plain queue
    producer, or damaged). ``offset`` is where."""


class BackPressureError(K7Error):
    """``send`` found the watched group's lag above the high watermark and the caller chose
    not to wait (``on_high="raise"``), or waited ``timeout`` seconds without it falling to
    the low watermark. Nothing was written. ``lag`` is the lag seen, in the watermarks' unit."""

    def __init__(self, message: str, *, lag: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.lag = lag


class MemberBusyError(LockedError):
    """A live member of the consumer group already has this member id."""


class NotAssignedError(K7Error, ValueError):
    """The partition is not assigned to this member (now): seek or commit it from the member
    that owns it (``assignment`` says which partitions are this member's)."""


class TopicLockTimeoutError(LockedError):
    """A lock of the topics layer (a consumer group's, a topic's metadata, an exchange's
    bindings) stayed held past the wait's timeout: its holder, process ``pid`` (None when
    unknown), is stopped or stuck. Resume or end that process; its lock dies with it."""

    def __init__(
        self, message: str, *, pid: int | None, path: str | os.PathLike[str] | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, path=path, hint=hint)
        self.pid = pid
