"""Errors k7async adds to the k7core tree."""

from __future__ import annotations

import anyio

from k7core import ClosedError, K7Error, LockedError


class SinkBusyError(LockedError):
    """A second :func:`k7async.sink` was started on a queue that already has one running."""


class AutoAckError(K7Error, RuntimeError):
    """``ack()`` / ``nack()`` on a stream opened with ``auto_ack=True``, which acks every
    message itself when it hands it over (also a ``RuntimeError``, as it was before)."""


class StreamClosedError(ClosedError, anyio.ClosedResourceError):
    """A producer channel's send stream or a :class:`~k7async.MessageStream` was used after it
    was closed. Both a :class:`k7core.ClosedError` (the k7 tree) and anyio's
    ``ClosedResourceError`` (what code written for anyio streams catches)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is closed", hint="open a new one")
