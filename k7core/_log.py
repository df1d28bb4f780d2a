"""The log as its readers see it: the visible end, waiting for more, the segment list.

A :class:`LogView` is what :class:`Reader` and :class:`ConsumerGroup` receive instead of the
``Queue``: it exposes what they may use and nothing of the writer's state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import ClosedError
from ._flusher import FLUSHERS, FlushSlot
from ._kernel import lib
from ._options import QueueOptions
from ._storage import list_segments

WAIT_SLICE = 3600.0  # seconds: the kernel's wait takes int64 nanoseconds


class LogView:
    """Read-only view of one queue's log, shared by the queue, its readers and its groups.

    ``pub`` is the C ``k7_pos`` the writer publishes the visible end to (a shared map, or
    private memory that is polled when the directory is read-only: ``polled``);
    ``floor_end`` is the end found at open when no writer holds the directory. It also
    holds the queue's place in the background flusher (``flush_slot``), taken on first
    use, which the writer's ``"async"`` strategy and the async cursors share.

    Lifetime: whatever points at ``pub`` (the writer, every reader and group) holds this
    view, and the view holds what ``pub`` lies in (``keep``: the position file's map), so
    ``pub`` stays mapped as long as any of them lives, even after the queue is closed.
    """

    def __init__(
        self, path: Path, options: QueueOptions, pub: Any, *, polled: bool, floor_end: int = 0,
        keep: object = None,
    ) -> None:
        self.path = path
        self.options = options
        self.pub = pub
        self.polled = polled
        self.floor_end = floor_end
        self._keep = keep
        self._bases: list[int] = []
        self._written: Callable[[], int] | None = None
        self._slot: FlushSlot | None = None
        self._slot_lock = threading.Lock()  # the first async groups may open in two threads
        self._closed = False

    # ------------------------------------------------------------------ the end

    def visible_end(self) -> int:
        """Readers see every frame below this offset."""
        end: int = lib.k7_load_end(self.pub)
        return end if end > self.floor_end else self.floor_end

    def readable_end(self) -> int:
        """Up to where a group may be positioned: the visible end, or with ``fsync="async"``
        what this process's writer has written (visible within ``commit_interval``)."""
        if self._written is None:
            return self.visible_end()
        return max(self._written(), self.visible_end())

    def set_written(self, written: Callable[[], int] | None) -> None:
        """Where the ``"async"`` writer of this process has written to (None: no such writer)."""
        self._written = written

    def wait(self, known_end: int, timeout: float) -> None:
        """Sleep until the writer publishes past ``known_end`` or for ``timeout`` seconds,
        at most ``WAIT_SLICE`` (callers loop until their deadline, which may be infinite)."""
        if self.polled:
            time.sleep(min(timeout, 0.001))
            return
        lib.k7_wait(self.pub, known_end, int(min(timeout, WAIT_SLICE) * 1e9))

    # ------------------------------------------------------------------ segments

    def segment_bases(self, refresh: bool = False) -> list[int]:
        """The base offsets of the segment files, ascending; listed again on ``refresh``
        (or while unknown). Callers must not modify the list."""
        if refresh or not self._bases:
            self._bases = list_segments(self.path)
        return self._bases

    def set_segment_bases(self, bases: list[int]) -> None:
        """What the writer knows the segments to be (after recovery, a roll, a deletion)."""
        self._bases = bases

    # ------------------------------------------------------------------ flushing

    def flush_slot(self) -> FlushSlot:
        """The queue's slot in the flusher of its ``commit_interval`` (taken now if needed;
        ``ClosedError`` once the queue is closed: a slot taken then would never be left)."""
        slot = self._slot
        if slot is not None:
            return slot
        with self._slot_lock:
            if self._slot is None:
                if self._closed:
                    raise ClosedError(f"queue {self.path} is closed", path=self.path)
                self._slot = FLUSHERS.attach(self.options.commit_interval)
            return self._slot

    @property
    def has_flush_slot(self) -> bool:
        return self._slot is not None

    def close(self) -> int:
        """Leave the flusher after a last pass; the first errno any pass met (0: none).
        The view stays readable (``pub`` mapped) for whoever still holds it."""
        with self._slot_lock:
            self._closed = True
            slot = self._slot
        return slot.close() if slot is not None else 0
