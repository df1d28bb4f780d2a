"""The errors the job store adds to the k7core tree."""

from __future__ import annotations

from .._errors import IntegrityError, K7Error


class JobNotFoundError(K7Error):
    """No live job has this id, or it is reserved by another owner (beanstalkd's
    ``NOT_FOUND``: only the owner of a reservation may delete, release, bury or touch it).
    ``job_id`` is the id asked for."""

    def __init__(self, message: str, *, job_id: int | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.job_id = job_id


class InvalidJobError(K7Error, ValueError):
    """An argument is out of beanstalkd's limits or of the wrong type: a tube name, a
    priority, a delay, a time-to-run, a key, an error text, a body. Nothing was stored."""


class DependencyError(InvalidJobError):
    """A ``depends_on`` entry names no live job (an id, or a ``(tube, key)`` pair). A
    deleted job counts as missing: the store keeps no record of finished jobs."""


class CorruptJobDataError(IntegrityError):
    """A journal record or a snapshot of the job store cannot be decoded: damaged, cut
    short, or written by a newer version. ``offset`` is where, when known."""


class JournalDamagedError(CorruptJobDataError):
    """The journal lost records that were written: it ends before the position a snapshot
    covers (its tail never reached the disk), or a damaged frame lies in the middle of its
    last segment with valid frames after it. Nothing was changed on disk. ``start`` and
    ``end`` are the journal offsets of the lost range; ``JobStore(path, repair=True)``
    keeps what can be read and moves the next id past ``end`` (see docs/jobs.md)."""

    def __init__(self, message: str, *, path: object, start: int, end: int,
                 hint: str | None = None) -> None:
        super().__init__(message, path=str(path), offset=start, hint=hint)
        self.start = start
        self.end = end


class NotAJobStoreError(K7Error):
    """The path is no job store's directory and cannot become one: a file, or a k7
    queue's directory (a job store keeps its journal queue in ``DIR/journal/``)."""
