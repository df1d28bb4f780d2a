"""The blocking client: :mod:`calls` over a socket."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TypeVar

# (``from . import calls`` would import the package back: tests/test_layout.py)
import k7core.beanstalk.calls as calls

from .._resource import Resource
from ._address import Address, parse_address
from ._errors import BeanstalkError
from ._state import ClientState
from .calls import Call, PeekedJob, ReservedJob, Stats
from .protocol import Reply

T = TypeVar("T")

RECEIVE_SIZE = 1 << 16


class Client(Resource):
    """A connection to a beanstalkd server (ours or beanstalkd itself), one call at a time.

        with Client("127.0.0.1:11300", timeout=5) as client:
            client.use("emails")
            job_id = client.put(b"hello")

    ``address``: see :func:`parse_address`. ``timeout``: seconds the network may take to
    connect and for each reply beyond the time the server holds it on purpose (a
    ``reserve(timeout=N)`` waits up to N + ``timeout``; ``reserve()`` as long as it takes);
    None waits as long as it takes. A reply that does not come in time closes the client
    (:class:`BeanstalkTimeoutError`), since the connection's state is then unknown; so does any
    other failure of the connection (:class:`BeanstalkConnectionError`) and a call interrupted
    (KeyboardInterrupt). Failure replies (:class:`BeanstalkError`) leave it open.

    Calls from several threads run one at a time. :meth:`close` from another thread ends a
    call that waits (it raises :class:`k7core.ClosedError`). The server puts the jobs this
    connection reserved back to ready when it closes.
    """

    def __init__(self, address: str | tuple[str, int] | Address, *,
                 timeout: float | None = None) -> None:
        self.address = parse_address(address)
        self._state = ClientState(str(self.address), timeout)
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        where, timeout = self.address, self._state.timeout
        try:
            if not where.path:
                sock = socket.create_connection((where.host, where.port), timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(where.path)
            except BaseException:
                sock.close()
                raise
            return sock
        except OSError as e:
            raise self._state.connect_failed(e) from e

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the connection broke."""
        return self._state.ended

    def close(self) -> None:
        """Close the connection (idempotent); a call that waits in another thread ends."""
        self._state.closed = True
        _shut(self._sock)

    def call(self, call: Call[T]) -> T:
        """Send ``call``'s request, read its reply, return what it means (or raise it)."""
        with self._lock:
            self._state.check()
            try:
                self._sock.settimeout(self._state.timeout)
                self._sock.sendall(call.request)
                return call.result(self._receive(call.reply_limit(self._state.timeout)))
            except BeanstalkError:
                raise  # a failure reply: the connection is fine
            except BaseException as e:
                error = self._state.failed(call, e, lost=(EOFError, OSError))
                _shut(self._sock)
                if error is e:
                    raise
                raise error from e

    def _receive(self, limit: float | None) -> Reply:
        parser, sock = self._state.parser, self._sock
        deadline = None if limit is None else time.monotonic() + limit
        while (reply := parser.next()) is None:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
            else:
                sock.settimeout(None)
            data = sock.recv(RECEIVE_SIZE)
            if not data:
                raise EOFError("the server closed the connection")
            parser.feed(data)
        return reply

    # --- the commands (see k7core.beanstalk.calls) ------------------------------------

    def put(self, body: bytes, *, priority: int = calls.DEFAULT_PRIORITY, delay: int = 0,
            ttr: int = calls.DEFAULT_TTR) -> int:
        """A new job in the used tube; its id."""
        return self.call(calls.put(body, priority=priority, delay=delay, ttr=ttr))

    def use(self, tube: str) -> str:
        """Put new jobs in ``tube``."""
        return self.call(calls.use(tube))

    def reserve(self, timeout: int | None = None) -> ReservedJob | None:
        """The next ready job of the watched tubes; None when none came within ``timeout``
        seconds (0: only one ready now; None: wait as long as it takes)."""
        if timeout is None:
            return self.call(calls.reserve())
        return self.call(calls.reserve_with_timeout(timeout))

    def reserve_job(self, job_id: int) -> ReservedJob:
        """Reserve this job, whatever its tube, if no one has it reserved."""
        return self.call(calls.reserve_job(job_id))

    def delete(self, job_id: int) -> None:
        return self.call(calls.delete(job_id))

    def release(self, job_id: int, *, priority: int = calls.DEFAULT_PRIORITY,
                delay: int = 0) -> None:
        return self.call(calls.release(job_id, priority=priority, delay=delay))

    def bury(self, job_id: int, *, priority: int = calls.DEFAULT_PRIORITY) -> None:
        return self.call(calls.bury(job_id, priority=priority))

    def touch(self, job_id: int) -> None:
        return self.call(calls.touch(job_id))

    def watch(self, tube: str) -> int:
        return self.call(calls.watch(tube))

    def ignore(self, tube: str) -> int:
        return self.call(calls.ignore(tube))

    def peek(self, job_id: int) -> PeekedJob | None:
        return self.call(calls.peek(job_id))

    def peek_ready(self) -> PeekedJob | None:
        return self.call(calls.peek_ready())

    def peek_delayed(self) -> PeekedJob | None:
        return self.call(calls.peek_delayed())

    def peek_buried(self) -> PeekedJob | None:
        return self.call(calls.peek_buried())

    def kick(self, bound: int) -> int:
        return self.call(calls.kick(bound))

    def kick_job(self, job_id: int) -> None:
        return self.call(calls.kick_job(job_id))

    def stats_job(self, job_id: int) -> Stats:
        return self.call(calls.stats_job(job_id))

    def stats_tube(self, tube: str) -> Stats:
        return self.call(calls.stats_tube(tube))

    def stats(self) -> Stats:
        return self.call(calls.stats())

    def list_tubes(self) -> list[str]:
        return self.call(calls.list_tubes())

    def list_tube_used(self) -> str:
        return self.call(calls.list_tube_used())

    def list_tubes_watched(self) -> list[str]:
        return self.call(calls.list_tubes_watched())

    def pause_tube(self, tube: str, delay: int) -> None:
        return self.call(calls.pause_tube(tube, delay))

    def quit(self) -> None:
        """Send quit (unless a call is under way: it ends as with :meth:`close`) and close:
        the server puts this connection's reservations back to ready, as on a close."""
        if self._lock.acquire(blocking=False):
            try:
                if not self.closed:
                    with contextlib.suppress(OSError):  # gone already: only closing is left
                        self._sock.settimeout(self._state.timeout)
                        self._sock.sendall(calls.quit())
            finally:
                self._lock.release()
        self.close()


def _shut(sock: socket.socket) -> None:
    """Close ``sock``, waking a thread blocked on it (shutdown first: close alone does not)."""
    with contextlib.suppress(OSError):  # not connected (any more)
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
