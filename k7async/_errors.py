"""Errors k7async adds to the k7core tree."""

from __future__ import annotations

from k7core import K7Error, LockedError


class SinkBusyError(LockedError):
    """A second :func:`k7async.sink` was started on a queue that already has one running."""


class AutoAckError(K7Error, RuntimeError):
    """``ack()`` / ``nack()`` on a stream opened with ``auto_ack=True``, which acks every
    message itself when it hands it over (also a ``RuntimeError``, as it was before)."""
