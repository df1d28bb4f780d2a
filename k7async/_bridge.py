"""Thread <-> event loop plumbing: the only place where k7async threads touch an event loop.

A thread never waits for a loop and a loop never blocks on a thread: a thread reports back by
scheduling a small synchronous callback in the loop (:func:`post`), and the async side awaits
an :class:`anyio.Event` that callback sets. :class:`Pace` is the per-message cancel and
schedule points of the streams.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def post(token: EventLoopToken, fn: Callable[[Unpack[Ts]], object], *args: *Ts) -> bool:
    """From any thread, schedule ``fn(*args)`` in the loop of ``token``; do not wait for it.

    ``fn`` runs as a plain callback, not as a task: cancel scopes cannot stop it. Uses the
    loop's own thread-safe scheduling (asyncio ``call_soon_threadsafe``, trio
    ``run_sync_soon``), else anyio's (which waits). Returns False when that loop has finished
    (nobody is left to tell).
    """
    native = token.native_token
    schedule = getattr(native, "call_soon_threadsafe", None) or getattr(
        native, "run_sync_soon", None
    )
    try:
        if schedule is None:
            anyio.from_thread.run_sync(fn, *args, token=token)
        else:
            schedule(fn, *args)
    except (anyio.RunFinishedError, RuntimeError):  # asyncio: the loop is closed
        return False
    except Exception as exc:  # trio.RunFinishedError (trio is optional here)
        if type(exc).__name__ == "RunFinishedError":
            return False
        raise
    return True


def current_loop() -> object:
    """The running event loop, as a hashable identity (much cheaper than
    ``anyio.lowlevel.current_token()``, which matters once per awaited message)."""
    loop = asyncio._get_running_loop()  # in asyncio.events.__all__: None, not an exception
    if loop is not None:
        return loop
    import trio  # not asyncio: anyio's other backend is trio

    return trio.lowlevel.current_trio_token()


async def run_in_thread(fn: Callable[[], T], name: str) -> T:
    """Run a blocking call (open, close) in a short-lived thread without blocking the loop.

    Not cancellable: the call always completes (a queue that was opened must be closed), so
    the wait is shielded; a pending cancellation is delivered at the caller's next checkpoint.
    """
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:
            failure.append(exc)
        finally:
            post(token, done.set)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    with anyio.CancelScope(shield=True):
        await done.wait()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


SCHEDULE_EVERY = 64
"""Calls of a k7async stream between two schedule points, at most (see :class:`Pace`)."""


class Pace:
    """The checkpoints of a stream that hands out (or takes in) one message per call.

    Every call is a cancel point: a task in a cancelled scope never sends or receives. A
    schedule point (letting other tasks run) comes at least every ``SCHEDULE_EVERY`` calls
    and whenever the call has to wait, instead of at every call: a full checkpoint costs a
    turn of the event loop (about 4 µs under asyncio, half of what anyio's own memory object
    stream takes per message). Trio and anyio leave the scheduling policy of a checkpoint
    open; the cancellation rule is the part callers rely on, and it is kept.

    Create it in the event loop that will use it: it keeps that loop's backend functions
    (``anyio.lowlevel`` looks the backend up at every call, a third of the cost).
    """

    __slots__ = ("_checkpoint", "_checkpoint_if_cancelled", "left")

    def __init__(self) -> None:
        backend = anyio.lowlevel.current_token().backend_class
        self._checkpoint = backend.checkpoint
        self._checkpoint_if_cancelled = backend.checkpoint_if_cancelled
        self.left = SCHEDULE_EVERY
        """Calls until the next schedule point."""

    def checkpoint(self) -> Awaitable[None]:
        """A cancel point; a schedule point too once every ``SCHEDULE_EVERY`` calls."""
        self.left -= 1
        if self.left:
            return self._checkpoint_if_cancelled()
        self.left = SCHEDULE_EVERY
        return self._checkpoint()

    def scheduled(self) -> None:
        """Say that the caller has just passed a schedule point (it waited)."""
        self.left = SCHEDULE_EVERY
