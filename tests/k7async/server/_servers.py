"""Servers as child processes and a raw-socket client, for the server tests (not a test
module).

:func:`start_beanstalkd` runs the real beanstalkd (``/usr/bin/beanstalkd``, or the one on
``PATH``), :func:`start_k7` runs ours (``python -m k7async.server``), each on a free port
of 127.0.0.1. Both return once the server accepts connections (a connect polled against a
deadline). The connection that answered the poll stays open, unused, until the server
stops: every server of a test then counts the same connections in ``stats``.

:class:`Client` sends bytes and reads replies: :meth:`Client.reply` exactly one (where it
ends is :class:`k7core.beanstalk.ReplyParser`'s business), :meth:`Client.replies` up to n
or until the server stays silent (for the error cases, where one reply too many is the
bug).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from k7core.beanstalk import Reply, ReplyParser

READY_DEADLINE = 30.0
"""Longest wait for a server to accept connections."""
REPLY_DEADLINE = 10.0
"""Longest wait for one reply."""
SILENCE = 0.3
"""How long a server must stay silent for :meth:`Client.replies` to stop early."""

ROOT = Path(__file__).resolve().parents[3]


def beanstalkd_path() -> str | None:
    """The real beanstalkd's executable, or None when it is not installed."""
    if os.access("/usr/bin/beanstalkd", os.X_OK):
        return "/usr/bin/beanstalkd"
    return shutil.which("beanstalkd")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """A server running as a child process, listening on 127.0.0.1:``port``."""

    def __init__(self, name: str, argv: list[str], port: int) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._err, env=env)
        self._probe: socket.socket | None = None
        try:
            self._probe = self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> socket.socket:
        deadline = time.monotonic() + READY_DEADLINE
        pause = 0.005
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before "
                                   f"listening: {self.stderr()!r}")
            s = socket.socket()
            try:
                s.connect(("127.0.0.1", self.port))
                return s
            except OSError:
                s.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} does not listen on {self.port} after "
                                   f"{READY_DEADLINE} s: {self.stderr()!r}")
            time.sleep(pause)  # a poll of the connect, bounded by the deadline
            pause = min(pause * 2, 0.1)

    def stderr(self) -> bytes:
        self._err.seek(0)
        return self._err.read()

    def client(self) -> Client:
        return Client(self.port)

    def _close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then wait for the exit (SIGKILL if it does not come); the exit code."""
        self._close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._err.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        self._close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._err.close()


def start_beanstalkd(binlog: Path | None = None, max_job_size: int | None = None
                     ) -> ServerProcess:
    """The real beanstalkd on a free port (``-b binlog`` when given)."""
    exe = beanstalkd_path()
    if exe is None:
        raise FileNotFoundError("beanstalkd is not installed")
    port = free_port()
    argv = [exe, "-l", "127.0.0.1", "-p", str(port)]
    if binlog is not None:
        argv += ["-b", str(binlog)]
    if max_job_size is not None:
        argv += ["-z", str(max_job_size)]
    return ServerProcess("beanstalkd", argv, port)


def start_k7(directory: Path, max_job_size: int | None = None) -> ServerProcess:
    """Ours (``python -m k7async.server``) on a free port, its job store in
    ``directory``."""
    port = free_port()
    argv = [sys.executable, "-m", "k7async.server", "-l", "127.0.0.1", "-p", str(port),
            "-b", str(directory)]
    if max_job_size is not None:
        argv += ["-z", str(max_job_size)]
    return ServerProcess("k7-beanstalkd", argv, port)


@contextlib.contextmanager
def serving(kind: str, directory: Path) -> Iterator[ServerProcess]:
    """A server for the duration of the block, killed after it: ``"k7"``, ours, its job
    store in ``directory``; ``"beanstalkd"``, the real one (the test is skipped where it is
    not installed)."""
    if kind == "beanstalkd":
        if beanstalkd_path() is None:
            pytest.skip("beanstalkd is not installed (apt-get install beanstalkd)")
        proc = start_beanstalkd()
    else:
        proc = start_k7(directory)
    try:
        yield proc
    finally:
        proc.kill()


SERVERS = ["k7", "beanstalkd"]
"""The kinds :func:`serving` starts."""


def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    """A fixture's body: the server of kind ``request.param`` (one of :data:`SERVERS`),
    ours with its job store under ``tmp_path``. ``server = pytest.fixture(
    params=SERVERS)(served)`` makes the fixture."""
    with serving(request.param, tmp_path / "store") as proc:
        yield proc


def address(server: ServerProcess) -> str:
    """The server's address, as clients and workers take it."""
    return f"beanstalk://127.0.0.1:{server.port}"


def raw(reply: Reply) -> bytes:
    """A parsed reply's bytes, as they were on the wire."""
    line = " ".join((reply.word, *reply.args)).encode("ascii") + b"\r\n"
    return line if reply.body is None else line + reply.body + b"\r\n"


class Client:
    """A raw-socket connection to a server."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_DEADLINE)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = ReplyParser()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _receive(self, timeout: float) -> bytes:
        """Bytes (b"" at end of stream); TimeoutError when none came in ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536)
        except TimeoutError:
            raise
        except ConnectionResetError:
            return b""

    def reply(self, timeout: float = REPLY_DEADLINE) -> bytes:
        """Exactly one reply's bytes (TimeoutError, or EOFError when the server hangs up)."""
        deadline = time.monotonic() + timeout
        while (got := self.parser.next()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply in {timeout} s")
            data = self._receive(left)
            if not data:
                raise EOFError("the server hung up")
            self.parser.feed(data)
        return raw(got)

    def replies(self, n: int, quiet: float = SILENCE) -> list[bytes]:
        """Up to ``n`` replies: fewer when the server says nothing for ``quiet`` seconds
        (or hangs up) first."""
        out: list[bytes] = []
        while len(out) < n:
            got = self.parser.next()
            if got is not None:
                out.append(raw(got))
                continue
            try:
                data = self._receive(quiet)
            except TimeoutError:
                break
            if not data:
                break
            self.parser.feed(data)
        return out

    def closed(self, timeout: float = REPLY_DEADLINE) -> bool:
        """Whether the server hangs up within ``timeout`` without another byte."""
        try:
            data = self._receive(timeout)
        except TimeoutError:
            return False
        return data == b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
