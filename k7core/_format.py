"""On-disk names and constants (DESIGN §2), shared by the writer and the readers."""

from __future__ import annotations

import enum
import errno
import os
import re
import struct

from ._errors import StorageError

FRAME_HEADER = 10
FRAME_ALIGN = 8
MAX_PAYLOAD = 2**31 - 1
MAX_OFFSET = 2**63 - 1  # offsets are int64 on disk (cursors) and in the kernel
CURSOR_FILE_SIZE = 4096
POSITION_FILE_SIZE = 4096
DEFAULT_SEGMENT_SIZE = 256 * 1024 * 1024
# k7 on the JVM maps a segment as one MappedByteBuffer, which holds at most 2^31-1 bytes: a
# larger segment could not be opened there, and gains nothing (a payload is < 2 GiB).
MAX_SEGMENT_SIZE = 2**31 - 8

SEGMENT_RE = re.compile(r"^seg-(\d{20})\.k7$")
CURSOR_PREFIX = "cursor-"
# Files this project adds; k7 (JVM) ignores them: not seg-*.k7, not cursor-*.k7.
WRITER_LOCK = "k7py-writer.lock"
POSITION_FILE = "k7py-position"
SPARE_SEGMENT = "k7py-spare.seg"  # the next segment, being prepared (not a segment yet)
SPARE_MIN_SIZE = 4 << 20  # smaller segments are created in place: that is cheap enough
MAX_GROUP_NAME_BYTES = 200


class Fsync(enum.StrEnum):
    """Durability strategy of a queue (``fsync``) or of a group's cursor (``cursor_fsync``).

    ``flush``: visible and written to the page cache at once; survives a process crash, not a
    power loss. ``async``: a background thread msyncs at most once per ``commit_interval``;
    readers see data once synced. ``sync``: msync before the call returns.
    """

    FLUSH = "flush"
    ASYNC = "async"
    SYNC = "sync"

    @property
    def code(self) -> int:
        return {"flush": 0, "async": 1, "sync": 2}[self.value]


def parse_fsync(value: str | Fsync, what: str) -> Fsync:
    try:
        return Fsync(value)
    except ValueError:
        raise ValueError(
            f"{what} must be one of 'async', 'flush', 'sync', not {value!r}"
        ) from None


def frame_size(length: int) -> int:
    return (FRAME_HEADER + length + FRAME_ALIGN - 1) & ~(FRAME_ALIGN - 1)


def segment_name(base: int) -> str:
    return f"seg-{base:020d}.k7"


def segment_base(name: str, directory: str | os.PathLike[str]) -> int | None:
    """The base offset of the segment file ``name`` of ``directory``; None when ``name`` is
    not a segment's. A base beyond int64 (no writer makes one) is a StorageError naming
    the file."""
    m = SEGMENT_RE.match(name)
    if m is None:
        return None
    base = int(m.group(1))
    if base > MAX_OFFSET:
        path = os.path.join(directory, name)
        raise StorageError(
            f"segment file {path}: its base offset {base} does not fit in 64 bits "
            f"(at most {MAX_OFFSET})", errno_=errno.EINVAL, path=path,
            hint="no k7 writer creates such a file: move it out of the queue directory",
        )
    return base


_CURSOR = struct.Struct(">q")


def decode_cursor(head: bytes) -> int:
    """The committed offset in the first bytes of a cursor file: a big-endian signed int64
    at byte 0 (as the kernel's ``k7_cursor_load`` reads it); 0 for a file shorter than
    that (being created)."""
    return int(_CURSOR.unpack_from(head)[0]) if len(head) >= _CURSOR.size else 0


def encode_cursor(offset: int) -> bytes:
    """The first bytes of a cursor file that holds ``offset`` (see :func:`decode_cursor`)."""
    return _CURSOR.pack(offset)


def cursor_name(group: str) -> str:
    return f"{CURSOR_PREFIX}{group}.k7"


def check_group_name(name: object) -> str:
    """Return ``name`` if it is a safe group name, else raise InvalidNameError."""
    from ._errors import InvalidNameError

    if not isinstance(name, str):
        raise InvalidNameError(f"group name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidNameError("group name must not be empty")
    bad = [c for c in ("/", "\\", "\x00") if c in name]
    if bad or name in (".", "..") or ".." in name:
        raise InvalidNameError(
            f"group name {name!r} contains a path separator, NUL or '..'",
            hint="use letters, digits, '-', '_' and '.'",
        )
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidNameError(
            f"group name {name!r} is not valid Unicode text (a lone surrogate at position "
            f"{exc.start})",
            hint="file names are UTF-8: use letters, digits, '-', '_' and '.'",
        ) from None
    if len(encoded) > MAX_GROUP_NAME_BYTES:
        raise InvalidNameError(
            f"group name is longer than {MAX_GROUP_NAME_BYTES} bytes in UTF-8"
        )
    if any(ord(c) < 32 for c in name):
        raise InvalidNameError(f"group name {name!r} contains control characters")
    return name
