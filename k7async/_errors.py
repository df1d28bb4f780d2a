"""Errors k7async adds to the k7core tree."""

from __future__ import annotations

from k7core import LockedError


class SinkBusyError(LockedError):
    """A second :func:`k7async.sink` was started on a queue that already has one running."""
