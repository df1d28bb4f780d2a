"""The server as a child process, for the tests that talk to it over real sockets (not a
test module).

:class:`ServerProcess` runs ``k7 serve DIR --listen 127.0.0.1:0`` (or ``k7-beanstalkd``
with its flags) and learns where it listens from its ``listening on`` line: no fixed port, no
sleep. :meth:`ServerProcess.real_beanstalkd` runs Debian's beanstalkd the same way, from the
``bind`` line it prints with ``-V``. Every wait is bounded by ``DEADLINE``; a server that does
not come up fails the test with its stderr.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType

import pytest

from ._servers import beanstalkd_path

#: Longest wait for the server's line, or for its exit.
DEADLINE = 30.0

SCRIPTS = Path(sysconfig.get_path("scripts"))
K7 = str(SCRIPTS / "k7")
K7_BEANSTALKD = str(SCRIPTS / "k7-beanstalkd")


class ServerProcess:
    """A running server: ``address`` is ``(host, port)`` or a Unix socket's path. Leaving the
    ``with`` block SIGKILLs it if it still runs."""

    def __init__(self, argv: list[str], *, wait: bool = True, real: bool = False) -> None:
        self.argv = argv
        self.real = real
        self._pending = b""  # stdout read past the last line taken
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err)
        assert self.proc.stdout is not None
        self._out = self.proc.stdout
        self.address: tuple[str, int] | str = ""
        if wait:
            self._wait_ready()

    @classmethod
    def start_only(cls, argv: list[str]) -> ServerProcess:
        """Start ``argv`` without waiting for its ``listening on`` line (``address`` is
        unknown)."""
        return cls(argv, wait=False)

    def said_anything(self) -> bool:
        """Whether the server has written to stdout yet (without waiting)."""
        return bool(select.select([self._out], [], [], 0)[0])

    def _wait_ready(self) -> None:
        try:
            if self.real:  # "pid N", then "bind FD ADDRESS" (a Unix socket's bare path)
                while not (line := self._line()).startswith("bind "):
                    pass
                where = line.split(" ", 2)[2]
                where = f"unix:{where}" if where.startswith("/") else where
            else:
                where = self._line().removeprefix("listening on ")
            if where.startswith("unix:"):
                self.address = where[5:]
            else:
                host, _, port = where.rpartition(":")
                self.address = (host.strip("[]"), int(port))
            if self.real:
                self._wait_listening()
        except BaseException:
            self.close()
            raise

    def _wait_listening(self) -> None:
        """beanstalkd prints ``bind`` between its bind() and its listen(), and says nothing
        after: a connect in that gap (microseconds) is refused. Connect until one is not."""
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                self.connect().close()
                return
            except ConnectionRefusedError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.001)  # no event marks the listen(): a bounded retry

    @classmethod
    def serve(cls, directory: Path, *options: str, fsync: str = "flush",
              listen: str = "127.0.0.1:0") -> ServerProcess:
        """``k7 serve DIRECTORY --listen LISTEN --fsync FSYNC OPTIONS...``."""
        return cls([K7, "serve", str(directory), "--listen", listen, "--fsync", fsync,
                    *options])

    @classmethod
    def real_beanstalkd(cls, *flags: str) -> ServerProcess:
        """Debian's beanstalkd 1.12 with ``-V`` and ``FLAGS`` (give ``-l 127.0.0.1 -p 0`` or
        ``-l unix:PATH``); skips the test where it is not installed. (``-V`` also prints a
        line per connection, left in the pipe: fine for a test's few hundred.)"""
        exe = beanstalkd_path()
        if exe is None:
            pytest.skip("the real beanstalkd is not installed (apt-get install beanstalkd)")
        return cls([exe, "-V", *flags], real=True)

    @classmethod
    def beanstalkd(cls, *flags: str) -> ServerProcess:
        """``k7-beanstalkd FLAGS...`` (give ``-p 0`` or ``-l unix:PATH``)."""
        return cls([K7_BEANSTALKD, *flags])

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def _line(self) -> str:
        """The next line on stdout; fails (with stderr) at EOF or past ``DEADLINE``."""
        buf = self._pending
        deadline = time.monotonic() + DEADLINE
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            chunk = b""
            if left > 0 and select.select([self._out], [], [], left)[0]:
                chunk = os.read(self._out.fileno(), 4096)
            if not chunk:
                self.proc.kill()
                raise AssertionError(f"{self.argv} did not say where it listens "
                                     f"(rc={self.proc.wait()}, out={buf!r}):\n{self.stderr()}")
            buf += chunk
        line, _, self._pending = buf.partition(b"\n")
        return line.decode()

    def connect(self) -> socket.socket:
        """A new client socket to the server."""
        if isinstance(self.address, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.address)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection(self.address)
        sock.settimeout(DEADLINE)
        return sock

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE)

    def kill(self) -> None:
        """SIGKILL, and reap."""
        self.proc.kill()
        self.proc.wait(timeout=DEADLINE)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._out.close()
        self.err.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Wire:
    """A raw beanstalkd connection: send a command, read its reply line and body."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        """The next reply line, without CRLF; ConnectionError at EOF."""
        while b"\r\n" not in self._buf:
            self._fill()
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def body(self, size: int) -> bytes:
        while len(self._buf) < size + 2:
            self._fill()
        data, self._buf = self._buf[:size], self._buf[size + 2:]
        return data

    def reply(self) -> tuple[bytes, bytes | None]:
        """The next reply: its line, and its body for FOUND, RESERVED and OK."""
        line = self.line()
        words = line.split()
        if words and words[0] in (b"FOUND", b"RESERVED", b"OK"):
            return line, self.body(int(words[-1]))
        return line, None

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        self._buf += chunk

    def close(self) -> None:
        self.sock.close()
