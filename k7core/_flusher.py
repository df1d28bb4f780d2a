"""The ``"async"`` strategy's background flush: one thread serves every queue of a process
that uses the same commit interval (64 partition queues cost one thread, not 64).

A queue takes a :class:`FlushSlot` (its writer and its async cursors, behind the slot's
own lock, which also keeps the queue's rolls apart from a flush pass). The first slot of an
interval starts a flusher thread; the last one to leave stops and joins it.

A slot leaves its flusher when it is closed or, at the latest, when it is collected: its C
memory is freed only after it is out of the flusher's list (a pass never sees a freed slot).
Leaving waits for a pass in progress, which may itself wait for a slot lock: a thread that
holds one (a queue collected by the GC during a roll) puts the leave off until it lets go.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ._kernel import ffi, lib


class _Held(threading.local):
    """Per thread: how many slot locks it holds, and the leaves put off until it holds none."""

    def __init__(self) -> None:
        self.locks = 0
        self.later: list[Callable[[], object]] = []


_held = _Held()


class _Flusher:
    """One C flusher loop (``k7_flusher_run``, which never takes the GIL) and its thread."""

    def __init__(self, interval_ns: int) -> None:
        f = lib.k7_flusher_new(interval_ns)
        if f == ffi.NULL:
            raise MemoryError("cannot allocate the flusher")
        self.f: Any = ffi.gc(f, lib.k7_flusher_free)
        self.bell: Any = lib.k7_flusher_bell(self.f)
        self.slots = 0
        self.pid = os.getpid()  # a forked child has the memory but not the thread
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
        # reentrant: a slot collected by the GC while this thread holds it leaves (_release)
        self._lock = threading.RLock()
        self._flushers: dict[int, _Flusher] = {}
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the parent's flusher threads do not exist here."""
        self._lock = threading.RLock()
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
            fl.slots += 1  # counted first: a slot collected meanwhile cannot stop this flusher
            try:
                return FlushSlot(self, key, fl)
            except BaseException:
                self._release(key, fl)
                raise

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
        """Attach a new slot to ``flusher`` (whose count already includes it: on failure the
        caller releases it)."""
        s = lib.k7_slot_new()
        if s == ffi.NULL:
            raise MemoryError("cannot allocate a flusher slot")
        # freed when the last reference goes (the SlotLock, a holder of ``lock``), which is
        # after ``_leave`` took it out of the flusher's list: ``_leave`` holds it until then
        self._s: Any = ffi.gc(s, lib.k7_slot_free)
        self.bell: Any = flusher.bell
        self.lock = SlotLock(self._s)
        if lib.k7_flusher_attach(flusher.f, self._s):
            raise MemoryError("cannot attach a queue to the flusher")
        self._leave = weakref.finalize(self, _leave, pool, key, flusher, self._s)

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
        if self._leave():  # the first close (a finalizer runs once)
            with self.lock:
                lib.k7_slot_sync(self._s)
        return self.error


def _leave(pool: FlusherPool, key: int, flusher: _Flusher, s: Any) -> bool:
    """Take slot ``s`` out of ``flusher``'s list (waits for a pass that is in it), then drop
    the slot's count on the flusher. Run once: by close() or when the slot is collected.

    While this thread holds a slot lock, the pass may be waiting for it with the list held:
    the slot is then synced and emptied now (what it points at may be freed next) and leaves
    when the thread lets go of its last slot lock."""
    if _held.locks:
        with SlotLock(s):
            lib.k7_slot_sync(s)
            lib.k7_slot_set_writer(s, ffi.NULL)
        _held.later.append(lambda: _leave(pool, key, flusher, s))
        return True
    if flusher.pid == os.getpid():  # in a forked child no pass runs (its lock may be stuck)
        lib.k7_flusher_detach(flusher.f, s)
    pool._release(key, flusher)
    return True


class SlotLock:
    """Context manager over a slot's C mutex (recursive)."""

    __slots__ = ("_s",)

    def __init__(self, s: Any) -> None:
        self._s = s

    def __enter__(self) -> None:
        lib.k7_slot_lock(self._s)
        _held.locks += 1

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        lib.k7_slot_unlock(self._s)
        held = _held
        held.locks -= 1
        while not held.locks and held.later:
            held.later.pop()()
