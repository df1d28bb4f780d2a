"""Fault injection for tests: a seam in the library, so tests need not patch internals.

``with inject("msync", errno.EIO): ...`` makes every msync of the log and of the cursors
fail with that errno (in the C kernel, ``k7_fault_msync``); ``inject("preallocate",
errno.ENOSPC)`` makes the preallocation of every file the queue creates (segments,
cursors, the position file) fail as on a full disk; ``inject("fsync", errno.EIO)`` makes
every fsync of a file or of the directory fail. Process-wide; not for production use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from ._kernel import lib
from ._storage import FAULTS

Fault = Literal["msync", "preallocate", "fsync"]


@contextmanager
def inject(fault: Fault, err: int) -> Iterator[None]:
    """Make ``fault`` fail with ``err`` (an errno) inside the block."""
    if fault == "msync":
        lib.k7_fault_msync = err
    elif fault in ("preallocate", "fsync"):
        FAULTS[fault] = err
    else:
        raise ValueError(f"unknown fault {fault!r}")
    try:
        yield
    finally:
        if fault == "msync":
            lib.k7_fault_msync = 0
        else:
            FAULTS.pop(fault, None)
