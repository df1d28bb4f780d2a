"""The owner thread: a thread that owns one synchronous resource and serves it to async tasks.

k7core objects are single-threaded: one thread appends to a queue, one thread uses a
consumer group. An :class:`Owner` gives such a resource a thread of its own. Tasks of any
number of event loops (asyncio and trio, in any threads) hand it :class:`Command` objects;
the thread takes every pending command at once and runs them as one batch (a batch hook may
merge them, for example many appends into one ``enqueue_many``), then wakes each loop once per
batch, with one callback and one :class:`anyio.Event` for all the commands of that loop (a
*round*). The event loop never waits for the thread, and the thread never waits for a loop.

The producer channels, ``AsyncQueue`` and the consumer channels are built on it; so can be
any later layer that needs a single-threaded resource served to async code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

import k7core

from ._bridge import current_loop, post

R = TypeVar("R")
T = TypeVar("T")
C = TypeVar("C", bound="Command[Any, Any]")

_PENDING, _VALUE, _ERROR = 0, 1, 2


class _Round:
    """The commands one event loop handed over while the thread was busy: answered together,
    with one callback into that loop and one event (a command parked by the batch hook is
    answered later, with a new event)."""

    __slots__ = ("event", "outstanding", "token")

    def __init__(self) -> None:
        self.token = anyio.lowlevel.current_token()
        self.event = anyio.Event()
        self.outstanding = 0


class Command(Generic[R, T]):
    """One unit of work for an owner thread, and its outcome.

    Subclasses say what to do in :meth:`execute` (run on the owner thread). A batch hook may
    instead set the outcome itself with :meth:`set_result` / :meth:`set_error`. The outcome is
    written by the thread before the command's loop is told, and read in that loop after.
    """

    __slots__ = ("_round", "_state", "_value", "done")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._round: _Round | None = None
        self.done = False
        """True once the owner thread has finished with the command (read in its loop)."""

    def execute(self, resource: R) -> T:
        """What the command does, on the owner thread."""
        raise NotImplementedError

    def run(self, resource: R) -> None:
        """Execute and record the outcome (an exception is the command's outcome)."""
        try:
            self.set_result(self.execute(resource))
        except BaseException as exc:
            self.set_error(exc)

    def set_result(self, value: T) -> None:
        self._state, self._value = _VALUE, value

    def set_error(self, error: BaseException) -> None:
        self._state, self._value = _ERROR, error

    @property
    def has_outcome(self) -> bool:
        return self._state != _PENDING

    @property
    def error(self) -> BaseException | None:
        return cast(BaseException, self._value) if self._state == _ERROR else None

    def result(self) -> T:
        """The value, or raise the error (once :attr:`done`)."""
        if self._state == _ERROR:
            raise self._value
        return self._value  # type: ignore[no-any-return]  # (a cast costs a call per message)

    async def wait(self, *, shield: bool = False) -> None:
        """Wait in the submitting loop until the owner thread is done with this command.

        Cancelling the wait does not withdraw the command: it still runs. With ``shield``,
        the wait is not cancellable (for callers that must know the outcome).
        """
        rnd = self._round
        if rnd is None:
            raise ValueError("this command was submitted without an answer")
        if shield:
            with anyio.CancelScope(shield=True):
                while not self.done:
                    await rnd.event.wait()
            return
        while not self.done:  # no cancel scope: entering one costs more than the wait
            await rnd.event.wait()  # set once a command of the round is done


class Call(Command[R, T]):
    """A command that calls ``fn(resource)`` on the owner thread."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[R], T]) -> None:
        super().__init__()
        self.fn = fn

    def execute(self, resource: R) -> T:
        return self.fn(resource)


class Gather(Command[R, list[T]]):
    """A command that gathers items from many tasks of one event loop while it waits for the
    thread: a task adds its item to the newest pending one of its loop (:meth:`Owner.gather`)
    and takes its own result by index. One object, one round entry and one answer serve the
    whole group, which matters when each task hands over one small item. An error of the
    command is every task's; an item's own failure (when the tasks cannot check their
    items beforehand) is carried in its result by the subclass."""

    __slots__ = ("items",)

    limit = 65536
    """The most items one command gathers (a new one is started beyond)."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__()
        self.items = items


G = TypeVar("G", bound="Gather[Any, Any]")


BatchHook = Callable[[R, list[Command[R, Any]]], list[Command[R, Any]]]
"""Runs a batch of commands (in the order they were submitted) on the owner thread, setting
their outcomes. Returns the commands it *parks*: not done yet, handed to it again with the
next batch (the owner thread does not sleep while any is parked)."""


def run_each(resource: R, commands: list[Command[R, Any]]) -> list[Command[R, Any]]:
    """The default batch hook: each command on its own, in order."""
    for command in commands:
        command.run(resource)
    return []


def _wake(rounds: list[tuple[_Round, bool]]) -> None:
    """In a round's loop: wake its waiters; renew its event if some of it is still due."""
    for rnd, renew in rounds:
        event = rnd.event
        if renew:
            rnd.event = anyio.Event()
        event.set()


class Owner(Generic[R]):
    """A thread (named ``name``) that owns the resource ``open()`` returns.

    ``open`` and ``finish`` run on the thread, first and last: no other thread touches the
    resource. Commands are run in the order they were submitted, in batches (``batch``, by
    default each on its own). If ``open`` fails, every command fails with its error and the
    thread exits. :meth:`aclose` / :meth:`close` stop accepting commands, let the thread run
    those already accepted, finish the resource and join the thread; both are idempotent.
    """

    def __init__(
        self,
        open: Callable[[], R],
        *,
        name: str,
        batch: BatchHook[R] = run_each,
        finish: Callable[[R], object] | None = None,
    ) -> None:
        self._open: Callable[[], R] | None = open  # dropped once called
        self._batch = batch
        self._finish = finish
        self._lock = threading.Lock()  # entered directly on the per-message paths (cheaper)
        self._cond = threading.Condition(self._lock)
        self._pending: list[Command[R, Any]] = []
        self._rounds: dict[object, _Round] = {}  # open rounds, by event loop
        self._idle = False
        self._closing = False
        self._exited = False
        self._failure: BaseException | None = None  # open() failed
        self._close_error: BaseException | None = None  # finish() failed
        self._exit_waiters: list[tuple[EventLoopToken, anyio.Event]] = []
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self._thread.name

    @property
    def running(self) -> bool:
        """True until the thread has exited."""
        return self._thread.is_alive()

    @property
    def closing(self) -> bool:
        """True once close was asked for (batch hooks use it to hand parked commands back)."""
        return self._closing

    # ------------------------------------------------------------------ the loop side

    def submit(self, command: C, *, answer: bool = True) -> C:
        """Hand ``command`` to the thread; never blocks. With ``answer``, the calling event
        loop is told when it is done (:meth:`Command.wait`); without, nobody is (fire and
        forget: an ``answer=False`` command may be submitted from any thread).

        Raises :class:`k7core.ClosedError` once the owner is closing, or the error that
        ``open`` failed with.
        """
        key = current_loop() if answer else None
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._closing:
                raise k7core.ClosedError(f"{self.name} is closed", hint="open a new one")
            if answer:
                rnd = self._rounds.get(key)
                if rnd is None:
                    rnd = self._rounds[key] = _Round()
                rnd.outstanding += 1
                command._round = rnd
            self._pending.append(command)
            if self._idle:
                self._cond.notify()
        return command

    def gather(self, kind: type[G], item: object) -> tuple[G, int]:
        """Add ``item`` to the newest pending command when it is a ``kind`` of this event loop
        with room left, else submit a new ``kind([item])``; return the command and the
        item's index in it (its result is ``command.result()[index]``). Raises as
        :meth:`submit`."""
        key = current_loop()
        with self._lock:
            pending = self._pending
            if pending and not self._closing:
                last: Any = pending[-1]
                rnd = last._round
                if type(last) is kind and rnd is not None and rnd is self._rounds.get(key):
                    items = last.items
                    if len(items) < kind.limit:
                        items.append(item)
                        return last, len(items) - 1
        return self.submit(kind([item])), 0

    async def call(
        self, command: Command[R, T], *, shield: bool = False, precheck: bool = True
    ) -> T:
        """Submit ``command`` and return its result (or raise its error) in this task.

        A task that is cancelled already submits nothing (unless ``precheck`` is False: that
        check costs about as much as the rest of a small call). Cancelled while it waits, the
        task gets the cancellation at once, but the command was accepted and still runs; only
        its result is lost. With ``shield``, the task waits for the result even if cancelled.
        """
        if precheck and not shield:
            await anyio.lowlevel.checkpoint_if_cancelled()
        self.submit(command)
        await command.wait(shield=shield)
        return command.result()

    async def aclose(self) -> None:
        """Close: run what was accepted, finish the resource, join the thread (shielded).

        Raises the error ``finish`` failed with, to the first caller.
        """
        exited = None
        with self._cond:
            self._closing = True
            if not self._exited:
                exited = anyio.Event()
                self._exit_waiters.append((anyio.lowlevel.current_token(), exited))
                self._cond.notify()
        if exited is not None:
            with anyio.CancelScope(shield=True):
                await exited.wait()
        self._thread.join()
        self._raise_close_error()

    def close(self) -> None:
        """Like :meth:`aclose`, for synchronous code (blocks until the thread has exited)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self.join()
        self._raise_close_error()

    def join(self) -> None:
        """Wait (blocking) until the thread has exited; it does only once it is closed."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _raise_close_error(self) -> None:
        with self._cond:
            error, self._close_error = self._close_error, None
        if error is not None:
            raise error

    # ------------------------------------------------------------------ the thread

    def _main(self) -> None:
        try:
            open, self._open = self._open, None
            assert open is not None
            try:
                resource = open()
            except BaseException as exc:
                self._fail(exc)
                return
            try:
                self._serve(resource)
            finally:
                if self._finish is not None:
                    try:
                        self._finish(resource)
                    except BaseException as exc:
                        self._close_error = exc
        finally:
            with self._cond:
                self._exited = True
                waiters, self._exit_waiters = self._exit_waiters, []
            for token, event in waiters:
                post(token, event.set)

    def _take(self, wait: bool) -> list[Command[R, Any]] | None:
        """Everything pending (and close its rounds); None when closed and nothing is left."""
        with self._cond:
            while wait and not self._pending:
                if self._closing:
                    return None
                self._idle = True
                self._cond.wait()
                self._idle = False
            commands, self._pending = self._pending, []
            if self._rounds:
                self._rounds = {}
        return commands

    def _serve(self, resource: R) -> None:
        parked: list[Command[R, Any]] = []
        while True:
            commands = self._take(wait=not parked)
            if commands is None:
                return
            if parked:
                commands = parked + commands
            parked = self._run(resource, commands)
            self._answer(commands, parked)

    def _run(self, resource: R, commands: list[Command[R, Any]]) -> list[Command[R, Any]]:
        try:
            return self._batch(resource, commands)
        except BaseException as exc:  # a hook that raises fails what it did not settle
            for command in commands:
                if not command.has_outcome:
                    command.set_error(exc)
            return []

    def _answer(self, commands: list[Command[R, Any]], parked: list[Command[R, Any]]) -> None:
        """Mark the commands done (but the parked ones) and wake the loops whose rounds had
        a command done: one callback per loop."""
        kept = {id(c) for c in parked}
        touched: dict[_Round, None] = {}
        for command in commands:
            if kept and id(command) in kept:
                continue
            command.done = True
            rnd = command._round
            if rnd is not None:
                rnd.outstanding -= 1
                touched[rnd] = None
        wake: dict[EventLoopToken, list[tuple[_Round, bool]]] = {}
        for rnd in touched:
            # a round with parked commands left gets a new event for them
            wake.setdefault(rnd.token, []).append((rnd, rnd.outstanding > 0))
        for token, rounds in wake.items():
            post(token, _wake, rounds)

    def _fail(self, exc: BaseException) -> None:
        """``open`` failed: every command, now and later, fails with its error."""
        with self._cond:
            self._failure = exc
            self._closing = True
            commands, self._pending = self._pending, []
            self._rounds = {}
        for command in commands:
            command.set_error(exc)
        self._answer(commands, [])

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<k7async.Owner {self.name!r} {state}>"
