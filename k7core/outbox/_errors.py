"""The outbox's errors: the state of an outbox that a relay will not act on until someone
decides (each message says what happened and the command that resolves it)."""

from __future__ import annotations

import os

from .._errors import K7Error, LockedError


class OutboxError(K7Error):
    """An outbox a relay refuses to relay: its ids went back (:class:`OutboxRewoundError`)
    or it feeds another store or server (:class:`OutboxTargetError`). Nothing was put or
    deleted; ``k7 outbox reset`` (``Outbox.reset``) is the way out once you know why."""


class OutboxRewoundError(OutboxError):
    """The outbox's row ids went back below what its store holds: the database was restored
    from a backup, the table made again by hand, or its sequence reset. A relay would skip
    (and delete) the new rows whose ids it has relayed before."""


class OutboxTargetError(OutboxError):
    """The outbox feeds another job store (or beanstalkd server) than this relay's: one
    outbox feeds one, or a row could be relayed into both."""


class OutboxBusyError(LockedError):
    """The outbox's database stayed locked by another connection past the relay's wait
    (SQLite: its ``busy_timeout``; PostgreSQL: its ``lock_timeout``): process ``pid`` (None
    when unknown) is in the middle of a transaction, or stopped (SIGSTOP, a debugger) or
    stuck there. Nothing was put; the relay's thread retries. Finish or end that
    transaction (resume or end the process)."""

    def __init__(self, message: str, *, pid: int | None,
                 path: str | os.PathLike[str] | None, hint: str) -> None:
        super().__init__(message, path=path, hint=hint)
        self.pid = pid
