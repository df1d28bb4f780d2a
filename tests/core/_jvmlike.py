"""A queue directory written the way k7 on the JVM writes one (``s-exp.k7``, read from its
source), independently of k7core: for fixtures of what the JVM leaves on disk.

What matters here, and differs from k7core's writer:

- a segment file is created *sparse*: one zero byte written at ``segment_size - 1``;
- recovery finds the end of the valid frames and goes on writing there, *without zeroing*
  what follows (a torn frame of a crashed writer stays behind the new frames);
- a roll happens when ``pos + frame_size >= capacity`` and the next segment's base is the
  old base plus ``pos`` (k7's format rule);
- frames: magic ``K``, flag ``1``, big-endian length and CRC32C, payload, zero padding to 8.
"""

from __future__ import annotations

import struct
from pathlib import Path

from tests._queuehelp import HEADER, crc32c, encode_frame, frame_size, seg_bases, seg_name


def _valid_at(buf: bytes, pos: int) -> int:
    """The frame size at ``pos`` if a valid frame starts there (k7's ``valid-frame?``)."""
    if pos + HEADER >= len(buf) or buf[pos : pos + 2] != b"K\x01":
        return 0
    (length,) = struct.unpack_from(">I", buf, pos + 2)
    end = pos + HEADER + length
    if length <= 0 or end > len(buf):
        return 0
    (crc,) = struct.unpack_from(">I", buf, pos + 6)
    if crc32c(buf[pos + HEADER : end]) != crc:
        return 0
    return frame_size(length)


def _create(path: Path, size: int) -> None:
    with open(path, "wb") as f:  # sparse: the JVM writes one zero byte at the end
        f.seek(size - 1)
        f.write(b"\0")


def append(directory: Path, payloads: list[bytes], segment_size: int) -> list[int]:
    """Open (or create) the queue as k7 does, append ``payloads``, return their offsets."""
    directory.mkdir(parents=True, exist_ok=True)
    bases = seg_bases(directory)
    if not bases:
        bases = [0]
        _create(directory / seg_name(0), segment_size)
    base = bases[-1]
    path = directory / seg_name(base)
    buf = path.read_bytes()
    pos = 0
    while size := _valid_at(buf, pos):  # recovery: no zeroing of what follows
        pos += size
    offsets = []
    f = open(path, "r+b")  # noqa: SIM115 - reopened at every roll
    try:
        for p in payloads:
            fr = encode_frame(p)  # the JVM writes the CRC as a signed int: same bytes
            if pos + len(fr) >= segment_size:  # k7's segment-full?
                f.close()
                base += pos
                pos = 0
                path = directory / seg_name(base)
                _create(path, segment_size)
                f = open(path, "r+b")  # noqa: SIM115
            f.seek(pos)
            f.write(fr)
            offsets.append(base + pos)
            pos += len(fr)
    finally:
        f.close()
    return offsets


def roll(directory: Path, segment_size: int) -> int:
    """Start a new empty segment after the last one's frames (as k7's roll-segment!)."""
    bases = seg_bases(directory)
    base = bases[-1]
    buf = (directory / seg_name(base)).read_bytes()
    pos = 0
    while size := _valid_at(buf, pos):
        pos += size
    _create(directory / seg_name(base + pos), segment_size)
    return base + pos
