"""Test support shared by the crash and multi-process tests (not a test module).

``Child`` runs ``_children.py`` (see its docstring for the modes) as a subprocess whose
stdout is read line by line; ``payload`` is that module's, so parent and child agree on the
bytes of message ``i``; ``frame_size`` is the on-disk size of a frame with an ``n``-byte
payload.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import tempfile
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


class Child:
    """A child process speaking lines on stdin/stdout; SIGKILLed and reaped on exit."""

    def __init__(self, *args: str) -> None:
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.out = self.proc.stdout
        self.inp = self.proc.stdin

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def line(self) -> bytes:
        """The next complete line (without newline); fails with the child's stderr at EOF."""
        line = self.out.readline()
        if not line.endswith(b"\n"):
            rc = self.proc.poll()
            raise AssertionError(
                f"child ended its output early (rc={rc}, last={line!r}); stderr:\n{self.stderr()}"
            )
        return line[:-1]

    def send(self, text: str) -> None:
        self.inp.write(text.encode() + b"\n")
        self.inp.flush()

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def kill_and_drain(self) -> list[bytes]:
        """SIGKILL the child, then return every complete line it wrote before dying."""
        self.proc.send_signal(signal.SIGKILL)
        rest = self.out.read()
        self.proc.wait()
        lines = rest.split(b"\n")
        return lines[:-1]  # the last piece is b"" (or an incomplete line: never reported)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        finally:
            for f in (self.inp, self.out):
                f.close()
            self.err.close()
