"""Reserves that wait for a job, in the event loop: by watched tube, oldest first, no thread
of their own. The job store's ready listener pokes them (from any thread) when jobs may be
ready: puts, releases, kicks, delays and TTRs falling due, pauses ending, owners closing."""

from __future__ import annotations

from typing import Protocol

from anyio.lowlevel import EventLoopToken

from k7core import ClosedError

from .._bridge import post
from ._session import Session


class Waiter(Protocol):
    """A waiting reserve: :meth:`Waiters.poke` sets ``answer`` (a RESERVED reply), then calls
    ``wake`` (in the event loop)."""

    session: Session
    answer: bytes | None

    def wake(self) -> None: ...


class Waiters:
    """Reserves waiting for a job, by watched tube, oldest first. :meth:`listener` is the
    store's ready listener (any thread): it schedules :meth:`poke` in the loop, once."""

    def __init__(self, token: EventLoopToken) -> None:
        self._token = token
        self._by_tube: dict[str, dict[Waiter, None]] = {}
        self.count = 0
        self._scheduled = False

    def listener(self) -> None:
        if self.count and not self._scheduled:
            self._scheduled = True
            post(self._token, self.poke)

    def add(self, waiter: Waiter) -> None:
        self.count += 1
        waiter.session.waiting = True
        for tube in waiter.session.watch:
            self._by_tube.setdefault(tube, {})[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        if not waiter.session.waiting:
            return
        self.count -= 1
        waiter.session.waiting = False
        for tube in waiter.session.watch:
            queue = self._by_tube.get(tube)
            if queue is not None:
                queue.pop(waiter, None)
                if not queue:
                    del self._by_tube[tube]

    def poke(self) -> None:
        """Jobs may be ready: give them to the waiting reserves, oldest waiter first."""
        self._scheduled = False
        for tube in list(self._by_tube):
            while (queue := self._by_tube.get(tube)):
                waiter = next(iter(queue))
                try:
                    answer = waiter.session.try_reserve()
                except ClosedError:
                    return  # the server is stopping
                if answer is None:
                    break  # nothing ready in this tube (nor in the waiter's others)
                self.remove(waiter)
                waiter.answer = answer
                waiter.wake()
