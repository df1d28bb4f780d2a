"""The ``"async"`` strategy's background flush: one thread serves every queue of a process
that uses the same commit interval (64 partition queues cost one thread, not 64).

A queue takes a :class:`FlushSlot` (its writer and its async cursors, behind the slot's
own lock, which also keeps the queue's rolls apart from a flush pass). The first slot of an
interval starts a flusher thread; the last one to close stops and joins it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ._kernel import ffi, lib


class _Flusher:
    """One C flusher loop (``k7_flusher_run``, which never takes the GIL) and its thread."""

    def __init__(self, interval_ns: int) -> None:
        f = lib.k7_flusher_new(interval_ns)
        if f == ffi.NULL:
            raise MemoryError("cannot allocate the flusher")
        self.f: Any = ffi.gc(f, lib.k7_flusher_free)
        self.bell: Any = lib.k7_flusher_bell(self.f)
        self.slots = 0
        self._thread = threading.Thread(
            target=lib.k7_flusher_run, args=(self.f,),
            name=f"k7-flusher-{interval_ns / 1e3:g}us", daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        lib.k7_flusher_stop(self.f)
        self._thread.join()


class FlusherPool:
    """The process's flushers, one per commit interval, shared by reference count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flushers: dict[int, _Flusher] = {}
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the parent's flusher threads do not exist here."""
        self._lock = threading.Lock()
        self._flushers = {}

    def threads(self) -> int:
        """How many flusher threads run now."""
        with self._lock:
            return len(self._flushers)

    def attach(self, interval: float) -> FlushSlot:
        """A new slot served by the flusher of ``interval`` seconds (started if needed)."""
        key = max(0, round(interval * 1e9))
        with self._lock:
            fl = self._flushers.get(key)
            if fl is None:
                fl = self._flushers[key] = _Flusher(key)
            slot = FlushSlot(self, key, fl)
            fl.slots += 1
        return slot

    def _release(self, key: int, fl: _Flusher) -> None:
        with self._lock:
            fl.slots -= 1
            if fl.slots or self._flushers.get(key) is not fl:
                return
            del self._flushers[key]
            fl.stop()


FLUSHERS = FlusherPool()


class FlushSlot:
    """A queue's place in a flusher: its writer and async cursors, msynced in the
    background. ``lock`` keeps a roll (or a sync) apart from a flush pass."""

    def __init__(self, pool: FlusherPool, key: int, flusher: _Flusher) -> None:
        s = lib.k7_slot_new()
        if s == ffi.NULL:
            raise MemoryError("cannot allocate a flusher slot")
        self._s: Any = ffi.gc(s, lib.k7_slot_free)
        self._pool, self._key, self._flusher = pool, key, flusher
        self.bell: Any = flusher.bell
        self.lock = SlotLock(self._s)
        self._attached = False
        if lib.k7_flusher_attach(flusher.f, self._s):
            pool._release(key, flusher)
            raise MemoryError("cannot attach a queue to the flusher")
        self._attached = True

    @property
    def error(self) -> int:
        """The first errno a background pass met (0: none)."""
        return int(lib.k7_slot_error(self._s))

    def set_writer(self, w: Any) -> None:
        with self.lock:
            lib.k7_slot_set_writer(self._s, w)

    def add_cursor(self, c: Any) -> None:
        with self.lock:
            if lib.k7_slot_add_cursor(self._s, c):
                raise MemoryError("cannot register the cursor with the flusher")

    def remove_cursor(self, c: Any) -> None:
        with self.lock:
            lib.k7_slot_remove_cursor(self._s, c)

    def close(self) -> int:
        """Leave the flusher (no pass touches the slot after this), then sync what is left
        once; return the first errno met by any pass (0: none). Idempotent."""
        if self._attached:
            self._attached = False
            lib.k7_flusher_detach(self._flusher.f, self._s)
            with self.lock:
                lib.k7_slot_sync(self._s)
            self._pool._release(self._key, self._flusher)
        return self.error


class SlotLock:
    """Context manager over a slot's C mutex (recursive)."""

    __slots__ = ("_s",)

    def __init__(self, s: Any) -> None:
        self._s = s

    def __enter__(self) -> None:
        lib.k7_slot_lock(self._s)

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        lib.k7_slot_unlock(self._s)
