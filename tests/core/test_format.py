"""The on-disk format (docs/format.md), checked by an independent decoder.

A queue is written through k7core, closed, and the directory is then decoded here (with the
format helpers of ``tests/_queuehelp.py``) with nothing but ``os``, ``struct`` and the
``crc32c`` PyPI package: no k7core code (not its CRC, not its constants, not its segment-name
helper) takes part in the decoding. What the
decoder checks:

- segment files are named ``seg-%020d.k7`` after their base offset; the first base is 0 and
  every next base is the previous base plus the position at which the previous segment was
  sealed (and the first frame of the next segment did not fit in what was left);
- frames: magic 0x4B, flags 0x01, u32 BE length, u32 BE CRC32C of the payload, the payload,
  zero padding to a multiple of 8; after the last frame of a segment only zero bytes;
- every segment file written with ``segment_size`` is exactly ``segment_size`` bytes;
- cursor files are 4096 bytes with the committed offset as a BE int64 at byte 0;
- files the project adds never match ``seg-*.k7`` or ``cursor-*.k7`` (k7 would read them).
"""

from __future__ import annotations

import array
import fnmatch
import os
import random
import re
import struct
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import (
    ALIGN,
    FLAG_COMMITTED,
    HEADER,
    MAGIC,
    SEG_RE,
    crc32c,
    encode_frame,
    frame_size,
    replay,
    seg_bases,
    seg_name,
)

CURSOR_SIZE = 4096
CURSOR_RE = re.compile(r"^cursor-(.+)\.k7$")
SEGMENT_SIZE = 4096


class Decoded:
    def __init__(self) -> None:
        self.segments: list[tuple[int, str, int, int]] = []  # base, name, sealed pos, file size
        self.frames: list[tuple[int, bytes]] = []  # global offset, payload
        self.cursors: dict[str, int] = {}
        self.others: list[str] = []


def decode_segment(data: bytes, base: int, frames: list[tuple[int, bytes]]) -> int:
    """Decode the frames of one segment; return the position after its last frame."""
    pos = 0
    while pos + HEADER <= len(data):
        if data[pos] == 0:
            break  # end of written data (must be followed by zeros only: checked by the caller)
        assert data[pos] == MAGIC, f"bad magic {data[pos]:#x} at {base + pos}"
        assert data[pos + 1] == FLAG_COMMITTED, f"bad flags {data[pos + 1]:#x} at {base + pos}"
        length, want_crc = struct.unpack_from(">II", data, pos + 2)
        assert length < 2**31, f"length {length} out of range at {base + pos}"
        assert pos + HEADER + length <= len(data), f"frame at {base + pos} overruns its segment"
        payload = data[pos + HEADER : pos + HEADER + length]
        assert crc32c(payload) == want_crc, f"CRC32C mismatch at {base + pos}"
        size = frame_size(length)
        assert pos + size <= len(data), f"padding of frame at {base + pos} overruns the file"
        pad = data[pos + HEADER + length : pos + size]
        assert pad == bytes(len(pad)), f"non-zero padding after frame at {base + pos}"
        frames.append((base + pos, payload))
        pos += size
    return pos


def decode_queue(d: Path) -> Decoded:
    out = Decoded()
    names = sorted(os.listdir(d))
    segs = []
    for name in names:
        m = SEG_RE.match(name)
        if m:
            segs.append((int(m.group(1)), name))
            continue
        assert not fnmatch.fnmatch(name, "seg-*.k7"), f"{name} looks like a segment to k7"
        c = CURSOR_RE.match(name)
        if c:
            data = (d / name).read_bytes()
            assert len(data) == CURSOR_SIZE, f"{name} is {len(data)} bytes"
            out.cursors[c.group(1)] = struct.unpack_from(">q", data, 0)[0]
            continue
        out.others.append(name)
    segs.sort()
    expected_base = 0
    for i, (base, name) in enumerate(segs):
        assert name == seg_name(base)
        assert base == expected_base, f"{name}: base {base}, expected {expected_base}"
        data = (d / name).read_bytes()
        first = len(out.frames)
        sealed = decode_segment(data, base, out.frames)
        assert data[sealed:] == bytes(len(data) - sealed), f"non-zero bytes after {base + sealed}"
        if i > 0:
            # the previous segment was sealed because this segment's first frame did not fit
            _, _, prev_sealed, prev_size = out.segments[-1]
            assert len(out.frames) > first, f"sealed segment before {name} followed by nothing"
            assert frame_size(len(out.frames[first][1])) > prev_size - prev_sealed
        out.segments.append((base, name, sealed, len(data)))
        expected_base = base + sealed
    return out


def test_format_module_states_this_format() -> None:
    """k7core's one source of the format's numbers (``_format``, fed from ``k7.h``) says what
    this decoder reads."""
    from k7core import _format

    assert (_format.FRAME_MAGIC, _format.FRAME_FLAG_COMMITTED) == (MAGIC, FLAG_COMMITTED)
    assert (_format.FRAME_HEADER, _format.FRAME_ALIGN) == (HEADER, ALIGN)
    assert _format.CURSOR_FILE_SIZE == CURSOR_SIZE
    assert _format.encode_cursor(-2) == struct.pack(">q", -2)
    assert _format.encode_frame_header(5, 7) == bytes([MAGIC, FLAG_COMMITTED]) + struct.pack(
        ">II", 5, 7
    )
    assert all(_format.frame_size(n) == frame_size(n) for n in range(64))


def test_decoder_crc_is_crc32c() -> None:
    """The decoder's CRC is CRC32C (Castagnoli), standard check value."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_segments_frames_and_cursors_decode_independently(tmp_path: Path, fsync: str) -> None:
    d = tmp_path / "q"
    rng = random.Random(20261122)
    written: list[tuple[int, bytes]] = []
    exact_fill_offsets: list[int] = []
    whole_segment_offsets: list[int] = []
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync=fsync) as q:

        def put(p: bytes) -> int:
            off = q.enqueue(p)
            written.append((off, p))
            return off

        # mixed sizes, single enqueues and batches
        for _ in range(25):
            put(rng.randbytes(rng.choice([1, 5, 6, 7, 8, 13, 64, 200, 333, 700, 1500])))
        batch = [rng.randbytes(rng.randint(1, 400)) for _ in range(12)]
        written.extend(zip(q.enqueue_many(batch), batch, strict=True))

        # a frame that exactly fills the rest of the current segment (twice, in two segments)
        for _ in range(2):
            next_off = written[-1][0] + frame_size(len(written[-1][1]))
            rest = SEGMENT_SIZE - (next_off - seg_bases(d)[-1])
            if rest < HEADER + 6:  # nothing but an empty frame fits: start a new segment
                put(rng.randbytes(100))
                next_off = written[-1][0] + frame_size(100)
                rest = SEGMENT_SIZE - (next_off - seg_bases(d)[-1])
            seg_before = seg_bases(d)[-1]
            off = put(rng.randbytes(rest - HEADER))
            assert off == next_off, "a frame that exactly fits must not roll"
            assert seg_bases(d)[-1] == seg_before
            exact_fill_offsets.append(off)
            after = put(rng.randbytes(50))
            assert after == seg_before + SEGMENT_SIZE, "the segment was sealed when full"
            assert seg_bases(d)[-1] == after

        # a frame exactly the size of an empty segment: gets a segment of its own
        off = put(rng.randbytes(SEGMENT_SIZE - HEADER))
        whole_segment_offsets.append(off)
        assert seg_bases(d)[-1] == off
        after = put(b"after a full segment")
        assert after == off + SEGMENT_SIZE
        for _ in range(10):
            put(rng.randbytes(rng.randint(1, 900)))

        offsets = [o for o, _ in written]
        # cursors: "workers" acks exactly the first 17 messages, "analytics" seeks,
        # "idle" is only opened
        with q.consumer_group("workers", cursor_fsync="sync") as g:
            got = 0
            while got < 17:
                for m in g.poll(max_batch=17 - got, timeout=1.0):
                    assert g.ack(m)
                    got += 1
            workers_committed = g.committed
        with q.consumer_group("analytics", cursor_fsync="flush") as g:
            g.seek(offsets[30])
            analytics_committed = g.committed
        with q.consumer_group("idle", cursor_fsync="async"):
            pass
        assert replay(q, "format-check", max_batch=512) == written

    assert workers_committed == offsets[17]
    assert analytics_committed == offsets[30]

    dec = decode_queue(d)
    assert dec.frames == written
    assert len(dec.segments) >= 5
    for _, name, _, size in dec.segments:
        assert size == SEGMENT_SIZE, f"{name} is {size} bytes"
    # the segments holding the exactly-fitting frames were sealed at segment_size
    sealed_at = {base: sealed for base, _, sealed, _ in dec.segments}
    for off in exact_fill_offsets + whole_segment_offsets:
        seg = max(b for b in sealed_at if b <= off)
        assert sealed_at[seg] == SEGMENT_SIZE
        assert off - seg + frame_size(len(dict(written)[off])) == SEGMENT_SIZE
    assert dec.cursors == {
        "workers": offsets[17],
        "analytics": offsets[30],
        "idle": 0,
        "format-check": 0,
    }


def test_empty_payloads_decode_independently(tmp_path: Path) -> None:
    d = tmp_path / "q"
    seq = [b"", b"x", b"", b"", b"y" * 7, b"", b"z" * 1000, b""]
    written: list[tuple[int, bytes]] = []
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
        for p in seq * 4:  # several segments' worth, ending with an empty payload
            written.append((q.enqueue(p), p))
    dec = decode_queue(d)
    assert dec.frames == written
    assert len(dec.segments) >= 2
    # the empty frame is exactly magic, flags, zero length, CRC32C("") == 0, padding to 16
    empty_off = written[0][0]
    raw = (d / dec.segments[0][1]).read_bytes()
    assert raw[empty_off : empty_off + 16] == b"\x4b\x01" + bytes(14)
    assert encode_frame(b"") == b"\x4b\x01" + bytes(14)
    # recovery does not mistake a trailing empty frame for the end of the log
    end = written[-1][0] + frame_size(0)
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
        assert q.end == end
        assert q.enqueue(b"next") == end
        assert replay(q, "format-check", max_batch=512) == [*written, (end, b"next")]
    assert decode_queue(d).frames == [*written, (end, b"next")]


PAYLOADS = [
    b"hello",
    b"",
    b"\x00",
    b"\x00" * 6,  # header + payload exactly 16: no padding
    b"seven!!",  # 17 bytes -> 7 bytes of padding
    bytes(range(256)) + b"tail",
    b"\xff" * 1000,
]


@pytest.mark.parametrize("method", ["enqueue", "enqueue_many", "enqueue_columnar"])
def test_frame_bytes_equal_hand_encoding(tmp_path: Path, method: str) -> None:
    d = tmp_path / "q"
    seg = 8192
    payloads = [*PAYLOADS, random.Random(3).randbytes(seg - HEADER)]  # one exactly a segment
    with k7core.Queue(d, segment_size=seg, fsync="flush") as q:
        if method == "enqueue":
            offsets = [q.enqueue(p) for p in payloads]
        elif method == "enqueue_many":
            offsets = q.enqueue_many(payloads)
        else:
            data = b"".join(payloads)
            bounds = array.array("q", [0])
            for p in payloads:
                bounds.append(bounds[-1] + len(p))
            offsets = list(q.enqueue_columnar(data, bounds))
    bases = seg_bases(d)
    files = {b: (d / seg_name(b)).read_bytes() for b in bases}
    for off, p in zip(offsets, payloads, strict=True):
        base = max(b for b in bases if b <= off)
        local = off - base
        expect = encode_frame(p)
        assert files[base][local : local + len(expect)] == expect, f"frame for {p[:16]!r}..."
    # the whole segment-sized payload fills a segment of its own from byte 0
    assert offsets[-1] in bases
    assert files[offsets[-1]] == encode_frame(payloads[-1])


def test_extra_files_use_names_k7_ignores(tmp_path: Path) -> None:
    """Lock, position, torn-tail side files...: never ``seg-*.k7`` nor ``cursor-*.k7``."""
    d = tmp_path / "q"
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
        offs = [q.enqueue(b"m%d" % i * 40) for i in range(200)]
        with q.consumer_group("g1") as g:
            g.seek(offs[5])
    last = seg_bases(d)[-1]
    path = d / seg_name(last)
    raw = bytearray(path.read_bytes())
    tail = offs[-1] - last + frame_size(len(b"m199" * 40))
    raw[tail + 100 : tail + 108] = b"garbage!"  # a torn tail to be cut and kept aside
    path.write_bytes(bytes(raw))

    def check_names() -> list[str]:
        names = os.listdir(d)
        segs = {n for n in names if SEG_RE.match(n)}
        curs = {n for n in names if CURSOR_RE.match(n)}
        assert {n for n in names if fnmatch.fnmatch(n, "seg-*.k7")} == segs
        assert {n for n in names if fnmatch.fnmatch(n, "cursor-*.k7")} == curs
        assert curs <= {"cursor-g1.k7", "cursor-g2.k7"}
        return sorted(set(names) - segs - curs)

    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="async") as q:
        assert any(n.startswith("k7py-torn-") for n in os.listdir(d))
        with q.consumer_group("g2") as g:
            g.poll(max_batch=3, timeout=1.0)
            extras_open = check_names()  # while a writer, a group and a lock are live
        with k7core.Queue(d, readonly=True) as ro, ro.consumer_group("g1"):
            extras_ro = check_names()
    extras_closed = check_names()
    for name in {*extras_open, *extras_ro, *extras_closed}:
        assert not fnmatch.fnmatch(name, "seg-*.k7")
        assert not fnmatch.fnmatch(name, "cursor-*.k7")
    # and the whole directory still decodes as a valid k7 queue
    dec = decode_queue(d)
    assert [o for o, _ in dec.frames] == offs
    assert dec.cursors["g1"] == offs[5]
