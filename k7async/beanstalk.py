"""k7async.beanstalk: a beanstalkd client for async code (asyncio and trio), over anyio
streams; the commands and their replies are ``k7core.beanstalk.calls``, as for the blocking
``k7core.beanstalk.Client``.

    async with await k7async.beanstalk.connect("127.0.0.1:11300") as client:
        await client.use("emails")
        job_id = await client.put(b"hello")
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self, TypeVar

import anyio
from anyio.abc import ByteStream

from k7core.beanstalk import (
    Address,
    BeanstalkError,
    Call,
    ClientState,
    PeekedJob,
    ReservedJob,
    Stats,
    calls,
    parse_address,
)

T = TypeVar("T")

RECEIVE_SIZE = 1 << 16
_LOST = (anyio.EndOfStream, anyio.BrokenResourceError, OSError)
"""What the stream raises when the connection is gone."""


async def connect(address: str | tuple[str, int] | Address, *,
                  timeout: float | None = None) -> AsyncClient:
    """Connect to a beanstalkd server (ours or beanstalkd itself): ``address`` as
    ``k7core.beanstalk.parse_address`` reads it; ``timeout`` as :class:`AsyncClient` takes it
    (the connect gets it too)."""
    where = parse_address(address)
    state = ClientState(str(where), timeout)
    try:
        with anyio.fail_after(state.timeout):
            if where.path:
                stream: ByteStream = await anyio.connect_unix(where.path)
            else:
                stream = await anyio.connect_tcp(where.host, where.port)
    except OSError as e:
        raise state.connect_failed(e) from e
    return AsyncClient(stream, timeout=state.timeout, name=state.name)


class AsyncClient:
    """A connection to a beanstalkd server, one call at a time (a task that calls while
    another's call runs waits its turn: a waiting ``reserve`` holds the connection, so put
    from another client meanwhile). Made by :func:`connect`, or over any anyio byte
    ``stream``; ``name`` is what messages call the server.

    ``timeout``: seconds the network may take for each reply beyond the time the server holds
    it on purpose (``reserve(timeout=N)`` waits up to N + ``timeout``; ``reserve()`` as long as
    it takes); None waits as long as it takes. A reply that does not come in time closes the
    client (:class:`~k7core.beanstalk.BeanstalkTimeoutError`), as does any other failure of
    the connection (:class:`~k7core.beanstalk.BeanstalkConnectionError`).

    **Cancellation**: a call cancelled after it started sending leaves the connection in an
    unknown state (the server may yet answer, or have done what was asked), so the client
    closes it and every later call raises :class:`~k7core.beanstalk.BeanstalkConnectionError`;
    connect again. A task cancelled while it waits for its turn changes nothing. Failure
    replies (:class:`~k7core.beanstalk.BeanstalkError`) leave the connection open.
    :meth:`aclose` from another task ends a call that waits (it raises
    :class:`k7core.ClosedError`). The server puts the jobs this connection reserved back to
    ready when it closes.
    """

    def __init__(self, stream: ByteStream, *, timeout: float | None = None,
                 name: str = "the server") -> None:
        self._stream = stream
        self._state = ClientState(name, timeout)
        self._lock = anyio.Lock()

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called or the connection broke."""
        return self._state.ended

    async def aclose(self) -> None:
        """Close the connection (idempotent); a call that waits in another task ends."""
        if not self._state.closed:
            self._state.closed = True
            await anyio.aclose_forcefully(self._stream)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def call(self, call: Call[T]) -> T:
        """Send ``call``'s request, read its reply, return what it means (or raise it)."""
        async with self._lock:
            self._state.check()
            parser, stream = self._state.parser, self._stream
            try:
                with anyio.fail_after(call.reply_limit(self._state.timeout)):
                    await stream.send(call.request)
                    while (reply := parser.next()) is None:
                        parser.feed(await stream.receive(RECEIVE_SIZE))
                return call.result(reply)
            except BeanstalkError:
                raise  # a failure reply: the connection is fine
            except BaseException as e:
                error = self._state.failed(call, e, lost=_LOST)
                await anyio.aclose_forcefully(stream)
                if error is e:
                    raise
                raise error from e

    # --- the commands (see k7core.beanstalk.calls) ------------------------------------

    async def put(self, body: bytes, *, priority: int = calls.DEFAULT_PRIORITY,
                  delay: int = 0, ttr: int = calls.DEFAULT_TTR) -> int:
        """A new job in the used tube; its id."""
        return await self.call(calls.put(body, priority=priority, delay=delay, ttr=ttr))

    async def use(self, tube: str) -> str:
        """Put new jobs in ``tube``."""
        return await self.call(calls.use(tube))

    async def reserve(self, timeout: int | None = None) -> ReservedJob | None:
        """The next ready job of the watched tubes; None when none came within ``timeout``
        seconds (0: only one ready now; None: wait as long as it takes)."""
        if timeout is None:
            return await self.call(calls.reserve())
        return await self.call(calls.reserve_with_timeout(timeout))

    async def reserve_job(self, job_id: int) -> ReservedJob:
        """Reserve this job, whatever its tube, if no one has it reserved."""
        return await self.call(calls.reserve_job(job_id))

    async def delete(self, job_id: int) -> None:
        return await self.call(calls.delete(job_id))

    async def release(self, job_id: int, *, priority: int = calls.DEFAULT_PRIORITY,
                      delay: int = 0) -> None:
        return await self.call(calls.release(job_id, priority=priority, delay=delay))

    async def bury(self, job_id: int, *, priority: int = calls.DEFAULT_PRIORITY) -> None:
        return await self.call(calls.bury(job_id, priority=priority))

    async def touch(self, job_id: int) -> None:
        return await self.call(calls.touch(job_id))

    async def watch(self, tube: str) -> int:
        return await self.call(calls.watch(tube))

    async def ignore(self, tube: str) -> int:
        return await self.call(calls.ignore(tube))

    async def peek(self, job_id: int) -> PeekedJob | None:
        return await self.call(calls.peek(job_id))

    async def peek_ready(self) -> PeekedJob | None:
        return await self.call(calls.peek_ready())

    async def peek_delayed(self) -> PeekedJob | None:
        return await self.call(calls.peek_delayed())

    async def peek_buried(self) -> PeekedJob | None:
        return await self.call(calls.peek_buried())

    async def kick(self, bound: int) -> int:
        return await self.call(calls.kick(bound))

    async def kick_job(self, job_id: int) -> None:
        return await self.call(calls.kick_job(job_id))

    async def stats_job(self, job_id: int) -> Stats:
        return await self.call(calls.stats_job(job_id))

    async def stats_tube(self, tube: str) -> Stats:
        return await self.call(calls.stats_tube(tube))

    async def stats(self) -> Stats:
        return await self.call(calls.stats())

    async def list_tubes(self) -> list[str]:
        return await self.call(calls.list_tubes())

    async def list_tube_used(self) -> str:
        return await self.call(calls.list_tube_used())

    async def list_tubes_watched(self) -> list[str]:
        return await self.call(calls.list_tubes_watched())

    async def pause_tube(self, tube: str, delay: int) -> None:
        return await self.call(calls.pause_tube(tube, delay))

    async def quit(self) -> None:
        """Send quit (unless a call is under way: it ends as with :meth:`aclose`) and close:
        the server puts this connection's reservations back to ready, as on a close."""
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            pass
        else:
            try:
                if not self.closed:
                    # gone already, or too slow: only closing is left
                    with contextlib.suppress(TimeoutError, *_LOST), \
                            anyio.fail_after(self._state.timeout):
                        await self._stream.send(calls.quit())
            finally:
                self._lock.release()
        await self.aclose()


__all__ = ["AsyncClient", "connect"]
