"""Test support shared by the crash and multi-process tests (not a test module).

``Child`` runs ``_children.py`` (see its docstring for the modes) as a subprocess whose
stdout is read line by line; ``payload`` is that module's, so parent and child agree on the
bytes of message ``i``; ``frame_size`` is the on-disk size of a frame with an ``n``-byte
payload.
"""

from __future__ import annotations

import importlib.util
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
CHILD = str(_HERE / "_children.py")
_spec = importlib.util.spec_from_file_location("k7_test_children", CHILD)
assert _spec is not None and _spec.loader is not None
_children = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_children)
payload = _children.payload


def frame_size(n: int) -> int:
    return (10 + n + 7) & ~7


#: Longest wait for one line of a child (or its exit): a stuck child fails the test with its
#: stderr instead of hanging the run.
DEADLINE = 120.0


class Child:
    """A child process speaking lines on stdin/stdout; SIGKILLed and reaped on exit. Every
    wait on it is bounded by ``DEADLINE``. ``script``: the program (default ``_children.py``)."""

    def __init__(self, *args: str, script: str = CHILD) -> None:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            [sys.executable, script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            bufsize=0,
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
