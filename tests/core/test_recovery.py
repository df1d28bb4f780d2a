"""Recovery from torn and corrupted segments (docs/format.md#recovery), property-based
with hypothesis.

The property tests write random messages, close the queue, damage the LAST segment file
(truncate it, zero a range, flip bytes), reopen it as the writer and read everything back.
The expected outcome is computed here from the original offsets and sizes alone:

- the frames before the first damaged frame of the last segment (and every frame of the
  earlier segments) come back, each payload at the offset originally returned for it;
  nothing from the first damaged frame on is delivered;
- opening never raises; bytes discarded by recovery are reported as a WARNING on logger
  ``k7core`` and kept in a ``k7py-torn-*`` side file; nothing is reported when nothing
  non-zero was discarded;
- a new enqueue lands right after the intact prefix and reads back; a second reopen gives the
  same result, so stale frames after the cut never reappear.

"Damaged" means: a byte of the frame's header or payload changed (or was cut off). Padding
is not covered by the CRC and is skipped by every reader, so changed padding bytes do not
damage a frame.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import k7core
from tests._queuehelp import (
    FLAG_COMMITTED,
    HEADER,
    MAGIC,
    crc32c,
    drain_to_end,
    frame_size,
    replay,
    seg_bases,
    seg_name,
    write_queue,
)

# The format restated independently of k7core (tests/_queuehelp.py's format helpers, as in
# test_format.py): the validator below checks what recovery keeps against the rules, not
# against k7core's own constants.
SEGMENT_SIZE = 8192


def torn_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.startswith("k7py-torn-"))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def warnings(self) -> list[logging.LogRecord]:
        return [r for r in self.records if r.levelno >= logging.WARNING]


@contextlib.contextmanager
def k7_log() -> Iterator[_Records]:
    """Capture logger ``k7core`` (caplog is function-scoped, hypothesis runs many examples)."""
    logger = logging.getLogger("k7core")
    h = _Records()
    old = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.DEBUG)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        logger.setLevel(old)


# --------------------------------------------------------------------------------------
# the damage model
# --------------------------------------------------------------------------------------


@dataclass
class Damage:
    kind: str  # "truncate" | "zero" | "flip"
    at: int
    length: int = 0  # zero: range length; flip: number of bytes
    masks: bytes = b""

    def apply(self, data: bytes) -> bytes:
        if self.kind == "truncate":
            return data[: self.at]
        b = bytearray(data)
        if self.kind == "zero":
            end = min(len(b), self.at + self.length)
            b[self.at : end] = bytes(end - self.at)
        else:
            for i, m in enumerate(self.masks):
                if self.at + i < len(b):
                    b[self.at + i] ^= m
        return bytes(b)


def valid_frame_at(data: bytes, pos: int) -> bool:
    """Independent check of one frame against the format rules (magic, flags, length, CRC32C)."""
    if pos + HEADER > len(data) or data[pos] != MAGIC or data[pos + 1] != FLAG_COMMITTED:
        return False
    length = int.from_bytes(data[pos + 2 : pos + 6], "big")
    if length >= 2**31 or pos + HEADER + length > len(data):
        return False
    crc = int.from_bytes(data[pos + 6 : pos + 10], "big")
    return crc32c(data[pos + HEADER : pos + HEADER + length]) == crc


def changed_positions(orig: bytes, damaged: bytes) -> list[int]:
    out = [i for i in range(min(len(orig), len(damaged))) if orig[i] != damaged[i]]
    return out


def check_recovery(
    d: Path,
    payloads: list[bytes],
    offsets: list[int],
    damage: Damage,
    tag: str,
) -> None:
    written = list(zip(offsets, payloads, strict=True))
    bases = seg_bases(d)
    last_base = bases[-1]
    path = d / seg_name(last_base)
    orig = path.read_bytes()
    assert len(orig) == SEGMENT_SIZE
    earlier = {b: (d / seg_name(b)).read_bytes() for b in bases[:-1]}
    damaged = damage.apply(orig)
    path.write_bytes(damaged)
    # A last segment cut to a length that is not a multiple of 8 is zero-extended to the next
    # one on open (offsets stay 8-aligned): expectations are computed on what the engine sees.
    damaged += bytes(-len(damaged) % 8)

    # ---- expected outcome, from the original offsets and sizes alone
    changed = set(changed_positions(orig, damaged))
    cut_at = len(damaged) if len(damaged) < len(orig) else None  # truncation point
    keep = 0
    last_keep_end = 0  # local end (with padding) of the last intact frame of the last segment
    for off, p in written:
        if off < last_base:
            keep += 1
            continue
        s, e = off - last_base, off - last_base + HEADER + len(p)
        if (cut_at is not None and e > cut_at) or any(i in changed for i in range(s, e)):
            # The format cannot see damage that leaves a valid frame: zeroing exactly the
            # length and CRC fields turns any frame into a valid empty message (CRC32C of
            # b"" is 0). The property is about detectable damage; that case is pinned by
            # test_zeroed_length_and_crc_reads_as_an_empty_message.
            undetectable = valid_frame_at(damaged, s)
            if undetectable:
                event("undetectable damage (still a valid frame): skipped")
            assume(not undetectable)
            break
        keep += 1
        last_keep_end = s + frame_size(len(p))
    expected = written[:keep]
    expected_end = last_keep_end
    tolerated_ends = {expected_end}
    event(f"segments: {len(bases)}")
    event("frames lost" if keep < len(written) else "no frame lost")

    # ---- reopen as the writer: never raises
    with k7_log() as log1:
        q = k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush")
    try:
        end = q.end - last_base
        assert end in tolerated_ends, f"write position {end}, expected {expected_end}"
        # the earlier (sealed) segments were not touched
        for b, raw in earlier.items():
            assert (d / seg_name(b)).read_bytes() == raw
        disk = path.read_bytes()
        # stale bytes after the cut are gone from the segment (zeroed)
        assert disk[end:] == bytes(len(disk) - end)
        assert disk[:end] == damaged[:end]
        if end == 0 and len(damaged) < SEGMENT_SIZE:
            assert len(disk) == SEGMENT_SIZE  # a short, empty last segment is re-created
        else:
            assert len(disk) == len(damaged)  # an existing segment keeps its file size

        # discarded non-zero bytes: warned about and kept in a side file
        tail = damaged[end:]
        discarded = tail.rstrip(b"\x00")
        sides = torn_files(d)
        warns = [r for r in log1.warnings() if r.name.startswith("k7core")]
        event("bytes discarded" if discarded else "nothing discarded")
        if discarded:
            assert len(warns) == 1, [r.getMessage() for r in log1.records]
            assert len(sides) == 1
            assert sides[0].read_bytes() == discarded
        else:
            assert warns == []
            assert sides == []

        got = replay(q)
        assert got == expected
        # ---- a new message lands right after the intact prefix and reads back
        new = b"after-" + tag.encode() + bytes(range(37))
        new_off = q.enqueue(new)
        assert new_off - last_base == end
        assert replay(q) == [*expected, (new_off, new)]
    finally:
        q.close()

    # ---- a second reopen: same result, nothing reported, stale frames never reappear
    with k7_log() as log2:
        with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
            assert q.end == new_off + frame_size(len(new))
            assert replay(q, "verify2") == [*expected, (new_off, new)]
        with k7core.Queue(d, readonly=True) as q:
            assert replay(q, "verify3") == [*expected, (new_off, new)]
    assert log2.warnings() == []
    assert len(torn_files(d)) == len(sides)


# --------------------------------------------------------------------------------------
# hypothesis strategies
# --------------------------------------------------------------------------------------


@st.composite
def messages(draw: st.DrawFn) -> list[bytes]:
    n = draw(st.one_of(st.integers(0, 12), st.integers(40, 140)), label="count")
    sizes = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n), label="sizes")
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    # mostly random bytes, sometimes runs of zeros (zeroing those changes nothing)
    zeros = draw(st.booleans())
    return [bytes(n) if zeros and i % 5 == 0 else rng.randbytes(n) for i, n in enumerate(sizes)]


def last_segment_layout(payloads: list[bytes], offsets: list[int], last_base: int) -> list[int]:
    """Interesting positions in the last segment: frame starts, payload ends, data end."""
    points = [0]
    for off, p in zip(offsets, payloads, strict=True):
        if off >= last_base:
            s = off - last_base
            points += [s, s + 1, s + HEADER - 1, s + HEADER, s + HEADER + len(p),
                       s + frame_size(len(p))]
    return sorted({min(max(x, 0), SEGMENT_SIZE - 1) for x in points})


def position(data: st.DataObject, layout: list[int]) -> int:
    data_end = layout[-1]
    return data.draw(
        st.one_of(
            st.sampled_from(layout),
            st.integers(0, min(data_end + 16, SEGMENT_SIZE - 1)),
            st.integers(0, SEGMENT_SIZE - 1),
        ),
        label="position",
    )


SETTINGS = settings(
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _run(
    data: st.DataObject,
    payloads: list[bytes],
    make_damage: Callable[[st.DataObject, list[int]], Damage],
) -> None:
    with tempfile.TemporaryDirectory(prefix="k7-recovery-") as tmp:
        d = Path(tmp) / "q"
        offsets = write_queue(d, payloads, segment_size=SEGMENT_SIZE)
        assert offsets == sorted(offsets)
        last_base = seg_bases(d)[-1]
        layout = last_segment_layout(payloads, offsets, last_base)
        damage = make_damage(data, layout)
        check_recovery(d, payloads, offsets, damage, damage.kind)


@SETTINGS
@given(payloads=messages(), data=st.data())
def test_truncated_last_segment(payloads: list[bytes], data: st.DataObject) -> None:
    def make(data: st.DataObject, layout: list[int]) -> Damage:
        at = data.draw(
            st.one_of(st.just(0), st.sampled_from(layout), st.integers(0, SEGMENT_SIZE - 1))
        )
        return Damage("truncate", at)

    _run(data, payloads, make)


@SETTINGS
@given(payloads=messages(), data=st.data())
def test_zeroed_range_in_last_segment(payloads: list[bytes], data: st.DataObject) -> None:
    def make(data: st.DataObject, layout: list[int]) -> Damage:
        at = position(data, layout)
        length = data.draw(st.one_of(st.integers(1, 16), st.integers(1, SEGMENT_SIZE)))
        return Damage("zero", at, length)

    _run(data, payloads, make)


@SETTINGS
@given(payloads=messages(), data=st.data())
def test_flipped_bytes_in_last_segment(payloads: list[bytes], data: st.DataObject) -> None:
    def make(data: st.DataObject, layout: list[int]) -> Damage:
        at = position(data, layout)
        masks = data.draw(st.lists(st.integers(1, 255), min_size=1, max_size=8), label="masks")
        return Damage("flip", at, len(masks), bytes(masks))

    _run(data, payloads, make)


# --------------------------------------------------------------------------------------
# targeted cases
# --------------------------------------------------------------------------------------


def _payloads(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [b"%05d:" % i + rng.randbytes(rng.randint(0, 250)) for i in range(n)]


def test_damage_model_sees_changes() -> None:
    """The damage model itself: what each kind of damage does to the bytes, and the
    independent frame check agrees with a frame written by the engine (and with its damage)."""
    assert changed_positions(b"\x00\x01\x00", bytes(3)) == [1]
    assert Damage("zero", 1, 100).apply(b"\x01\x02\x03") == b"\x01\x00\x00"
    assert Damage("flip", 2, 2, b"\x01\x01").apply(b"\x00\x00\x00") == b"\x00\x00\x01"
    assert Damage("truncate", 0).apply(b"abc") == b""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "q"
        offs = write_queue(d, [b"payload", b"x" * 300], segment_size=SEGMENT_SIZE)
        raw = (d / seg_name(0)).read_bytes()
    assert valid_frame_at(raw, offs[0]) and valid_frame_at(raw, offs[1])
    assert not valid_frame_at(raw, offs[1] + frame_size(300))  # zeros after the last frame
    assert not valid_frame_at(Damage("flip", offs[1] + 200, 1, b"\x01").apply(raw), offs[1])
    assert not valid_frame_at(Damage("flip", offs[1] + 1, 1, b"\x02").apply(raw), offs[1])
    assert not valid_frame_at(raw[: offs[1] + 100], offs[1])


@pytest.mark.parametrize(
    ("seg_index", "which"),
    [
        (0, "first"),
        (0, "middle"),
        (0, "last"),
        (1, "middle"),
        (1, "last"),
    ],
)
def test_corrupt_frame_in_sealed_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, seg_index: int, which: str
) -> None:
    d = tmp_path / "q"
    payloads = _payloads(120)
    offsets = write_queue(d, payloads, segment_size=4096)
    written = list(zip(offsets, payloads, strict=True))
    bases = seg_bases(d)
    assert len(bases) >= 4
    seg_base, next_base = bases[seg_index], bases[seg_index + 1]
    in_seg = [i for i, o in enumerate(offsets) if seg_base <= o < next_base]
    bad = {"first": in_seg[0], "middle": in_seg[len(in_seg) // 2], "last": in_seg[-1]}[which]
    bad_off = offsets[bad]
    path = d / seg_name(seg_base)
    raw = bytearray(path.read_bytes())
    raw[bad_off - seg_base + HEADER + 3] ^= 0x20  # a payload byte (every payload has >= 6)
    path.write_bytes(bytes(raw))
    before = {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n.startswith("seg-")}

    with caplog.at_level(logging.DEBUG, logger="k7core"):
        q = k7core.Queue(d, segment_size=4096, fsync="flush")
    with q:
        # the writer truncates nothing: every segment file is byte for byte as it was
        after = {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if n.startswith("seg-")}
        assert after == before
        assert not torn_files(d)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert q.end == offsets[-1] + frame_size(len(payloads[-1]))

        with q.consumer_group("reader") as g:
            got: list[tuple[int, bytes]] = []
            with pytest.raises(k7core.CorruptFrameError) as ei:
                for _ in range(10_000):
                    got.extend((m.offset, bytes(m.payload)) for m in g.poll(64, timeout=0))
            assert got == written[:bad]
            assert ei.value.offset == bad_off
            assert isinstance(ei.value, k7core.K7Error)
            # still stuck there: the reader does not skip it silently
            with pytest.raises(k7core.CorruptFrameError) as ei2:
                g.poll(64, timeout=0)
            assert ei2.value.offset == bad_off
            g.seek(next_base)
            rest = drain_to_end(g, q)
            assert rest == [w for w in written if w[0] >= next_base]
        new_off = q.enqueue(b"still writable")
        assert new_off == q.end - frame_size(len(b"still writable"))
    assert (d / seg_name(seg_base)).read_bytes() == before[seg_name(seg_base)]

    # a read-only open reports it the same way
    with k7core.Queue(d, readonly=True) as q, q.consumer_group("ro") as g:
        with pytest.raises(k7core.CorruptFrameError) as ei3:
            for _ in range(10_000):
                g.poll(64, timeout=0)
        assert ei3.value.offset == bad_off
        g.seek(next_base)
        later = [w for w in written if w[0] >= next_base]
        assert drain_to_end(g, q) == [*later, (new_off, b"still writable")]


def _crash_during_roll(
    d: Path, size: int, fill: bytes = b""
) -> tuple[list[tuple[int, bytes]], int]:
    payloads = _payloads(60)
    offsets = write_queue(d, payloads, segment_size=4096)
    assert len(seg_bases(d)) >= 2
    next_base = offsets[-1] + frame_size(len(payloads[-1]))
    (d / seg_name(next_base)).write_bytes(fill or bytes(size))
    return list(zip(offsets, payloads, strict=True)), next_base


@pytest.mark.parametrize("reopen_size", [4096, 8192])
def test_zero_length_last_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reopen_size: int
) -> None:
    d = tmp_path / "q"
    written, next_base = _crash_during_roll(d, 0)
    assert (d / seg_name(next_base)).stat().st_size == 0
    with caplog.at_level(logging.DEBUG, logger="k7core"):
        # a reader opened before any writer sees everything (the empty segment is empty)
        with k7core.Queue(d, readonly=True) as q:
            assert q.end == next_base
            assert replay(q, "ro") == written
        with k7core.Queue(d, segment_size=reopen_size, fsync="flush") as q:
            assert q.end == next_base
            assert (d / seg_name(next_base)).stat().st_size == reopen_size
            off = q.enqueue(b"first after the crash")
            assert off == next_base
            assert replay(q) == [*written, (off, b"first after the crash")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not torn_files(d)
    with k7core.Queue(d, segment_size=reopen_size, fsync="flush") as q:
        assert replay(q) == [*written, (next_base, b"first after the crash")]


@pytest.mark.parametrize("size", [8, 10, 777, 1000, 4088])
def test_short_zero_filled_last_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, size: int
) -> None:
    d = tmp_path / "q"
    written, next_base = _crash_during_roll(d, size)
    with caplog.at_level(logging.DEBUG, logger="k7core"):
        with k7core.Queue(d, readonly=True) as q:
            assert replay(q, "ro") == written
        with k7core.Queue(d, segment_size=4096, fsync="flush") as q:
            assert q.end == next_base
            assert (d / seg_name(next_base)).stat().st_size == 4096
            new = [b"m%d" % i * 50 for i in range(100)]
            offs = [q.enqueue(p) for p in new]  # rolls again
            assert offs[0] == next_base
            assert replay(q) == [*written, *zip(offs, new, strict=True)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not torn_files(d)
    assert len(seg_bases(d)) > 3


def test_short_last_segment_with_garbage_is_cut_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "q"
    junk = b"\x00" * 16 + b"half-written header?" + b"\x00" * 20
    written, next_base = _crash_during_roll(d, 0, fill=junk)
    with (
        caplog.at_level(logging.WARNING, logger="k7core"),
        k7core.Queue(d, segment_size=4096, fsync="flush") as q,
    ):
        assert q.end == next_base
        assert q.enqueue(b"x") == next_base
        assert replay(q) == [*written, (next_base, b"x")]
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    sides = torn_files(d)
    assert len(sides) == 1
    assert sides[0].read_bytes() == junk.rstrip(b"\x00")


def test_zeroed_length_and_crc_reads_as_an_empty_message(tmp_path: Path) -> None:
    """A limit of the k7 format, pinned: with magic and flags intact, zero length and CRC
    fields are a valid empty frame, so this damage is undetectable (k7 itself would stop
    there, as it treats an empty frame as the end of the log)."""
    d = tmp_path / "q"
    offs = write_queue(d, [b"A" * 100, b"@", b"C" * 5], segment_size=SEGMENT_SIZE)
    path = d / seg_name(0)
    raw = bytearray(path.read_bytes())
    raw[offs[1] + 2 : offs[1] + HEADER] = bytes(8)  # b"@": frame 16 bytes, as an empty one
    path.write_bytes(bytes(raw))
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
        assert replay(q) == [(offs[0], b"A" * 100), (offs[1], b""), (offs[2], b"C" * 5)]


def test_truncation_inside_padding_keeps_offsets_aligned(tmp_path: Path) -> None:
    d = tmp_path / "q"
    # 13-byte frames padded to 16
    offs = write_queue(d, [b"aaa", b"bbb"], segment_size=SEGMENT_SIZE)
    os.truncate(d / seg_name(0), 16 + 13 + 1)  # inside the padding of the second frame
    with k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush") as q:
        new = q.enqueue(b"new")
        assert replay(q) == [(offs[0], b"aaa"), (offs[1], b"bbb"), (new, b"new")]
    assert new % 8 == 0 and new == 32
