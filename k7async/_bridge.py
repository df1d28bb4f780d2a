"""Thread <-> event loop plumbing: the only place where k7async threads touch the loop.

Threads never call into k7core objects they do not own, and the event loop never blocks on a
thread: a thread reports back by running a small synchronous callback in the loop
(:func:`notify`), and the async side awaits an :class:`anyio.Event` that callback sets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

import k7core

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

Payload = bytes | bytearray | memoryview
"""What a message can be made of (anything :meth:`k7core.Queue.enqueue` accepts)."""


def notify(token: EventLoopToken, fn: Callable[[Unpack[Ts]], object], *args: *Ts) -> bool:
    """From a foreign thread, run ``fn(*args)`` in the loop of ``token`` and wait until it ran.

    ``fn`` runs as a plain callback, not as a task: cancel scopes cannot stop it. Returns
    False when that loop has already finished (nobody is left to tell).
    """
    try:
        anyio.from_thread.run_sync(fn, *args, token=token)
    except (anyio.RunFinishedError, RuntimeError):  # RuntimeError: the loop closed meanwhile
        return False
    return True


def post(token: EventLoopToken, fn: Callable[[Unpack[Ts]], object], *args: *Ts) -> bool:
    """Like :func:`notify`, but do not wait for ``fn`` to run: the thread goes on at once.

    Uses the loop's own thread-safe scheduling (asyncio ``call_soon_threadsafe``, trio
    ``run_sync_soon``); other backends fall back to :func:`notify`. Returns False when that
    loop has already finished.
    """
    native = token.native_token
    schedule = getattr(native, "call_soon_threadsafe", None) or getattr(
        native, "run_sync_soon", None
    )
    if schedule is None:
        return notify(token, fn, *args)
    try:
        schedule(fn, *args)
    except (anyio.RunFinishedError, RuntimeError):  # asyncio: the loop is closed
        return False
    except Exception as exc:  # trio.RunFinishedError (trio is optional here)
        if type(exc).__name__ == "RunFinishedError":
            return False
        raise
    return True


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
            notify(token, done.set)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    with anyio.CancelScope(shield=True):
        await done.wait()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def core_queue(queue: object) -> k7core.Queue:
    """The :class:`k7core.Queue` behind ``queue`` (a Queue, or an AsyncQueue wrapping one)."""
    if isinstance(queue, k7core.Queue):
        return queue
    inner = getattr(queue, "queue", None)
    if isinstance(inner, k7core.Queue):
        return inner
    raise TypeError(f"expected a k7core.Queue or a k7async.AsyncQueue, not {type(queue).__name__}")
