"""Child processes for the crash and multi-process tests (not a test module).

``Child`` runs a child program (by default ``tests/_children.py``, see its docstring for the
modes) as a subprocess whose stdout is read line by line. The programs run as modules
(``python -m tests._children``) with the repository's root on their ``PYTHONPATH``, so they
import their message format from ``tests._queuehelp`` as the tests do.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tests._queuehelp import child_env

CHILDREN = "tests._children"


#: Longest wait for one line of a child (or its exit): a stuck child fails the test with its
#: stderr instead of hanging the run.
DEADLINE = 120.0


class Child:
    """A child process speaking lines on stdin/stdout; SIGKILLed and reaped on exit. Every
    wait on it is bounded by ``DEADLINE``. ``program``: the module it runs (default
    ``tests._children``); ``prefix``: a command that runs it (such as ``unshare``)."""

    def __init__(self, *args: str, program: str = CHILDREN, prefix: tuple[str, ...] = (),
                 ) -> None:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", program, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            bufsize=0,
            env=child_env(),
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.out = self.proc.stdout
        self.inp = self.proc.stdin
        self._buf = b""
        self._eof = False

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def _fill(self, deadline: float) -> bool:
        """Read what the child wrote next; False at EOF. Fails past ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.out], [], [], left)[0]:
            self.proc.kill()
            raise AssertionError(
                f"child wrote no complete line within {DEADLINE} s (pending={self._buf[-200:]!r});"
                f" stderr:\n{self.stderr()}"
            )
        chunk = os.read(self.out.fileno(), 1 << 16)
        self._buf += chunk
        self._eof = not chunk
        return bool(chunk)

    def line(self) -> bytes:
        """The next complete line (without newline); fails with the child's stderr at EOF."""
        deadline = time.monotonic() + DEADLINE
        while b"\n" not in self._buf:
            if self._eof or not self._fill(deadline):
                rc = self.proc.poll()
                raise AssertionError(
                    f"child ended its output early (rc={rc}, last={self._buf!r}); "
                    f"stderr:\n{self.stderr()}"
                )
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def send(self, text: str) -> None:
        self.inp.write(text.encode() + b"\n")
        self.inp.flush()

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout=timeout)

    def kill_and_drain(self) -> list[bytes]:
        """SIGKILL the child, then return every complete line it wrote before dying."""
        self.proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE
        while not self._eof:
            self._fill(deadline)
        self.proc.wait(timeout=DEADLINE)
        lines = self._buf.split(b"\n")
        self._buf = b""
        return lines[:-1]  # the last piece is b"" (or an incomplete line: never reported)

    def lines_until_exit(self, total: float | None = None) -> list[bytes]:
        """Every complete line the child writes until its output ends (it exited or died),
        then reap it. A child silent for ``DEADLINE``, or still running after ``total``
        seconds, is stuck, not dead: it gets SIGUSR1 first (a child that registered
        ``faulthandler`` for it prints every thread's stack), then is killed, and the test
        fails with its stderr."""
        lines: list[bytes] = []
        end = None if total is None else time.monotonic() + total
        while True:
            deadline = time.monotonic() + DEADLINE
            if end is not None:
                deadline = min(deadline, end)
            while b"\n" not in self._buf and not self._eof:
                try:
                    self._fill(deadline)
                except AssertionError:
                    self._dump_and_fail(lines)
            if b"\n" not in self._buf:  # its output ended
                self.proc.wait(timeout=DEADLINE)
                return lines
            line, _, self._buf = self._buf.partition(b"\n")
            lines.append(line)

    def _dump_and_fail(self, lines: list[bytes]) -> None:
        """Ask a stuck child for its stacks (SIGUSR1), kill it, fail with its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)  # the dump, or the default action: it ends
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE)
        raise AssertionError(
            f"child stuck after {len(lines)} lines (last {lines[-3:]!r}, "
            f"pending={self._buf[-200:]!r}); stderr:\n{self.stderr()}"
        )

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=DEADLINE)
        finally:
            for f in (self.inp, self.out):
                f.close()
            self.err.close()


def bounded(call: Callable[[], Any], bound: float = DEADLINE / 2) -> Any:
    """``call()`` in a thread; its result or the exception it raised. Fails if it is still
    blocked after ``bound`` seconds (a wait on a frozen process that never ends: the thread
    ends once the test kills that process)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"the call was still waiting for the frozen process after {bound} s"
    return out[0]


@contextlib.contextmanager
def stopped(child: Child) -> Iterator[int]:
    """``child`` stopped with SIGSTOP for the block (returns once it is); yields its pid.
    Continued (SIGCONT) afterwards, whatever happens."""
    pid = child.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)  # returns once it is stopped
        assert os.WIFSTOPPED(status), status
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
