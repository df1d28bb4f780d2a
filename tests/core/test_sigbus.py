"""Files shrunk underneath live memory maps. Touching a page past the new end of a mapped
file raises SIGBUS; k7core's handler (``k7_bus.c``) replaces such a page of its own maps
with a zero page, so readers get a clear error and the writer finds out at its next check,
instead of the process dying. A SIGBUS anywhere else still ends the process.

Each case runs in a child process, so that a SIGBUS that is not handled fails the test
(exit by signal) instead of killing the test run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests._queuehelp import run_python

PRELUDE = """
import os, struct, sys
import k7core
from k7core._kernel import lib
qdir = sys.argv[1]
seg0 = os.path.join(qdir, "seg-00000000000000000000.k7")
"""


def _child(tmp_path: Path, body: str) -> list[str]:
    return run_python(PRELUDE + textwrap.dedent(body), str(tmp_path / "q")).split()


def test_segment_truncated_under_a_reader(tmp_path: Path) -> None:
    out = _child(tmp_path, """
        with k7core.Queue(qdir, segment_size=8192) as q:
            q.enqueue_many([b"m%04d" % i for i in range(600)])  # two segments
        with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("g") as g:
            first = g.poll(max_batch=1, timeout=0)
            os.truncate(seg0, 0)  # the mapped segment loses every page
            try:
                g.poll(max_batch=1000, timeout=0)
            except k7core.K7Error as exc:
                print(type(exc).__name__)
            print(lib.k7_bus_faults() > 0)
            g.seek(8192 - 8192 % 16)  # skip to the next segment: it reads on
            print(bytes(g.poll(max_batch=1, timeout=0)[0].payload) != b"")
    """)
    assert out == ["CorruptFrameError", "True", "True"]


def test_segment_truncated_under_the_writer(tmp_path: Path) -> None:
    out = _child(tmp_path, """
        q = k7core.Queue(qdir, segment_size=1 << 16, fsync="flush")
        q.enqueue_many([b"x" * 100] * 10)
        os.truncate(seg0, 0)
        q.enqueue_many([b"y" * 100] * 100)  # writes into pages the file no longer has
        try:
            q.sync()
        except k7core.StorageError as exc:
            print("truncated" in str(exc))
            print(os.path.exists(os.path.join(qdir, "k7py-orphaned-seg-00000000000000000000.k7")))
        try:
            q.close()
        except k7core.StorageError:
            print("close-raised")
        print(q.closed, lib.k7_bus_faults() > 0)
    """)
    assert out == ["True", "True", "close-raised", "True", "True"]


def test_cursor_truncated_under_a_group(tmp_path: Path) -> None:
    out = _child(tmp_path, """
        with k7core.Queue(qdir, segment_size=8192) as q:
            q.enqueue_many([b"m%04d" % i for i in range(20)])
            g = q.consumer_group("g")
            g.ack_many(g.poll(max_batch=5, timeout=0))
            os.truncate(os.path.join(qdir, "cursor-g.k7"), 0)
            g.ack_many(g.poll(max_batch=5, timeout=0))  # stores into a lost page
            g.close()
            with q.consumer_group("g") as g:
                print(bytes(g.poll(max_batch=1, timeout=0)[0].payload).decode())
    """)
    assert out == ["m0010"]


def test_a_foreign_sigbus_still_ends_the_process(tmp_path: Path) -> None:
    """Only k7core's own maps are guarded: the handler passes any other SIGBUS on."""
    path = tmp_path / "f"
    code = textwrap.dedent(f"""
        import mmap, os
        import k7core
        with open({str(path)!r}, "w+b") as f:
            f.truncate(1 << 16)
            m = mmap.mmap(f.fileno(), 1 << 16)
            f.truncate(0)
            print(m[4096 * 3])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGBUS, proc
