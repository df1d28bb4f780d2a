"""The compiled kernel: ``ffi`` and ``lib`` (cffi, ``k7core._native._k7``, the one build of
``k7.c``), the binding of the CPython fast paths (``k7core._native._fast``) to it, and their
thread guard."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ._checks import check_count, check_timeout
from ._errors import ConcurrentUseError

try:
    from ._native._fast import Appender, Fetcher, bind, set_busy_error, set_checks
    from ._native._k7 import ffi as ffi
    from ._native._k7 import lib as lib
except ImportError as exc:  # pragma: no cover - only when the build step was skipped
    raise ImportError(
        "k7core's C kernel is not built: install the package with `pip install .` "
        "(it compiles k7core/_native/k7.c and _fast.c)"
    ) from exc

if TYPE_CHECKING:
    from ._native._k7 import CData  # a cffi pointer (only in the stub, _k7.pyi)

bind(int(ffi.cast("uintptr_t", lib.k7_api_table())))  # before anything uses _fast

NOFIT: int = lib.K7_NOFIT
EIO: int = lib.K7_EIO
BADOFFSETS: int = lib.K7_BADOFFSETS
TOOLARGE: int = lib.K7_TOOLARGE
BUSY: int = lib.K7_BUSY
RECOVER: int = lib.K7_RECOVER
REMAP: int = lib.K7_REMAP
LOCKTIMEOUT: int = lib.K7_LOCKTIMEOUT
SCAN_OK: int = lib.K7_SCAN_OK
SCAN_EMPTY: int = lib.K7_SCAN_EMPTY
SCAN_CORRUPT: int = lib.K7_SCAN_CORRUPT
SCAN_NOSEG: int = lib.K7_SCAN_NOSEG


def address(ptr: CData) -> int:
    """The address of a cffi pointer, for the CPython entry points in ``_native._fast``."""
    return int(ffi.cast("uintptr_t", ptr))


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, hardware-accelerated where the CPU has it."""
    buf = ffi.from_buffer(data)
    return int(lib.k7_crc32c(crc, buf, len(buf)))


def hardware_crc() -> bool:
    """True when the kernel uses the CPU's CRC32C instruction."""
    return bool(lib.k7_crc32c_hardware())


set_busy_error(ConcurrentUseError)
set_checks(functools.partial(check_count, name="max_batch"), check_timeout)
lib.k7_bus_install()  # a file shrunk under a map: zero pages and a clear error, not SIGBUS


@contextmanager
def owned(guard: Appender | Fetcher) -> Iterator[None]:
    """Own ``guard`` (a queue's writer or a group's fetcher) for the block, so that another
    thread calling into it meanwhile gets ConcurrentUseError instead of racing on its C
    state. Nested use by the owning thread is fine."""
    took = guard.enter()
    try:
        yield
    finally:
        if took:
            guard.leave()
