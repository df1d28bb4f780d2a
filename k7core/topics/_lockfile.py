"""Lock files that say who holds them: a ``flock`` taken with a bounded wait, the holder's
pid written into the file, and an error naming that pid when the wait runs out.

Every lock of the topics layer (a topic's metadata lock, an exchange's, a consumer group's)
is held for a few file operations; a holder that keeps it longer is stopped (SIGSTOP) or
stuck, and a waiter must not wait for it forever.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .._storage import flock_holder, open_fd, try_lock
from ._errors import TopicLockTimeoutError

LOCK_TIMEOUT = 10.0
"""How long an open, a bind or a join waits for a lock of the topics layer before raising
``TopicLockTimeoutError`` (a consumer's join: its ``lock_timeout``)."""

_PID_WIDTH = 16  # the pid, padded: the file never grows after its first write
_FIRST_SLEEP, _LONGEST_SLEEP = 0.0005, 0.01


def try_hold(path: Path, mode: int) -> int | None:
    """The lock's descriptor (closing it releases the lock), or None when another holds it."""
    fd = open_fd(path, os.O_RDWR | os.O_CREAT, mode)
    if not try_lock(fd):
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # a full disk: the pid is found in /proc/locks
        os.pwrite(fd, f"{os.getpid()}\n".encode().ljust(_PID_WIDTH), 0)
    return fd


def hold(path: Path, mode: int, timeout: float, what: str) -> int:
    """Wait up to ``timeout`` seconds for the lock; return its descriptor. Past the timeout,
    ``TopicLockTimeoutError`` names the process holding it."""
    deadline = time.monotonic() + timeout
    sleep = _FIRST_SLEEP
    while True:
        fd = try_hold(path, mode)
        if fd is not None:
            return fd
        left = deadline - time.monotonic()
        if left <= 0:
            pid = holder(path)
            who = f"process {pid}" if pid is not None else "another process"
            resume = f"kill -CONT {pid}" if pid is not None else "kill -CONT"
            raise TopicLockTimeoutError(
                f"{what} {path} has been held by {who} for more than {timeout} s",
                pid=pid, path=path,
                hint=f"that process is stopped or stuck: resume it ({resume}) or end it; "
                "the lock is released when it dies",
            )
        time.sleep(min(sleep, left))
        sleep = min(sleep * 2, _LONGEST_SLEEP)


@contextlib.contextmanager
def holding(path: Path, mode: int, timeout: float, what: str) -> Iterator[None]:
    """Hold the lock (see :func:`hold`) for the ``with`` block."""
    fd = hold(path, mode, timeout, what)
    try:
        yield
    finally:
        os.close(fd)


def holder(path: Path) -> int | None:
    """The pid holding the lock on ``path`` now: from ``/proc/locks`` (Linux), else the
    pid the holder wrote into the file; None if neither says."""
    pid = flock_holder(path)
    if pid is not None:
        return pid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return int(os.pread(fd, _PID_WIDTH, 0).strip() or b"x")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)

