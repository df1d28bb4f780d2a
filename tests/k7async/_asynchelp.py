"""Helpers shared by the k7async tests."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

import k7core


class GatedQueue(k7core.Queue):
    """A queue whose next ``enqueue_many`` (on the writer thread) stops half-way, on demand.

    ``arm()`` (in the event loop) closes the gate; the writer thread that reaches it sets
    ``entered`` in the loop and waits until ``release()``. Lets a test act while the writer
    is known to be mid-batch, without sleeping.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = threading.Event()
        self._gate.set()
        self.entered = anyio.Event()
        self._token: anyio.lowlevel.EventLoopToken | None = None

    def arm(self) -> None:
        self.entered = anyio.Event()
        self._token = anyio.lowlevel.current_token()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def enqueue_many(self, items: Any) -> list[int]:
        if not self._gate.is_set():
            assert self._token is not None
            anyio.from_thread.run_sync(self.entered.set, token=self._token)
            if not self._gate.wait(30):
                raise RuntimeError("gate never released")
        return super().enqueue_many(items)


def k7async_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("k7async")]
