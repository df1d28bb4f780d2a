"""``k7.h`` is the one source of the format's numbers: every ``#define`` of the header has a
Python counterpart (in ``k7core._format``, or ``k7core._kernel`` for the kernel's return
codes) with the same value, and the cursor codec and ``frame_size`` agree with the kernel.

The header's values are read from its text here, not from the compiled module, so a stale
build or a number restated by hand in Python fails too.
"""

from __future__ import annotations

import re

import pytest

from k7core import _format, _kernel
from k7core._format import Fsync
from k7core._native._k7 import ffi, lib
from tests._queuehelp import ROOT

HEADER = ROOT / "k7core" / "_native" / "k7.h"

# the Python counterpart of every #define of k7.h
COUNTERPARTS: dict[str, int] = {
    "K7_HEADER": _format.FRAME_HEADER,
    "K7_MAGIC": _format.FRAME_MAGIC,
    "K7_FLAG_COMMITTED": _format.FRAME_FLAG_COMMITTED,
    "K7_ALIGN": _format.FRAME_ALIGN,
    "K7_MAX_LEN": _format.MAX_PAYLOAD,
    "K7_MAX_OFFSET": _format.MAX_OFFSET,
    "K7_MAX_SEGMENT": _format.MAX_SEGMENT_SIZE,
    "K7_CURSOR_FILE_SIZE": _format.CURSOR_FILE_SIZE,
    "K7_CURSOR_SIZE": _format.CURSOR_SIZE,
    "K7_POS_FILE_SIZE": _format.POSITION_FILE_SIZE,
    "K7_MODE_FLUSH": Fsync.FLUSH.code,
    "K7_MODE_ASYNC": Fsync.ASYNC.code,
    "K7_MODE_SYNC": Fsync.SYNC.code,
    "K7_SCAN_OK": _kernel.SCAN_OK,
    "K7_SCAN_EMPTY": _kernel.SCAN_EMPTY,
    "K7_SCAN_CORRUPT": _kernel.SCAN_CORRUPT,
    "K7_SCAN_NOSEG": _kernel.SCAN_NOSEG,
    "K7_NOFIT": _kernel.NOFIT,
    "K7_EIO": _kernel.EIO,
    "K7_BADOFFSETS": _kernel.BADOFFSETS,
    "K7_TOOLARGE": _kernel.TOOLARGE,
    "K7_BUSY": _kernel.BUSY,
    "K7_RECOVER": _kernel.RECOVER,
    "K7_REMAP": _kernel.REMAP,
    "K7_LOCKTIMEOUT": _kernel.LOCKTIMEOUT,
    "K7_SHARED_FILE_SIZE": _format.SHARED_FILE_SIZE,
    "K7_SHARED_WRITERS": _format.SHARED_WRITERS,
}

_SYMBOLS = {"INT64_MAX": 2**63 - 1}


def header_defines() -> dict[str, int]:
    """``#define NAME VALUE`` of k7.h, each value an integer literal (decimal or hex, maybe
    negative in parentheses, maybe with an ``LL`` suffix) or ``INT64_MAX``."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out = {}
    for name, value in re.findall(r"^#define (\w+) +(.+?)\s*$", text, flags=re.M):
        literal = value.strip("()").removesuffix("LL")
        out[name] = _SYMBOLS[literal] if literal in _SYMBOLS else int(literal, 0)
    return out


def test_every_header_constant_has_an_equal_python_counterpart() -> None:
    defines = header_defines()
    assert set(defines) == set(COUNTERPARTS), "a #define of k7.h without a Python counterpart"
    for name, value in defines.items():
        assert COUNTERPARTS[name] == value, name
        assert getattr(lib, name) == value, f"{name}: the compiled module is stale"


def test_frame_header_codec_agrees_with_the_kernel() -> None:
    frame = bytearray(64)
    assert lib.k7_write_frame(ffi.from_buffer(frame), 64, 0, b"abc", 3) == 16
    header = _format.encode_frame_header(3, lib.k7_crc32c(0, b"abc", 3))
    assert len(header) == _format.FRAME_HEADER and bytes(frame[: _format.FRAME_HEADER]) == header
    assert _format.decode_frame_header(frame) == (
        _format.FRAME_MAGIC, _format.FRAME_FLAG_COMMITTED, 3, lib.k7_crc32c(0, b"abc", 3)
    )


def test_frame_size_agrees_with_the_kernel() -> None:
    for length in [*range(0, 40), 1000, 4095, _format.MAX_PAYLOAD]:
        assert _format.frame_size(length) == lib.k7_frame_size(length)
        assert _format.frame_size(length) % _format.FRAME_ALIGN == 0


@pytest.mark.parametrize("value", [0, 8, -8, _format.MAX_OFFSET, -(2**63), 0x0102030405060708])
def test_cursor_codec_agrees_with_the_kernel(value: int) -> None:
    raw = _format.encode_cursor(value)
    assert len(raw) == _format.CURSOR_SIZE
    mapped = ffi.new("uint8_t[]", _format.CURSOR_FILE_SIZE)
    cursor = ffi.new("k7_cursor *")
    cursor.map = mapped
    cursor.mode = Fsync.FLUSH.code
    assert lib.k7_cursor_store(cursor, value) == 0
    assert bytes(ffi.buffer(mapped, _format.CURSOR_SIZE)) == raw
    assert _format.decode_cursor(raw + b"\xff" * 8) == value == lib.k7_cursor_load(cursor)


def test_position_record_fits_its_file() -> None:
    assert ffi.sizeof("k7_pos") <= _format.POSITION_FILE_SIZE
    assert ffi.offsetof("k7_pos", "end") % 8 == 0  # one aligned 8-byte store
