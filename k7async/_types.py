"""What k7async functions take: payloads, and a queue or anything that serves one."""

from __future__ import annotations

from typing import Protocol, TypeAlias, runtime_checkable

import k7core

Payload: TypeAlias = bytes | bytearray | memoryview
"""What a message can be made of (anything :meth:`k7core.Queue.enqueue` accepts)."""


@runtime_checkable
class ServesQueue(Protocol):
    """An object that serves a :class:`k7core.Queue` (:class:`k7async.AsyncQueue` does)."""

    @property
    def queue(self) -> k7core.Queue: ...


QueueSource: TypeAlias = k7core.Queue | ServesQueue
"""Where k7async functions write or read: a queue, or an object serving one."""


def core_queue(source: QueueSource) -> k7core.Queue:
    """The :class:`k7core.Queue` behind ``source``."""
    if isinstance(source, k7core.Queue):
        return source
    if isinstance(source, ServesQueue) and isinstance(source.queue, k7core.Queue):
        return source.queue
    raise TypeError(
        f"expected a k7core.Queue or a k7async.AsyncQueue, not {type(source).__name__}"
    )
