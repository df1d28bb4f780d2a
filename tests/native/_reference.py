"""Pure-Python reference of the buffer-level k7 kernel functions (``k7.c``).

Slow and simple on purpose: this is the executable specification that the C kernel is tested
against byte for byte. Every function takes the same arguments as its C counterpart (minus the
output pointers) and returns the same values.

Frame layout (docs/format.md; big-endian fields, k7-compatible)::

    0      1      2              6              10             10+len       frame_size(len)
    +------+------+--------------+--------------+--------------+------------+
    | 0x4B | 0x01 | length (u32) | CRC32C (u32) | payload ...  | zero pad   |
    +------+------+--------------+--------------+--------------+------------+
    magic  flags   0..2^31-1      of the payload  len bytes      to a multiple of 8

A frame is valid when the magic is 0x4B, the flags are exactly 0x01 (committed), the length
is at most 2^31-1 and the payload ends within the scan limit, and the CRC32C matches. An
all-zero header (10 zero bytes) is the end of the written data; any other header that is not a
valid frame is corruption. Scanning positions are frame starts; the positions reported by
:func:`scan` are payload starts (frame start + 10).

The constants come from ``k7core._format`` (the format's, fed from ``k7.h``) and
``k7core._kernel`` (the scan statuses): this module restates the algorithms, not the numbers.
The CRC is the ``crc32c`` package's (the test extra), not the kernel's.

Capacities (``cap``) bound everything: nothing at or after ``cap`` is read or written. A ``cap``
larger than the buffer is a caller error (undefined behaviour in C, ``ValueError`` here).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

from crc32c import crc32c as _crc32c

from k7core._format import FRAME_FLAG_COMMITTED as FLAG_COMMITTED
from k7core._format import FRAME_HEADER as HEADER
from k7core._format import FRAME_MAGIC as MAGIC
from k7core._format import MAX_PAYLOAD as MAX_LEN
from k7core._format import decode_frame_header, encode_frame_header, frame_size
from k7core._kernel import NOFIT, SCAN_CORRUPT, SCAN_EMPTY, SCAN_OK

__all__ = [
    "FLAG_COMMITTED",
    "HEADER",
    "MAGIC",
    "MAX_LEN",
    "NOFIT",
    "SCAN_CORRUPT",
    "SCAN_EMPTY",
    "SCAN_OK",
    "ScanEnd",
    "ScanResult",
    "crc32c",
    "encode_frame",
    "frame_size",
    "gather",
    "last_nonzero",
    "scan",
    "scan_end",
    "write_frame",
]

ReadableBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

class ScanResult(NamedTuple):
    """Result of :func:`scan`: payload positions and lengths, where it stopped, and why."""

    positions: list[int]
    lengths: list[int]
    next_pos: int
    status: int


class ScanEnd(NamedTuple):
    """Result of :func:`scan_end`: end of the last valid frame, number of frames, status."""

    end: int
    frames: int
    status: int


def crc32c(data: ReadableBuffer) -> int:
    """CRC32C (Castagnoli) of ``data``, as stored in the frame header."""
    return _crc32c(data)


def encode_frame(data: ReadableBuffer) -> bytes:
    """The complete encoded frame (header, payload, zero padding) for ``data``."""
    payload = bytes(data)
    n = len(payload)
    header = encode_frame_header(n, crc32c(payload))
    return header + payload + bytes(frame_size(n) - HEADER - n)


def _check_cap(buf: ReadableBuffer, cap: int) -> None:
    if cap > len(buf):
        raise ValueError(f"cap {cap} exceeds the buffer size {len(buf)}")


def write_frame(buf: WritableBuffer, cap: int, pos: int, data: ReadableBuffer) -> int:
    """Write one frame for ``data`` at ``pos``; return the position after it, or ``NOFIT``.

    Writes exactly ``frame_size(len(data))`` bytes (padding included) and nothing else.
    """
    _check_cap(buf, cap)
    payload = bytes(data)
    n = len(payload)
    if n > MAX_LEN or pos < 0:
        return NOFIT
    size = frame_size(n)
    if pos > cap or size > cap - pos:
        return NOFIT
    buf[pos : pos + size] = encode_frame(payload)
    return pos + size


def _check_frame(buf: ReadableBuffer, cap: int, pos: int, limit: int) -> tuple[int, int]:
    """Validate the frame at ``pos``: ``(payload length, SCAN_OK)`` or ``(-1, status)``."""
    if pos < 0 or pos > cap - HEADER:
        return -1, SCAN_EMPTY
    magic, flags, length, crc = decode_frame_header(buf, pos)
    if magic == 0 and flags == 0:
        return -1, SCAN_EMPTY if length == 0 and crc == 0 else SCAN_CORRUPT
    if magic != MAGIC or flags != FLAG_COMMITTED:
        return -1, SCAN_CORRUPT
    if length > MAX_LEN or length > limit - pos - HEADER:
        return -1, SCAN_CORRUPT
    start = pos + HEADER
    with memoryview(buf) as view:
        actual = crc32c(view[start : start + length])
    if actual != crc:
        return -1, SCAN_CORRUPT
    return length, SCAN_OK


def scan(buf: ReadableBuffer, cap: int, pos: int, limit: int, max_n: int) -> ScanResult:
    """Read up to ``max_n`` valid frames starting at frame position ``pos``.

    Frames must have their payload end at or before ``min(limit, cap)``. Stops at the first
    non-frame (status ``SCAN_EMPTY`` or ``SCAN_CORRUPT``, ``next_pos`` = its position), or with
    ``SCAN_OK`` after ``max_n`` frames or once the position reaches the limit. ``next_pos`` is
    clamped to ``cap`` (a last frame's padding may extend past it).
    """
    _check_cap(buf, cap)
    limit = min(limit, cap)
    positions: list[int] = []
    lengths: list[int] = []
    status = SCAN_OK
    while len(positions) < max_n and pos < limit:
        length, status = _check_frame(buf, cap, pos, limit)
        if status != SCAN_OK:
            break
        positions.append(pos + HEADER)
        lengths.append(length)
        pos = min(pos + frame_size(length), cap)
    return ScanResult(positions, lengths, pos, status)


def scan_end(buf: ReadableBuffer, cap: int) -> ScanEnd:
    """Scan all frames from 0: end of the last valid contiguous frame, their count, status."""
    _check_cap(buf, cap)
    pos = 0
    count = 0
    status = SCAN_OK
    while pos < cap:
        length, status = _check_frame(buf, cap, pos, cap)
        if status != SCAN_OK:
            break
        count += 1
        pos = min(pos + frame_size(length), cap)
    return ScanEnd(pos, count, status)


def walk(buf: ReadableBuffer, cap: int, pos: int, target: int) -> int:
    """Follow frame headers (magic, flags, length; no CRC) from ``pos``: the first frame
    boundary at or after ``target``, or -1 when a header on the way is not a frame."""
    while pos < target:
        if pos < 0 or pos > cap - HEADER:
            return -1
        magic, flags, length, _ = decode_frame_header(buf, pos)
        if magic != MAGIC or flags != FLAG_COMMITTED or length > cap - pos - HEADER:
            return -1
        pos += frame_size(length)
    return pos


def last_nonzero(buf: ReadableBuffer, from_: int, cap: int) -> int:
    """End (index + 1) of the last non-zero byte in ``[max(from_, 0), cap)``, else that start."""
    _check_cap(buf, cap)
    from_ = max(from_, 0)
    if cap <= from_:
        return from_
    with memoryview(buf) as view:
        tail = bytes(view[from_:cap]).rstrip(b"\x00")
    return from_ + len(tail)


def gather(
    buf: ReadableBuffer,
    cap: int,
    positions: Sequence[int],
    lengths: Sequence[int],
    dst_cap: int | None = None,
) -> tuple[bytes, list[int]]:
    """Concatenate the slices ``buf[positions[i] : positions[i] + lengths[i]]``.

    Returns the bytes and the ``len + 1`` offsets of each slice in them (starting with 0).
    Raises ``ValueError`` where ``k7_gather`` returns -1: a slice outside ``[0, cap)``, more
    than ``dst_cap`` bytes in total (unlimited when None), or more than 2^31-1 bytes.
    """
    _check_cap(buf, cap)
    if len(positions) != len(lengths):
        raise ValueError("positions and lengths differ in length")
    parts: list[bytes] = []
    offsets = [0]
    total = 0
    with memoryview(buf) as view:
        for pos, length in zip(positions, lengths, strict=True):
            if pos < 0 or length < 0 or pos > cap or length > cap - pos:
                raise ValueError(f"slice ({pos}, {length}) outside [0, {cap})")
            if (dst_cap is not None and length > dst_cap - total) or total + length > MAX_LEN:
                raise ValueError("gathered bytes exceed the destination capacity")
            parts.append(bytes(view[pos : pos + length]))
            total += length
            offsets.append(total)
    return b"".join(parts), offsets
