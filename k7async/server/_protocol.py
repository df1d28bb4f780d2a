"""The server's connections under asyncio (uvloop when installed): an ``asyncio.Protocol``
per connection instead of a task over anyio streams.

A connection is callbacks: ``data_received`` feeds its parser (the sans-I/O
``k7core.beanstalk`` one, as the streams path) and runs what was parsed, ``transport.write``
answers. No task, no thread per connection: a reserve that waits is a :class:`Waiters` entry
and at most one timer. How the requests run depends on the store's fsync strategy:

* not ``"sync"`` (``"flush"``, ``"async"``): inline, in the event loop. The store's calls
  return at once there (they are thread-safe; no msync is waited for), and a hand-over to
  the owner thread and back per request would cost more than the request itself.
* ``"sync"``: the runs of every connection that has requests in one loop iteration go to
  the store's owner thread as one call (:meth:`AsyncJobStore.submit`), inside one
  ``JobStore.batch()`` with whatever else is pending there: one msync for all of them
  (group commit). The owner thread posts the answers back once they are durable; each
  connection then sends its replies.

Semantics as the streams path (``_server.Connection``): a connection's requests run in order,
one run at a time; replies only once stored; a quit or the end of the input closes after the
replies; a client that half-closes while its reserve waits gets TIMED_OUT; a connection's
reservations are released when it goes. Memory per connection is bounded: a connection is
read only while its unparsed input is under ``input_limit`` and its transport's write
buffer is under the high-water mark, and a run stops after OUTPUT_CHUNK bytes of replies
(the rest run once those are sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from anyio.abc import Listener, SocketAttribute
from anyio.streams.stapled import MultiListener

from k7core import ClosedError
from k7core.beanstalk import Request, RequestParser
from k7core.beanstalk import protocol as wire

from .._jobs import AsyncJobStore
from ._session import Blocked, Quit, ServerState, Session
from ._waiters import Waiters

log = logging.getLogger("k7async.server")

_Outcome = tuple[bytes, int, "Blocked | Quit | None"]


class Waiting:
    """A waiting reserve of a protocol connection (``Waiters`` entry): ``wake`` is called by
    ``Waiters.poke`` once ``answer`` is set."""

    __slots__ = ("answer", "connection", "session")

    def __init__(self, connection: BeanstalkProtocol) -> None:
        self.connection = connection
        self.session = connection.session
        self.answer: bytes | None = None

    def wake(self) -> None:
        self.connection.loop.call_soon(self.connection._waited, self)


class Driver:
    """The protocol connections of one server in one asyncio loop; under ``"sync"``, the
    runs waiting for the next hand-over to the owner thread."""

    def __init__(self, state: ServerState, jobs: AsyncJobStore, waiters: Waiters,
                 loop: asyncio.AbstractEventLoop, inline: bool) -> None:
        self.state = state
        self.jobs = jobs
        self.waiters = waiters
        self.loop = loop
        self.inline = inline
        self.connections: set[BeanstalkProtocol] = set()
        self._pending: list[tuple[BeanstalkProtocol, bool]] = []  # (connection, close)
        self._scheduled = False
        self.stopping = False

    def protocol(self) -> BeanstalkProtocol:
        return BeanstalkProtocol(self)

    # --- "sync": one hand-over per loop iteration ----------------------------------------

    def hand_over(self, connection: BeanstalkProtocol, close: bool = False) -> None:
        self._pending.append((connection, close))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._submit)

    def _submit(self) -> None:
        self._scheduled = False
        items, self._pending = self._pending, []
        if not items:
            return
        loop = self.loop

        def notify(result: Callable[[], list[object]]) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
                loop.call_soon_threadsafe(self._deliver, items, result)

        try:
            self.jobs.submit(lambda store: _run_many(items), notify)
        except ClosedError:
            for connection, close in items:
                if close:
                    connection.session.close()
                else:
                    connection.abort()

    def _deliver(self, items: list[tuple[BeanstalkProtocol, bool]],
                 result: Callable[[], list[object]]) -> None:
        try:
            outcomes = result()
        except BaseException as exc:  # the batch failed (an msync): nothing is durable
            log.error("a batch of requests failed: %s", exc)
            for connection, close in items:
                if not close:
                    connection.abort()
            return
        for (connection, close), outcome in zip(items, outcomes, strict=True):
            if close:
                continue
            if isinstance(outcome, BaseException):
                log.error("connection failed", exc_info=outcome)
                connection.abort()
                continue
            connection._ran(outcome)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Close every connection now (the server stops); their reservations go back."""
        self.stopping = True
        for connection in list(self.connections):
            connection.abort()
            connection._gone()


def _run_many(items: list[tuple[BeanstalkProtocol, bool]]) -> list[object]:
    """On the owner thread, inside one ``JobStore.batch()``: each connection's run (or its
    close), in the order they were handed over."""
    out: list[object] = []
    for connection, close in items:
        session = connection.session
        try:
            if close:
                session.close()
                out.append(None)
            elif session.closed:
                out.append(BrokenPipeError("closed"))
            else:
                out.append(session.run(connection.requests, connection.start))
        except Exception as exc:
            out.append(exc)
    return out


class BeanstalkProtocol(asyncio.Protocol):
    """One client connection (see the module's docstring)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.loop = driver.loop
        self.parser = RequestParser(driver.state.max_job_size)
        self.session = Session(driver.state)
        self.transport: asyncio.Transport | None = None
        self.requests: list[Request] = []  # parsed, not answered from index start on
        self.start = 0
        self.busy = False  # a run is on the owner thread, or a reserve waits
        self.reading = True  # the transport reads (see _flow)
        self.write_paused = False  # the transport's write buffer is over its high-water mark
        self.eof = False
        self.closing = False
        self.gone = False
        self.waiting: Waiting | None = None
        self.deadline = math.inf
        self.timer: asyncio.TimerHandle | None = None

    # --- asyncio's callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's: not a subclass)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        driver = self.driver
        if driver.stopping:
            self.transport.abort()
            return
        driver.connections.add(self)
        state = driver.state
        state.sessions.add(self.session)
        state.total_connections += 1

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        if not self.busy and not self.closing:
            self._advance()
        else:
            self._flow()

    def eof_received(self) -> bool:
        self.eof = True
        waiting = self.waiting
        if waiting is not None:  # beanstalkd: a hang-up while a reserve waits: TIMED_OUT
            self._end_wait(wire.TIMED_OUT)
        elif not self.busy and not self.closing:
            self._advance()
        return True  # keep the transport open for the replies still due

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def pause_writing(self) -> None:
        self.write_paused = True  # the client does not read: answer and read no more
        self._flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy and not self.closing:
            self._advance()
        else:
            self._flow()

    def _flow(self) -> None:
        """Read only while the replies are sent and the unparsed input is under the limit
        (beanstalkd's rule: memory per connection stays bounded)."""
        transport = self.transport
        if transport is None or self.closing:
            return
        want = not self.write_paused and self.parser.buffered < self.driver.state.input_limit
        if want != self.reading:
            self.reading = want
            if want:
                transport.resume_reading()
            else:
                transport.pause_reading()

    # --- running requests ------------------------------------------------------------------

    def _advance(self) -> None:
        """Run what was parsed and not answered (the connection is not busy)."""
        parser, requests = self.parser, self.requests
        while True:
            while (request := parser.next()) is not None:
                requests.append(request)
            self._flow()
            if self.start >= len(requests):
                self.requests, self.start = [], 0
                if self.eof:
                    self._close()
                return
            if self.write_paused:
                return  # resume_writing goes on
            if not self.driver.inline:
                self.busy = True
                self.driver.hand_over(self)
                return
            try:
                outcome = self.session.run(requests, self.start)
            except Exception:
                log.exception("connection failed")
                self.abort()
                return
            if not self._answer(outcome):
                return
            requests = self.requests

    def _ran(self, outcome: _Outcome) -> None:
        """The owner thread's answer ("sync"), now durable."""
        self.busy = False
        if self.gone:
            return
        if self._answer(outcome):
            self._advance()

    def _answer(self, outcome: _Outcome) -> bool:
        """Send a run's replies; True when the connection can go on with what follows."""
        replies, i, stop = outcome
        transport = self.transport
        assert transport is not None
        if replies:
            transport.write(replies)  # may call pause_writing
        if stop is None:
            self.start = i
            return True
        if isinstance(stop, Quit):
            self._close()
            return False
        self.start = i + 1
        self.busy = True
        self._wait(stop.timeout)
        return False

    # --- a reserve that waits --------------------------------------------------------------

    def _wait(self, timeout: int) -> None:
        waiting = self.waiting = Waiting(self)
        self.driver.waiters.add(waiting)  # before the first try: a put meanwhile pokes it
        self.deadline = math.inf if timeout < 0 else time.monotonic() + timeout
        if self.eof:
            self._end_wait(wire.TIMED_OUT)
        else:
            self._check()

    def _check(self) -> None:
        self.timer = None
        waiting = self.waiting
        if waiting is None:
            return
        if waiting.answer is not None:
            self._end_wait(waiting.answer)
            return
        try:
            answer = self.session.try_reserve()
        except ClosedError:
            return  # the server is stopping
        if answer is not None:
            self._end_wait(answer)
            return
        now = time.monotonic()
        if now >= self.deadline:
            self._end_wait(wire.TIMED_OUT)
            return
        limit = self.deadline - now
        soon = self.session.wake_in()
        if soon is not None:
            limit = min(limit, soon)
        if limit != math.inf:
            self.timer = self.loop.call_later(limit, self._check)

    def _waited(self, waiting: Waiting) -> None:
        """``Waiters.poke`` gave this reserve a job."""
        if waiting is self.waiting and waiting.answer is not None:
            self._end_wait(waiting.answer)

    def _end_wait(self, answer: bytes) -> None:
        waiting = self.waiting
        assert waiting is not None
        self.waiting = None
        self.driver.waiters.remove(waiting)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.gone:
            return
        assert self.transport is not None
        self.busy = False
        self.transport.write(answer)  # may call pause_writing
        if not self.closing:
            self._advance()

    # --- the end ---------------------------------------------------------------------------

    def _close(self) -> None:
        """Close once the replies are sent (a quit, or the end of the input)."""
        if not self.closing:
            self.closing = True
            assert self.transport is not None
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def _gone(self) -> None:
        """The connection is closed: release its reservations (once)."""
        if self.gone:
            return
        self.gone = True
        self.closing = True
        if self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            self.driver.waiters.remove(waiting)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        driver = self.driver
        driver.connections.discard(self)
        driver.state.sessions.discard(self.session)
        if driver.inline or driver.stopping:
            _close_session(self.session)
        else:
            driver.hand_over(self, close=True)  # after its run, if one is under way


def _close_session(session: Session) -> None:
    try:
        session.close()
    except ClosedError:
        pass
    except Exception:
        log.exception("closing a connection failed")


def listener_sockets(listener: Listener[Any]) -> list[socket.socket]:
    """The listening sockets of an anyio listener (a MultiListener has several)."""
    if isinstance(listener, MultiListener):
        return [s for one in listener.listeners for s in listener_sockets(one)]
    sock: socket.socket = listener.extra(SocketAttribute.raw_socket)
    return [sock]
