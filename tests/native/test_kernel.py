"""Tests of the C kernel (k7core/_native/k7.c) through cffi.

* CRC32C against the ``crc32c`` package (hardware path, and the software path that arm64 uses).
* Differential tests: C against the pure-Python reference (``_reference.py`` here), byte
  for byte.
* Fuzzing of the scanners on guard-paged memory: any read outside ``[buf, buf + cap)`` faults.
* Writer, publication/wait, bell and cursor behaviour.

Self-contained: no conftest needed. Linux-only parts (futex waits, mprotect) skip elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import mmap
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import _reference as ref
import crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from k7core._format import CURSOR_SIZE, encode_cursor
from k7core._native._k7 import ffi, lib

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_SETTINGS = settings(SETTINGS, max_examples=300)

PAGE = mmap.PAGESIZE
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
LINUX = sys.platform.startswith("linux")
GUARD = 16  # bytes after cap that must never be touched

payload_st = st.binary(max_size=80)
payloads_st = st.lists(payload_st, max_size=16)


# --------------------------------------------------------------------------- C call helpers


def cbuf(buf: Any) -> Any:
    return ffi.from_buffer("uint8_t[]", buf)


def c_write(buf: bytearray, cap: int, pos: int, data: bytes) -> int:
    return int(lib.k7_write_frame(cbuf(buf), cap, pos, data, len(data)))


def c_scan_ptr(ptr: Any, cap: int, pos: int, limit: int, max_n: int) -> ref.ScanResult:
    size = max(max_n, 0) + 1
    out_pos = ffi.new("int64_t[]", size)
    out_len = ffi.new("int64_t[]", size)
    out_next = ffi.new("int64_t *")
    out_status = ffi.new("int32_t *")
    n = lib.k7_scan(ptr, cap, pos, limit, max_n, out_pos, out_len, out_next, out_status)
    assert 0 <= n <= max(max_n, 0)
    return ref.ScanResult(list(out_pos[0:n]), list(out_len[0:n]), out_next[0], out_status[0])


def c_scan(buf: bytearray, cap: int, pos: int, limit: int, max_n: int) -> ref.ScanResult:
    return c_scan_ptr(cbuf(buf), cap, pos, limit, max_n)


def c_scan_end_ptr(ptr: Any, cap: int) -> ref.ScanEnd:
    count = ffi.new("int64_t *")
    status = ffi.new("int32_t *")
    end = lib.k7_scan_end(ptr, cap, count, status)
    return ref.ScanEnd(end, count[0], status[0])


def c_scan_end(buf: bytearray, cap: int) -> ref.ScanEnd:
    return c_scan_end_ptr(cbuf(buf), cap)


def c_gather_ptr(
    ptr: Any, cap: int, positions: Sequence[int], lengths: Sequence[int], dst_cap: int
) -> tuple[bytes, list[int]] | None:
    n = len(positions)
    pos_c = ffi.new("int64_t[]", list(positions) or [0])
    len_c = ffi.new("int64_t[]", list(lengths) or [0])
    dst = ffi.new("uint8_t[]", max(dst_cap, 1))
    offsets = ffi.new("int32_t[]", n + 1)
    total = lib.k7_gather(ptr, cap, pos_c, len_c, n, dst, dst_cap, offsets)
    if total == -1:
        return None
    assert 0 <= total <= dst_cap
    return bytes(ffi.buffer(dst, total)), list(offsets[0 : n + 1])


def ref_gather(
    buf: bytearray, cap: int, positions: Sequence[int], lengths: Sequence[int], dst_cap: int
) -> tuple[bytes, list[int]] | None:
    try:
        return ref.gather(buf, cap, positions, lengths, dst_cap)
    except ValueError:
        return None


def reference_log(
    cap: int, payloads: Sequence[bytes], extra: int = 0
) -> tuple[bytearray, list[int]]:
    """A buffer of ``cap + extra`` zero bytes with ``payloads`` written from 0 while they fit."""
    buf = bytearray(cap + extra)
    starts = []
    pos = 0
    for p in payloads:
        nxt = ref.write_frame(buf, cap, pos, p)
        if nxt == ref.NOFIT:
            break
        starts.append(pos)
        pos = nxt
    return buf, starts


# --------------------------------------------------------------------------- CRC32C


def test_crc_check_value() -> None:  # the constants: test_header.py
    assert lib.k7_crc32c(0, b"123456789", 9) == 0xE3069283
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert ref.crc32c(b"123456789") == 0xE3069283
    assert lib.k7_crc32c(0, b"", 0) == 0
    assert lib.k7_crc32c_hardware() >= 0  # a truth value (not necessarily 1)


@SETTINGS
@given(data=st.binary(max_size=300), offset=st.integers(0, 15), split=st.integers(0, 300))
def test_crc32c_matches_package(data: bytes, offset: int, split: int) -> None:
    backing = bytearray(b"\xa5" * offset) + bytearray(data) + bytearray(b"\x5a" * 8)
    ptr = cbuf(backing) + offset
    expected = crc32c.crc32c(data)
    assert lib.k7_crc32c(0, ptr, len(data)) == expected
    # chaining: crc(a + b) == crc32c(b, crc(a))
    split = min(split, len(data))
    first = lib.k7_crc32c(0, ptr, split)
    assert lib.k7_crc32c(first, ptr + split, len(data) - split) == expected


def test_crc32c_all_lengths_and_alignments() -> None:
    rnd = random.Random(7)
    backing = bytearray(rnd.randbytes(1100))
    ptr = cbuf(backing)
    for offset, length in itertools.product(range(16), [*range(70), 255, 256, 257, 1023, 1024]):
        chunk = bytes(backing[offset : offset + length])
        assert lib.k7_crc32c(0, ptr + offset, length) == crc32c.crc32c(chunk), (offset, length)


@pytest.fixture(scope="module")
def sw_crc(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int, int], int]:
    """The table-driven software CRC of k7.c (used where there is no SSE4.2, e.g. arm64).

    Compiles k7.c once more with a wrapper exposing its static ``crc_sw``.
    """
    from cffi import FFI

    src = Path(__file__).resolve().parents[2] / "k7core" / "_native"
    tmp = tmp_path_factory.mktemp("k7sw")
    (tmp / "k7sw_wrap.c").write_text(
        f'#include "{src / "k7.c"}"\n'
        "uint32_t k7_test_crc_sw(uint32_t crc, const uint8_t *p, size_t n)"
        " { return ~crc_sw(~crc, p, n); }\n"
    )
    builder = FFI()
    builder.cdef("uint32_t k7_test_crc_sw(uint32_t crc, const uint8_t *p, size_t n);")
    builder.set_source(
        "_k7_crc_sw_test", '#include "k7sw_wrap.c"', include_dirs=[str(src), str(tmp)]
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            so = builder.compile(tmpdir=str(tmp))
    except Exception as exc:  # no C compiler here
        pytest.skip(f"cannot compile the software CRC wrapper: {exc}")
    spec = importlib.util.spec_from_file_location("_k7_crc_sw_test", so)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def crc(seed: int, addr: int, n: int) -> int:
        return int(mod.lib.k7_test_crc_sw(seed, mod.ffi.cast("uint8_t *", addr), n))

    return crc


def test_crc32c_software_path(sw_crc: Callable[[int, int, int], int]) -> None:
    rnd = random.Random(11)
    backing = bytearray(rnd.randbytes(600))
    base = int(ffi.cast("uintptr_t", cbuf(backing)))
    for offset, length in itertools.product(range(16), [*range(40), 63, 64, 65, 500]):
        chunk = bytes(backing[offset : offset + length])
        expected = crc32c.crc32c(chunk)
        assert sw_crc(0, base + offset, length) == expected, (offset, length)
        half = length // 2
        first = sw_crc(0, base + offset, half)
        assert sw_crc(first, base + offset + half, length - half) == expected


# --------------------------------------------------------------------------- write_frame


@SETTINGS
@given(
    cap=st.integers(0, 600),
    start=st.integers(-9, 40),
    payloads=payloads_st,
    seed=st.integers(0, 2**32 - 1),
)
def test_write_frame_matches_reference(
    cap: int, start: int, payloads: list[bytes], seed: int
) -> None:
    initial = bytearray(random.Random(seed).randbytes(cap)) + bytearray(b"\xa5" * GUARD)
    c_buf, r_buf = bytearray(initial), bytearray(initial)
    c_pos = r_pos = start
    for p in payloads:
        c_new = c_write(c_buf, cap, c_pos, p)
        r_new = ref.write_frame(r_buf, cap, r_pos, p)
        assert c_new == r_new
        assert c_buf == r_buf
        if c_new == ref.NOFIT:
            continue
        assert c_new == c_pos + ref.frame_size(len(p)) and c_new % 8 == c_pos % 8
        assert bytes(c_buf[c_pos:c_new]) == ref.encode_frame(p)
        c_pos = r_pos = c_new
    assert c_buf[cap:] == initial[cap:]


def test_write_frame_nofit_and_bad_lengths() -> None:
    buf = bytearray(b"\x77" * 64)
    before = bytes(buf)
    assert c_write(buf, 64, 0, b"x" * 55) == ref.NOFIT  # 10 + 55 -> 72 > 64
    assert c_write(buf, 64, 8, b"x" * 47) == ref.NOFIT  # 64 > 56
    assert c_write(buf, 64, 65, b"") == ref.NOFIT
    assert c_write(buf, 64, -1, b"") == ref.NOFIT
    p = cbuf(buf)
    assert lib.k7_write_frame(p, 64, 0, b"abc", -1) == ref.NOFIT
    assert lib.k7_write_frame(p, 64, 0, b"abc", 2**31) == ref.NOFIT
    assert lib.k7_write_frame(p, 64, 0, b"abc", I64_MAX) == ref.NOFIT
    assert lib.k7_write_frame(p, -8, 0, b"", 0) == ref.NOFIT
    assert bytes(buf) == before
    # exact fit; empty payload is a 16-byte frame with CRC 0
    assert c_write(buf, 64, 48, b"") == 64
    assert bytes(buf[48:64]) == ref.encode_frame(b"")
    assert c_write(buf, 64, 0, b"y" * 54) == 64
    for n in (0, 1, 6, 7, 14, 15, 100):
        assert lib.k7_frame_size(n) == ref.frame_size(n) == -(-(10 + n) // 8) * 8


# --------------------------------------------------------------------------- scanners


MUTATION_KINDS = ("flip", "zero", "set", "truncate", "zero_tail", "garbage_tail")


@st.composite
def mutated_logs(draw: st.DrawFn) -> tuple[bytearray, int, list[int]]:
    """A valid log (possibly with trailing space), then random damage. Returns buf, cap, starts."""
    cap = draw(st.integers(0, 700))
    extra = draw(st.integers(0, 24))
    buf, starts = reference_log(cap, draw(payloads_st), extra)
    if extra:
        buf[cap:] = draw(st.binary(min_size=extra, max_size=extra))  # beyond cap: never read
    mutations = draw(
        st.lists(
            st.tuples(st.sampled_from(MUTATION_KINDS), st.integers(0, 2**20), st.integers(0, 255)),
            max_size=4,
        )
    )
    for kind, where, value in mutations:
        if cap == 0:
            break
        i = where % cap
        if kind == "flip":
            buf[i] ^= 1 << (value % 8)
        elif kind == "zero":
            buf[i] = 0
        elif kind == "set":
            buf[i] = value
        elif kind == "truncate":
            cap = i
        elif kind == "zero_tail":
            buf[i:cap] = bytes(cap - i)
        else:
            buf[i:cap] = random.Random(value).randbytes(cap - i)
    return buf, cap, starts


def positions_st(cap: int, starts: list[int]) -> st.SearchStrategy[int]:
    options: list[st.SearchStrategy[int]] = [st.integers(-12, cap + 12)]
    if starts:
        options.append(st.sampled_from(starts))
    return st.one_of(*options)


@SETTINGS
@given(log=mutated_logs(), data=st.data())
def test_scan_matches_reference(log: tuple[bytearray, int, list[int]], data: st.DataObject) -> None:
    buf, cap, starts = log
    for _ in range(4):
        pos = data.draw(positions_st(cap, starts), label="pos")
        limit = data.draw(
            st.one_of(st.integers(-12, cap + 40), st.just(cap), st.just(I64_MAX)), label="limit"
        )
        max_n = data.draw(st.integers(-2, 20), label="max_n")
        got = c_scan(buf, cap, pos, limit, max_n)
        assert got == ref.scan(buf, cap, pos, limit, max_n)
        event(f"scan status {got.status}, frames {min(len(got.positions), 2)}")


@SETTINGS
@given(log=mutated_logs())
def test_scan_end_matches_reference(log: tuple[bytearray, int, list[int]]) -> None:
    buf, cap, _ = log
    got = c_scan_end(buf, cap)
    assert got == ref.scan_end(buf, cap)
    event(f"scan_end status {got.status}")
    # the end found by scan_end is where a full scan from 0 stops
    full = c_scan(buf, cap, 0, cap, 10**6)
    assert (full.next_pos, len(full.positions)) == (got.end, got.frames)


@SETTINGS
@given(log=mutated_logs(), data=st.data())
def test_walk_matches_reference(log: tuple[bytearray, int, list[int]], data: st.DataObject) -> None:
    buf, cap, starts = log
    for _ in range(4):
        pos = data.draw(positions_st(cap, starts), label="pos")
        target = data.draw(positions_st(cap, starts), label="target")
        got = lib.k7_walk(cbuf(buf), cap, pos, target)
        assert got == ref.walk(buf, cap, pos, target)


@SETTINGS
@given(payloads=payloads_st)
def test_walk_finds_boundaries_of_a_valid_log(payloads: list[bytes]) -> None:
    buf, starts = reference_log(1024, payloads, 0)
    if not starts:
        assert lib.k7_walk(cbuf(buf), 1024, 0, 8) == -1  # zeros are not a frame
        return
    ends: list[int | None] = [*starts[1:], None]
    for start, nxt in zip(starts, ends, strict=True):
        assert lib.k7_walk(cbuf(buf), 1024, 0, start) == start
        if nxt is not None:  # inside the frame at start: the boundary after it
            assert lib.k7_walk(cbuf(buf), 1024, 0, start + 1) == nxt


@SETTINGS
@given(log=mutated_logs(), froms=st.lists(st.integers(-20, 720), min_size=1, max_size=4))
def test_last_nonzero_matches_reference(
    log: tuple[bytearray, int, list[int]], froms: list[int]
) -> None:
    buf, cap, _ = log
    for from_ in [*froms, 0, cap]:
        got = lib.k7_last_nonzero(cbuf(buf), from_, cap)
        assert got == ref.last_nonzero(buf, from_, cap)


@SETTINGS
@given(
    cap=st.integers(0, 200),
    nonzero=st.lists(st.tuples(st.integers(0, 199), st.integers(1, 255)), max_size=3),
    from_=st.integers(-3, 210),
)
def test_last_nonzero_sparse(cap: int, nonzero: list[tuple[int, int]], from_: int) -> None:
    buf = bytearray(cap + 8)
    buf[cap:] = b"\xff" * 8  # beyond cap: must be ignored
    for i, v in nonzero:
        if i < cap:
            buf[i] = v
    expected = max([i + 1 for i, _ in nonzero if max(from_, 0) <= i < cap], default=max(from_, 0))
    assert lib.k7_last_nonzero(cbuf(buf), from_, cap) == expected
    assert ref.last_nonzero(buf, from_, cap) == expected


@SETTINGS
@given(log=mutated_logs(), data=st.data())
def test_gather_matches_reference(
    log: tuple[bytearray, int, list[int]], data: st.DataObject
) -> None:
    buf, cap, _ = log
    found = ref.scan(buf, cap, 0, cap, 50)
    positions, lengths = list(found.positions), list(found.lengths)
    extra = data.draw(
        st.lists(st.tuples(st.integers(-5, cap + 5), st.integers(-5, cap + 5)), max_size=3)
    )
    for p, n in extra:
        i = data.draw(st.integers(0, len(positions)))
        positions.insert(i, p)
        lengths.insert(i, n)
    total = sum(n for n in lengths if n > 0)
    dst_cap = data.draw(st.one_of(st.just(total), st.integers(0, total + 8)))
    got = c_gather_ptr(cbuf(buf), cap, positions, lengths, dst_cap)
    assert got == ref_gather(buf, cap, positions, lengths, dst_cap)
    if not extra and dst_cap >= total:
        assert got is not None
        blob, offsets = got
        pieces = [blob[a:b] for a, b in itertools.pairwise(offsets)]
        assert pieces == [bytes(buf[p : p + n]) for p, n in zip(positions, lengths, strict=True)]


# --------------------------------------------------------------------------- fuzzing


class GuardedArena:
    """Anonymous memory laid out as [PROT_NONE page][read-write page][PROT_NONE page]."""

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, 3 * PAGE)
        self.ptr = ffi.from_buffer("uint8_t[]", self.map)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        addr = int(ffi.cast("uintptr_t", self.ptr))
        for page in (addr, addr + 2 * PAGE):
            if libc.mprotect(page, PAGE, 0) != 0:  # PROT_NONE
                raise OSError(ctypes.get_errno(), "mprotect failed")

    def place(self, data: bytes, at_end: bool) -> tuple[Any, int]:
        """Copy ``data`` against the leading or trailing guard page; return (pointer, offset)."""
        off = 2 * PAGE - len(data) if at_end else PAGE
        self.map[PAGE : 2 * PAGE] = bytes(PAGE)
        self.map[off : off + len(data)] = data
        return self.ptr + off, off


@pytest.fixture(scope="module")
def arena() -> Iterator[GuardedArena]:
    if not LINUX:
        pytest.skip("guard pages use Linux mprotect")
    yield GuardedArena()  # kept mapped until process exit: Python must not touch the guards


def fuzz_bytes() -> st.SearchStrategy[bytes]:
    """Fully random bytes, or frames followed by random bytes."""
    random_bytes = st.binary(max_size=PAGE)

    @st.composite
    def framed(draw: st.DrawFn) -> bytes:
        frames = b"".join(ref.encode_frame(p) for p in draw(st.lists(payload_st, max_size=6)))
        tail = draw(st.binary(max_size=64))
        return (frames + tail)[:PAGE]

    return st.one_of(random_bytes, framed())


any_i64 = st.one_of(st.integers(I64_MIN, I64_MAX), st.integers(-40, PAGE + 40))
fuzz_pos = st.one_of(st.just(0), st.integers(0, PAGE // 8).map(lambda x: 8 * x), any_i64)
fuzz_limit = st.one_of(st.just(I64_MAX), any_i64)


@FUZZ_SETTINGS
@given(
    data=fuzz_bytes(),
    at_end=st.booleans(),
    cap_shrink=st.integers(0, 40),
    neg_cap=st.sampled_from([None] * 8 + [-1, -7, -(2**40)]),
    pos=fuzz_pos,
    limit=fuzz_limit,
    from_=any_i64,
    max_n=st.integers(-3, 64),
)
def test_fuzz_scanners_stay_in_bounds(
    arena: GuardedArena,
    data: bytes,
    at_end: bool,
    cap_shrink: int,
    neg_cap: int | None,
    pos: int,
    limit: int,
    from_: int,
    max_n: int,
) -> None:
    ptr, _ = arena.place(data, at_end)
    # against the trailing guard: cap is the data length; against the leading one: <= it
    cap = len(data) if at_end else max(len(data) - cap_shrink, 0)
    if neg_cap is not None:
        # an empty range: any read at all would hit the trailing guard page
        ptr, cap = arena.ptr + 2 * PAGE, neg_cap
    elif cap == 0:
        ptr = arena.ptr + 2 * PAGE

    res = c_scan_ptr(ptr, cap, pos, limit, max_n)
    lim = min(limit, cap)
    for p, n in zip(res.positions, res.lengths, strict=True):
        assert p >= ref.HEADER and n >= 0 and p + n <= lim <= cap
    if res.positions:
        assert 0 <= res.next_pos <= cap
    else:
        assert res.next_pos == pos
    assert res.status in (ref.SCAN_OK, ref.SCAN_EMPTY, ref.SCAN_CORRUPT)
    event(f"fuzz scan status {res.status}, frames {min(len(res.positions), 2)}")

    end = c_scan_end_ptr(ptr, cap)
    event(f"fuzz scan_end status {end.status}, frames {min(end.frames, 2)}")
    # every frame but the last takes >= 16 bytes; the last one may have its padding cut by cap
    assert 0 <= end.end <= max(cap, 0)
    assert 0 <= end.frames <= (max(cap, 0) + 6) // 16
    assert end.status in (ref.SCAN_OK, ref.SCAN_EMPTY, ref.SCAN_CORRUPT)

    walked = lib.k7_walk(ptr, cap, pos, limit)
    assert walked == -1 or walked >= limit

    lnz = lib.k7_last_nonzero(ptr, from_, cap)
    start = max(from_, 0)
    if start < cap:
        assert start <= lnz <= cap
    else:
        assert lnz == start

    if cap > 0 and neg_cap is None:
        view = bytearray(data[:cap])
        assert res == ref.scan(view, cap, pos, limit, max_n)
        assert end == ref.scan_end(view, cap)
        assert lnz == ref.last_nonzero(view, from_, cap)
        assert walked == ref.walk(view, cap, pos, limit)


@FUZZ_SETTINGS
@given(
    data=st.binary(max_size=PAGE),
    at_end=st.booleans(),
    slices=st.lists(st.tuples(any_i64, any_i64), max_size=6),
    dst_cap=st.integers(0, 2 * PAGE),
)
def test_fuzz_gather_stays_in_bounds(
    arena: GuardedArena,
    data: bytes,
    at_end: bool,
    slices: list[tuple[int, int]],
    dst_cap: int,
) -> None:
    ptr, _ = arena.place(data, at_end)
    cap = len(data)
    if cap == 0:
        ptr = arena.ptr + 2 * PAGE
    positions = [p for p, _ in slices]
    lengths = [n for _, n in slices]
    got = c_gather_ptr(ptr, cap, positions, lengths, dst_cap)
    assert got == ref_gather(bytearray(data), cap, positions, lengths, dst_cap)


@FUZZ_SETTINGS
@given(
    cap=st.integers(0, PAGE),
    at_end=st.booleans(),
    pos=any_i64,
    payload=st.binary(max_size=PAGE),
)
def test_fuzz_write_frame_stays_in_bounds(
    arena: GuardedArena, cap: int, at_end: bool, pos: int, payload: bytes
) -> None:
    ptr, off = arena.place(bytes(cap), at_end)
    got = lib.k7_write_frame(ptr, cap, pos, payload, len(payload))
    mirror = bytearray(cap)
    assert got == ref.write_frame(mirror, cap, pos, payload)
    assert arena.map[off : off + cap] == mirror


# --------------------------------------------------------------------------- writer


class Writer:
    """A ``k7_writer`` over ``seg`` (a bytearray or a mapping) with its own pub and bell."""

    def __init__(
        self, seg: Any, cap: int | None = None, base: int = 0, mode: int = lib.K7_MODE_FLUSH
    ) -> None:
        self.seg = seg
        self.seg_c = ffi.from_buffer("uint8_t[]", seg)
        self.pub = ffi.new("k7_pos *")
        self.bell = ffi.new("k7_bell *")
        self.w = ffi.new("k7_writer *")
        self.w.seg = self.seg_c
        self.w.cap = len(seg) if cap is None else cap
        self.w.base = base
        self.w.pub = self.pub
        self.w.bell = self.bell
        self.w.mode = mode

    @property
    def end(self) -> int:
        return int(lib.k7_load_end(self.pub))

    def state(self) -> tuple[bytes, int, int, int, int]:
        return bytes(self.seg), self.w.pos, self.w.written, self.end, self.pub.seq

    def append_many(self, batch: Sequence[bytes]) -> tuple[int, list[int]]:
        keep = [ffi.from_buffer("uint8_t[]", p) for p in batch]
        datas = ffi.new("uint8_t *[]", keep or 1)
        lens = ffi.new("int64_t[]", [len(p) for p in batch] or [0])
        out = ffi.new("int64_t[]", max(len(batch), 1))
        n = lib.k7_append_many(self.w, datas, lens, len(batch), out)
        return n, list(out[0 : max(n, 0)])

    def append_columnar(
        self, blob: bytes, offsets: Sequence[int], n: int, width: int = 64
    ) -> tuple[int, list[int]]:
        offs = ffi.new(f"int{width}_t[]", list(offsets) or [0])
        out = ffi.new("int64_t[]", max(n, 1))
        fn = lib.k7_append_columnar if width == 64 else lib.k7_append_columnar32
        rc = fn(self.w, blob, len(blob), offs, n, out)
        return rc, list(out[0 : max(rc, 0)])


base_st = st.one_of(st.just(0), st.integers(0, 2**40).map(lambda b: b * 8))


def expected_batch(mirror: bytearray, cap: int, pos: int, batch: Sequence[bytes]) -> list[int]:
    """Write ``batch`` with the reference until the first frame that does not fit."""
    starts = []
    for p in batch:
        nxt = ref.write_frame(mirror, cap, pos, p)
        if nxt == ref.NOFIT:
            break
        starts.append(pos)
        pos = nxt
    return starts


@SETTINGS
@given(cap=st.integers(0, 600), base=base_st, payloads=st.lists(payload_st, max_size=24))
def test_append_matches_reference(cap: int, base: int, payloads: list[bytes]) -> None:
    wr = Writer(bytearray(cap), base=base)
    mirror = bytearray(cap)
    for p in payloads:
        before = wr.state()
        start = wr.w.pos
        nxt = ref.write_frame(mirror, cap, start, p)
        got = lib.k7_append(wr.w, p, len(p))
        if nxt == ref.NOFIT:
            assert got == lib.K7_NOFIT
            assert wr.state() == before  # nothing written, nothing published
            continue
        assert got == base + start
        assert (wr.w.pos, wr.w.written, wr.end) == (nxt, nxt, base + nxt)
        assert wr.pub.seq == before[4] + 1
        assert bytes(wr.seg) == mirror
    assert wr.bell.seq == 0  # "flush" never rings the flusher


@SETTINGS
@given(
    cap=st.integers(0, 600),
    base=base_st,
    batches=st.lists(st.lists(payload_st, max_size=8), max_size=6),
)
def test_append_many_matches_reference(cap: int, base: int, batches: list[list[bytes]]) -> None:
    wr = Writer(bytearray(cap), base=base)
    mirror = bytearray(cap)
    for batch in batches:
        before = wr.state()
        starts = expected_batch(mirror, cap, wr.w.pos, batch)
        n, offsets = wr.append_many(batch)
        assert n == len(starts)
        assert offsets == [base + s for s in starts]
        if n == 0:
            assert wr.state() == before
            continue
        new_pos = starts[-1] + ref.frame_size(len(batch[n - 1]))
        assert (wr.w.pos, wr.w.written, wr.end) == (new_pos, new_pos, base + new_pos)
        assert wr.pub.seq == before[4] + 1  # one publication per batch
        assert bytes(wr.seg) == mirror


@SETTINGS
@given(
    width=st.sampled_from([64, 32]),
    cap=st.integers(0, 600),
    base=base_st,
    batches=st.lists(st.lists(payload_st, max_size=8), max_size=6),
)
def test_append_columnar_matches_reference(
    width: int, cap: int, base: int, batches: list[list[bytes]]
) -> None:
    wr = Writer(bytearray(cap), base=base)
    mirror = bytearray(cap)
    for batch in batches:
        blob = b"".join(batch)
        offsets = [0, *itertools.accumulate(len(p) for p in batch)]
        before = wr.state()
        starts = expected_batch(mirror, cap, wr.w.pos, batch)
        n, out = wr.append_columnar(blob, offsets, len(batch), width)
        assert n == len(starts)
        assert out == [base + s for s in starts]
        if n == 0:
            assert wr.state() == before
        else:
            assert wr.end == base + wr.w.pos and wr.pub.seq == before[4] + 1
        assert bytes(wr.seg) == mirror


@SETTINGS
@given(
    width=st.sampled_from([64, 32]),
    blob=st.binary(max_size=40),
    offsets=st.lists(st.integers(-3, 45), min_size=1, max_size=8),
    n_cut=st.integers(0, 3),
    prefill=st.lists(payload_st, max_size=3),
)
def test_append_columnar_bad_offsets(
    width: int, blob: bytes, offsets: list[int], n_cut: int, prefill: list[bytes]
) -> None:
    """Any offsets[i] < 0, offsets[i+1] < offsets[i] or offsets[n] > buf_len: -3, no effect."""
    cap = 512
    wr = Writer(bytearray(cap), base=4096)
    mirror = bytearray(cap)
    for p in prefill:
        assert lib.k7_append(wr.w, p, len(p)) >= 0
        assert ref.write_frame(mirror, cap, wr.w.pos - ref.frame_size(len(p)), p) == wr.w.pos
    n = max(len(offsets) - 1 - n_cut, 0)
    used = offsets[: n + 1]
    bad = n > 0 and any(a < 0 or b < a or b > len(blob) for a, b in itertools.pairwise(used))
    before = wr.state()
    start = wr.w.pos
    rc, out = wr.append_columnar(blob, offsets, n, width)
    if bad:
        assert rc == lib.K7_BADOFFSETS
        assert wr.state() == before  # nothing written (not even the valid leading frames)
    else:
        batch = [blob[a:b] for a, b in itertools.pairwise(used)]
        starts = expected_batch(mirror, cap, start, batch)
        assert rc == len(starts)
        assert out == [4096 + s for s in starts]
        assert bytes(wr.seg) == mirror


def test_append_columnar_bad_offsets_examples() -> None:
    for width in (64, 32):
        wr = Writer(bytearray(256))
        before = wr.state()
        assert wr.append_columnar(b"aaabbb", [0, 3, 6, 5], 3, width)[0] == -3  # decreasing
        assert wr.append_columnar(b"aaabbb", [-1, 3], 1, width)[0] == -3  # negative
        assert wr.append_columnar(b"aaabbb", [0, 3, 7], 2, width)[0] == -3  # past buf_len
        assert wr.state() == before
        assert wr.append_columnar(b"aaabbb", [0, 3, 6], 2, width) == (2, [0, 16])
        assert wr.append_columnar(b"", [5], 0, width) == (0, [])  # n = 0: offsets unused


def test_append_nofit_and_bad_lengths() -> None:
    wr = Writer(bytearray(64), base=800)
    assert lib.k7_append(wr.w, b"a" * 38, 38) == 800  # a 48-byte frame
    before = wr.state()
    assert lib.k7_append(wr.w, b"b" * 7, 7) == lib.K7_NOFIT  # 24 > 64 - 48
    assert lib.k7_append(wr.w, b"b", -1) == lib.K7_NOFIT
    assert lib.k7_append(wr.w, b"b", 2**31) == lib.K7_NOFIT
    assert wr.state() == before
    assert lib.k7_append(wr.w, b"b" * 6, 6) == 848  # exactly fills the segment
    assert (wr.w.pos, wr.end) == (64, 864)
    assert lib.k7_append(wr.w, b"", 0) == lib.K7_NOFIT
    # a batch stops at the first frame that does not fit; a bad length counts as not fitting
    wr2 = Writer(bytearray(64))
    keep = [ffi.from_buffer("uint8_t[]", b"x" * 6)] * 3
    lens = ffi.new("int64_t[]", [6, -1, 6])
    out = ffi.new("int64_t[]", 3)
    assert lib.k7_append_many(wr2.w, ffi.new("uint8_t *[]", keep), lens, 3, out) == 1
    assert wr2.w.pos == 16 and bytes(wr2.seg[16:]) == bytes(48)


def test_sticky_error_refuses_appends() -> None:
    wr = Writer(bytearray(128))
    assert lib.k7_append(wr.w, b"ok", 2) == 0
    wr.w.err = 5  # as left by a failed msync
    before = wr.state()
    assert lib.k7_append(wr.w, b"x", 1) == lib.K7_EIO
    assert wr.append_many([b"x"])[0] == lib.K7_EIO
    assert wr.append_columnar(b"x", [0, 1], 1)[0] == lib.K7_EIO
    assert wr.append_columnar(b"x", [0, 1], 1, 32)[0] == lib.K7_EIO
    assert wr.state() == before


@SETTINGS
@given(
    payloads=st.lists(payload_st, min_size=1, max_size=10),
    to=st.integers(-8, 700),
    snap=st.booleans(),
)
def test_writer_rollback(payloads: list[bytes], to: int, snap: bool) -> None:
    cap = 700
    wr = Writer(bytearray(cap))
    starts = []
    for p in payloads:
        off = lib.k7_append(wr.w, p, len(p))
        if off >= 0:
            starts.append(off)
    if snap and starts:
        to = starts[to % len(starts)]  # a frame boundary
    old_pos = wr.w.pos
    before = bytes(wr.seg)
    lib.k7_writer_rollback(wr.w, to)
    if 0 <= to <= old_pos:
        assert (wr.w.pos, wr.w.written) == (to, to)
        assert bytes(wr.seg[:to]) == before[:to]
        assert bytes(wr.seg[to:]) == bytes(cap - to)
        if to in starts or to == old_pos:
            status = ref.SCAN_OK if to == cap else ref.SCAN_EMPTY
            assert ref.scan_end(wr.seg, cap) == (to, len([s for s in starts if s < to]), status)
    else:
        assert (wr.w.pos, wr.w.written, bytes(wr.seg)) == (old_pos, old_pos, before)


@pytest.fixture
def file_map(tmp_path: Path) -> Iterator[Callable[[int], mmap.mmap]]:
    """Shared mappings of real files (msync needs page-aligned, file-backed memory)."""
    maps: list[mmap.mmap] = []
    files: list[Any] = []

    def make(size: int) -> mmap.mmap:
        f = (tmp_path / f"map{len(maps)}").open("w+b")
        f.truncate(size)
        files.append(f)
        m = mmap.mmap(f.fileno(), size)
        maps.append(m)
        return m

    yield make
    for m in maps:
        # BufferError: a cdata from ffi.from_buffer is still alive; leave the map to the GC
        with contextlib.suppress(BufferError):
            m.close()
    for f in files:
        f.close()


def test_writer_mode_async_and_sync(file_map: Callable[[int], mmap.mmap]) -> None:
    seg = file_map(2 * PAGE)
    wr = Writer(seg, base=1 << 20, mode=lib.K7_MODE_ASYNC)
    assert lib.k7_append(wr.w, b"hello", 5) == 1 << 20
    assert wr.bell.seq == 1 and wr.end == 0  # async: rings the flusher, publishes later
    assert wr.w.written == 16 and wr.w.synced == 0
    assert lib.k7_writer_sync(wr.w) == 0
    assert (wr.w.synced, wr.w.nsyncs, wr.end) == (16, 1, (1 << 20) + 16)
    assert lib.k7_writer_sync(wr.w) == 0 and wr.w.nsyncs == 1  # nothing new: no msync

    seg2 = file_map(2 * PAGE)
    wr2 = Writer(seg2, base=0, mode=lib.K7_MODE_SYNC)
    assert lib.k7_append(wr2.w, b"x" * PAGE, PAGE) == 0
    assert (wr2.w.nsyncs, wr2.w.synced, wr2.end, wr2.w.err) == (1, PAGE + 16, PAGE + 16, 0)
    assert wr2.bell.seq == 0
    del wr, wr2


def test_rollback_below_synced_then_sync_flushes(file_map: Callable[[int], mmap.mmap]) -> None:
    seg = file_map(PAGE)
    wr = Writer(seg, mode=lib.K7_MODE_ASYNC)
    assert lib.k7_append(wr.w, b"first", 5) == 0
    assert lib.k7_writer_sync(wr.w) == 0 and wr.w.nsyncs == 1
    lib.k7_writer_rollback(wr.w, 0)
    assert lib.k7_append(wr.w, b"other", 5) == 0
    assert lib.k7_writer_sync(wr.w) == 0
    # one msync for the zeros that replaced the synced frame, one for the rewritten frame
    assert wr.w.nsyncs == 3, "the rewritten frame [0, 16) was not msync'd"
    assert wr.w.synced == 16


# --------------------------------------------------------------------------- publish / wait


def run_in_thread(fn: Callable[[], int]) -> tuple[threading.Thread, threading.Event, list[int]]:
    done = threading.Event()
    result: list[int] = []

    def target() -> None:
        result.append(fn())
        done.set()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, done, result


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition (not a synchronisation sleep: the loop checks the real state)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.0005)


def test_wait_returns_immediately_when_end_moved() -> None:
    pub = ffi.new("k7_pos *")
    lib.k7_publish(pub, 4096)
    assert lib.k7_load_end(pub) == 4096 and pub.seq == 1
    t0 = time.monotonic()
    assert lib.k7_wait(pub, 0, 10 * 10**9) == 1
    assert lib.k7_wait(pub, 4095, -1) == 1
    assert time.monotonic() - t0 < 1.0
    assert pub.waiters == 0


@pytest.mark.skipif(not LINUX, reason="futex timing")
def test_wait_times_out() -> None:
    pub = ffi.new("k7_pos *")
    lib.k7_publish(pub, 64)
    t0 = time.monotonic()
    assert lib.k7_wait(pub, 64, 20_000_000) == 0
    elapsed = time.monotonic() - t0
    assert 0.010 <= elapsed < 5.0
    assert lib.k7_wait(pub, 64, 0) == 0
    assert pub.waiters == 0


@pytest.mark.parametrize("n_waiters", [1, 3])
def test_publish_wakes_waiters_in_other_threads(n_waiters: int) -> None:
    pub = ffi.new("k7_pos *")
    waiters = [
        run_in_thread(lambda: int(lib.k7_wait(pub, 0, 30 * 10**9))) for _ in range(n_waiters)
    ]
    if LINUX:  # all waiters registered (and about to block, or blocked, in the futex)
        wait_until(lambda: pub.waiters == n_waiters)
    assert not any(done.is_set() for _, done, _ in waiters)
    t0 = time.monotonic()
    lib.k7_publish(pub, 8)
    for t, done, result in waiters:
        assert done.wait(10.0)
        t.join(10.0)
        assert not t.is_alive() and result == [1]
    assert time.monotonic() - t0 < 10.0  # woken, not timed out (30 s)
    assert pub.waiters == 0


def test_publish_of_the_same_end_is_not_progress() -> None:
    pub = ffi.new("k7_pos *")
    lib.k7_publish(pub, 24)
    lib.k7_publish(pub, 24)
    assert pub.seq == 2
    assert lib.k7_wait(pub, 24, 1_000_000) == 0


def test_bell_ring_wakes_bell_wait() -> None:
    bell = ffi.new("k7_bell *")
    assert lib.k7_bell_seq(bell) == 0
    lib.k7_bell_ring(bell)
    assert lib.k7_bell_seq(bell) == 1
    assert lib.k7_bell_wait(bell, 0, 10 * 10**9) == 1  # already rung since "seen"
    assert lib.k7_bell_wait(bell, 1, 1_000_000) == 0  # times out
    t, done, result = run_in_thread(lambda: int(lib.k7_bell_wait(bell, 1, 30 * 10**9)))
    if LINUX:
        wait_until(lambda: bell.sleeping == 1)
    assert not done.is_set()
    lib.k7_bell_ring(bell)
    assert done.wait(10.0)
    t.join(10.0)
    assert result == [1] and bell.sleeping == 0 and lib.k7_bell_seq(bell) == 2


# --------------------------------------------------------------------------- cursor


def make_cursor(m: mmap.mmap, mode: int) -> tuple[Any, Any, Any]:
    c = ffi.new("k7_cursor *")
    bell = ffi.new("k7_bell *")
    ptr = ffi.from_buffer("uint8_t[]", m)
    c.map = ptr
    c.bell = bell
    c.mode = mode
    return c, bell, ptr


@SETTINGS
@given(values=st.lists(st.integers(I64_MIN, I64_MAX), min_size=1, max_size=5))
def test_cursor_store_load_big_endian(values: list[int]) -> None:
    m = mmap.mmap(-1, PAGE)
    c, bell, ptr = make_cursor(m, lib.K7_MODE_FLUSH)
    m[8:16] = b"\xee" * 8
    for v in values:
        assert lib.k7_cursor_store(c, v) == 0
        assert m[:CURSOR_SIZE] == encode_cursor(v)
        assert lib.k7_cursor_load(c) == v
        assert m[8:16] == b"\xee" * 8  # only the first 8 bytes
    assert (c.dirty, bell.seq) == (0, 0)
    m[:CURSOR_SIZE] = encode_cursor(values[0])
    assert lib.k7_cursor_load(c) == values[0]
    ffi.release(ptr)
    m.close()


def test_cursor_async_mode_dirty_and_bell(
    file_map: Callable[[int], mmap.mmap], tmp_path: Path
) -> None:
    m = file_map(PAGE)
    c, bell, _ = make_cursor(m, lib.K7_MODE_ASYNC)
    assert lib.k7_cursor_store(c, 1234) == 0
    assert (c.dirty, bell.seq) == (1, 1)
    assert lib.k7_cursor_store(c, -5) == 0
    assert (c.dirty, bell.seq) == (1, 1)  # already dirty: no second ring
    assert lib.k7_cursor_load(c) == -5
    assert lib.k7_cursor_sync(c) == 0
    assert (c.dirty, c.err) == (0, 0)
    assert lib.k7_cursor_sync(c) == 0  # clean: nothing to do
    assert (tmp_path / "map0").read_bytes()[:CURSOR_SIZE] == encode_cursor(-5)
    assert lib.k7_cursor_store(c, 2**40) == 0
    assert (c.dirty, bell.seq) == (1, 2)


def test_cursor_sync_mode(file_map: Callable[[int], mmap.mmap], tmp_path: Path) -> None:
    m = file_map(PAGE)
    c, bell, _ = make_cursor(m, lib.K7_MODE_SYNC)
    assert lib.k7_cursor_store(c, I64_MAX) == 0
    assert (c.dirty, bell.seq, c.err) == (0, 0, 0)
    assert (tmp_path / "map0").read_bytes()[:CURSOR_SIZE] == encode_cursor(I64_MAX)
    assert lib.k7_cursor_load(c) == I64_MAX
    assert lib.k7_cursor_sync(c) == 0
