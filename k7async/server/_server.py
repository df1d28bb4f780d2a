"""The beanstalkd server's event loop side: listeners, one task per connection, reserves
that wait, signals.

Under asyncio the connections are protocols (``_protocol``: inline runs unless ``"sync"``,
one hand-over to the owner thread per loop iteration under it). Under trio, or with
``K7_SERVER_DRIVER=streams``, a connection is a task over anyio streams: it parses what it
receives (``k7core.beanstalk``), hands each run of
requests to the job store's owner thread (``AsyncJobStore.run``: under ``"sync"`` the runs of
every connection at that moment share one msync) and sends the replies once they are
stored. A reserve that finds no job waits here, in the event loop, with no thread of its
own: the store's ready listener pokes :class:`Waiters`, which hands ready jobs to waiting
connections in the order they came. A connection is read only while it has nothing to
answer (or, while its reserve waits, up to the state's ``input_limit`` of unparsed input),
and a run's replies are sent before the next run (at most OUTPUT_CHUNK bytes each): memory
per connection stays bounded whatever the client sends or leaves unread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.abc import SocketAttribute
from anyio.lowlevel import EventLoopToken

from k7core import ClosedError, K7Error
from k7core.beanstalk import Request, RequestParser
from k7core.beanstalk import protocol as wire
from k7core.jobs import JOURNAL_SEGMENT, JobStore

from .._jobs import AsyncJobStore, open_jobs
from ._protocol import Driver, listener_sockets
from ._session import Blocked, Quit, ServerState, Session
from ._waiters import Waiters

log = logging.getLogger("k7async.server")

RECEIVE_SIZE = 65536

DRIVER_ENV = "K7_SERVER_DRIVER"
"""Overrides how connections are driven, for measurements: ``streams`` (a task per
connection over anyio streams, as under trio), ``owner`` (asyncio protocols, every run on the
store's owner thread, as under ``"sync"``), ``inline`` (asyncio protocols, runs in the event
loop). Default: protocols under asyncio, inline unless ``"sync"``; streams under trio."""


@dataclass(frozen=True)
class Listen:
    """Where to listen: TCP ``host``:``port`` (port 0: any free one), or a Unix socket
    ``path``."""

    host: str = "0.0.0.0"
    port: int = wire.DEFAULT_PORT
    path: str | None = None

    @classmethod
    def parse(cls, text: str, default_port: int = wire.DEFAULT_PORT) -> Listen:
        """``HOST:PORT``, ``HOST`` (the default port), ``[V6]:PORT`` or ``unix:PATH``."""
        if text.startswith("unix:"):
            if not text[5:]:
                raise ValueError("unix: needs a path, as in unix:/run/k7.sock")
            return cls(path=text[5:])
        host, port = text, default_port
        if text.startswith("["):
            end = text.find("]")
            host, rest = text[1:end], text[end + 1:]
            if rest:
                port = _port(rest.removeprefix(":"))
        elif text.count(":") == 1:
            host, raw = text.split(":")
            port = _port(raw)
        return cls(host=host or "0.0.0.0", port=port)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(f"port {text!r} is not a number in 0..65535")
    return int(text)


@dataclass(frozen=True)
class ServerConfig:
    """A server's settings: the job store's directory and options, where to listen, the
    largest job body, and whether it handles SIGTERM/SIGINT (stop) and SIGUSR1 (drain)."""

    directory: Path
    listen: tuple[Listen, ...] = (Listen(),)
    sockets: tuple[socket.socket, ...] = ()
    """Listening sockets to serve as well, bound already (the server takes them over and
    closes them): ``k7-beanstalkd`` binds before it loads the server."""
    fsync: str = "flush"
    commit_interval: float = 50e-6
    max_job_size: int = wire.DEFAULT_MAX_JOB_SIZE
    signals: bool = True


class _Waiter:
    __slots__ = ("answer", "event", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.event = anyio.Event()
        self.answer: bytes | None = None

    def wake(self) -> None:
        self.event.set()


class Connection:
    """One client: its parser, its session and its task."""

    def __init__(self, server: Server, stream: anyio.abc.ByteStream) -> None:
        self.server = server
        self.stream = stream
        self.parser = RequestParser(server.state.max_job_size)
        self.session = Session(server.state)
        self.eof = False

    async def serve(self) -> None:
        jobs, stream, parser, session = self.server.jobs, self.stream, self.parser, self.session
        while True:
            requests: list[Request] = []
            while (request := parser.next()) is not None:
                requests.append(request)
            if not requests:
                if self.eof:
                    return
                try:
                    data = await stream.receive(RECEIVE_SIZE)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                parser.feed(data)
                continue
            i = 0
            while i < len(requests):
                replies, i, stop = await jobs.run(partial(_run, session, requests, i))
                if replies:
                    await stream.send(replies)  # sent before the next run: bounded output
                if stop is None:
                    continue  # all answered, or more after the replies just sent
                if isinstance(stop, Quit):
                    return
                await stream.send(await self.wait(stop.timeout))
                i += 1

    async def wait(self, timeout: int) -> bytes:
        """A reserve that found no job: wait for one, for DEADLINE_SOON, for ``timeout``
        seconds (< 0: no limit), or for the client to hang up (TIMED_OUT, as beanstalkd).
        Bytes that arrive meanwhile are kept for after, up to the input limit: past it the
        connection is not read (nor a hang-up seen) until the reserve is answered."""
        waiters = self.server.waiters
        waiter = _Waiter(self.session)
        waiters.add(waiter)  # before the first try: a job put meanwhile pokes this waiter
        deadline = math.inf if timeout < 0 else time.monotonic() + timeout
        answer = wire.TIMED_OUT
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_while_waiting, waiter)
                try:
                    answer = await self._wait(waiter, deadline)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            waiters.remove(waiter)
        return answer

    async def _wait(self, waiter: _Waiter, deadline: float) -> bytes:
        session = self.session
        while True:
            if waiter.answer is not None:
                return waiter.answer
            answer = session.try_reserve()
            if answer is not None:
                return answer
            now = time.monotonic()
            if now >= deadline:
                return wire.TIMED_OUT
            limit = deadline - now
            soon = session.wake_in()
            if soon is not None:
                limit = min(limit, soon)
            with anyio.move_on_after(limit):
                await waiter.event.wait()
            waiter.event = anyio.Event()

    async def _read_while_waiting(self, waiter: _Waiter) -> None:
        limit = self.server.state.input_limit
        while self.parser.buffered < limit:
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                self.eof = True
                if waiter.answer is None:
                    waiter.answer = wire.TIMED_OUT
                waiter.event.set()
                return
            self.parser.feed(data)


def _run(session: Session, requests: list[Request], start: int, store: JobStore
         ) -> tuple[bytes, int, Blocked | Quit | None]:
    return session.run(requests, start)


class Server:
    """A running server (from :func:`serve`): its store, its state, its addresses."""

    def __init__(self, config: ServerConfig, jobs: AsyncJobStore, token: EventLoopToken
                 ) -> None:
        self.config = config
        self.jobs = jobs
        self.state = ServerState(jobs.store, config.max_job_size, JOURNAL_SEGMENT)
        self.waiters = Waiters(token)
        self.addresses: list[str] = []
        self.stopped = anyio.Event()
        self._cancel = anyio.CancelScope()

    def drain(self) -> None:
        """Answer every put from now on with DRAINING (SIGUSR1)."""
        self.state.draining = True
        log.info("drain mode: puts get DRAINING")

    def stop(self) -> None:
        """Stop: close the listeners and the connections (their reservations go back to
        ready); what was answered is stored already."""
        self._cancel.cancel()

    async def _handle(self, stream: anyio.abc.ByteStream) -> None:
        try:
            connection = Connection(self, stream)
        except ClosedError:
            await stream.aclose()
            return
        state = self.state
        state.sessions.add(connection.session)
        state.total_connections += 1
        try:
            await connection.serve()
        except Exception:
            log.exception("connection failed")
        finally:
            state.sessions.discard(connection.session)
            with anyio.CancelScope(shield=True):
                try:
                    await self.jobs.run(lambda store: connection.session.close())
                except ClosedError:
                    connection.session.close()
                await stream.aclose()

    async def _signals(self) -> None:
        wanted = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
        with anyio.open_signal_receiver(*wanted) as received:
            async for signum in received:
                if signum == signal.SIGUSR1:
                    self.drain()
                else:
                    log.info("signal %d: stopping", signum)
                    self.stop()


async def _listeners(config: ServerConfig) -> list[anyio.abc.Listener[anyio.abc.SocketStream]]:
    out: list[anyio.abc.Listener[anyio.abc.SocketStream]] = []
    try:
        for sock in config.sockets:
            out.append(await anyio.abc.SocketListener.from_socket(sock))
        for where in config.listen:
            if where.path is not None:
                path = Path(where.path)
                if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                    path.unlink()  # a socket left by a server that died (as beanstalkd)
                out.append(await anyio.create_unix_listener(path))
            else:
                out.append(await anyio.create_tcp_listener(
                    local_host=where.host, local_port=where.port))
    except BaseException:
        for listener in out:
            await listener.aclose()
        raise
    return out


def _address(listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> str:
    local = listener.extra(SocketAttribute.local_address)
    if isinstance(local, str):
        return f"unix:{local}"
    host, port = local[0], local[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _driver(server: Server, config: ServerConfig) -> Driver | None:
    """The asyncio protocols' driver, or None: connections are tasks over anyio streams."""
    choice = os.environ.get(DRIVER_ENV, "")
    if choice not in ("", "streams", "owner", "inline"):
        raise K7Error(f"{DRIVER_ENV}={choice!r} is not a driver",
                      hint="use streams, owner or inline, or leave it unset")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        return None
    if choice == "streams":
        return None
    inline = choice == "inline" or (choice == "" and config.fsync != "sync")
    return Driver(server.state, server.jobs, server.waiters, loop, inline)


async def serve(
    config: ServerConfig, *, on_ready: Callable[[Server], object] | None = None
) -> None:
    """Run a beanstalkd server over the job store in ``config.directory`` until
    :meth:`Server.stop` (or SIGTERM/SIGINT when ``config.signals``). ``on_ready(server)`` is
    called once it listens (``server.addresses`` says where)."""
    async with open_jobs(config.directory, fsync=config.fsync,
                         commit_interval=config.commit_interval) as jobs:
        server = Server(config, jobs, anyio.lowlevel.current_token())
        store = jobs.store
        store.ref_tube("default")  # beanstalkd's default tube always exists
        store.add_ready_listener(server.waiters.listener)
        driver = _driver(server, config)  # (before binding: a bad setting binds nothing)
        listeners = await _listeners(config)
        servers: list[asyncio.AbstractServer] = []
        try:
            server.addresses = [_address(listener) for listener in listeners]
            with server._cancel:
                async with anyio.create_task_group() as tg:
                    if config.signals:
                        tg.start_soon(server._signals)
                    if driver is None:
                        for listener in listeners:
                            tg.start_soon(listener.serve, server._handle)
                    else:
                        for listener in listeners:
                            for sock in listener_sockets(listener):
                                if sock.family == socket.AF_UNIX:
                                    servers.append(await driver.loop.create_unix_server(
                                        driver.protocol, sock=sock))
                                else:
                                    servers.append(await driver.loop.create_server(
                                        driver.protocol, sock=sock))
                    log.info("listening on %s (pid %d)", ", ".join(server.addresses),
                             os.getpid())
                    if on_ready is not None:
                        on_ready(server)
                    if driver is not None:
                        await anyio.sleep_forever()
        finally:
            for aserver in servers:
                aserver.close()
            if driver is not None:
                driver.stop()
            for listener in listeners:
                with anyio.CancelScope(shield=True):
                    await listener.aclose()
            store.remove_ready_listener(server.waiters.listener)
            server.stopped.set()
