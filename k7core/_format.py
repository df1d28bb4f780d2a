"""The on-disk format (docs/format.md) in Python: its numbers, taken from the kernel's
header ``k7.h`` through the compiled module (so that header is their one source), the file
names, and the cursor and frame-header codecs. Shared by the writer, the readers, the
groups, stats, the CLI and spark."""

from __future__ import annotations

import enum
import errno
import os
import re
import struct
from typing import TYPE_CHECKING

from ._errors import StorageError
from ._kernel import lib

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# Frames: magic, flags, big-endian length and CRC32C, the payload, zeros to FRAME_ALIGN.
FRAME_MAGIC: int = lib.K7_MAGIC
FRAME_FLAG_COMMITTED: int = lib.K7_FLAG_COMMITTED
FRAME_HEADER: int = lib.K7_HEADER
FRAME_ALIGN: int = lib.K7_ALIGN
MAX_PAYLOAD: int = lib.K7_MAX_LEN
MAX_OFFSET: int = lib.K7_MAX_OFFSET  # offsets are int64 on disk (cursors) and in the kernel
# k7 on the JVM maps a segment as one MappedByteBuffer, which holds at most 2^31-1 bytes: a
# larger segment could not be opened there, and gains nothing (a payload is < 2 GiB).
MAX_SEGMENT_SIZE: int = lib.K7_MAX_SEGMENT
CURSOR_FILE_SIZE: int = lib.K7_CURSOR_FILE_SIZE
CURSOR_SIZE: int = lib.K7_CURSOR_SIZE  # the committed offset at byte 0 (see decode_cursor)
POSITION_FILE_SIZE: int = lib.K7_POS_FILE_SIZE  # a k7_pos (k7.h) at byte 0
DEFAULT_SEGMENT_SIZE = 256 * 1024 * 1024  # k7's default

SEGMENT_RE = re.compile(r"^seg-(\d{20})\.k7$")
CURSOR_PREFIX = "cursor-"
CURSOR_SUFFIX = ".k7"
# Files this project adds; k7 (JVM) ignores them: not seg-*.k7, not cursor-*.k7.
OWN_PREFIX = "k7py-"  # every one of them starts so
WRITER_LOCK = "k7py-writer.lock"
POSITION_FILE = "k7py-position"
SPARE_SEGMENT = "k7py-spare.seg"  # the next segment, being prepared (not a segment yet)
# Shared writers (writers="shared"): their state (a k7_shared of k7.h, mapped by each), held
# with a shared flock by each live one, and the lock that serialises joining and leaving.
SHARED_FILE = "k7py-writers"
SHARED_FILE_SIZE: int = lib.K7_SHARED_FILE_SIZE
SHARED_WRITERS: int = lib.K7_SHARED_WRITERS  # at most this many shared writers at once
SHARED_LOCK = "k7py-writers.lock"
# each shared writer's own spare, named by its random id (earlier versions: by pid, digits)
SHARED_SPARE_RE = re.compile(r"^k7py-spare-([0-9a-f]{16}|\d+)\.seg$")
WRITERS = ("exclusive", "shared")
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
        """The kernel's ``K7_MODE_*`` for this strategy."""
        return _MODES[self]


_MODES = {Fsync.FLUSH: lib.K7_MODE_FLUSH, Fsync.ASYNC: lib.K7_MODE_ASYNC,
          Fsync.SYNC: lib.K7_MODE_SYNC}


def parse_fsync(value: str | Fsync, what: str) -> Fsync:
    try:
        return Fsync(value)
    except ValueError:
        raise ValueError(
            f"{what} must be one of 'async', 'flush', 'sync', not {value!r}"
        ) from None


def frame_size(length: int) -> int:
    """Bytes a frame with a ``length``-byte payload takes (header, payload, padding)."""
    return (FRAME_HEADER + length + FRAME_ALIGN - 1) & ~(FRAME_ALIGN - 1)


# The frame header (k7.h): magic, flags, length (BE u32), CRC32C of the payload (BE u32).
# The kernel writes and checks frames; this codec is for the tools and tests that build or
# take apart one by hand.
_FRAME = struct.Struct(">BBII")


def encode_frame_header(length: int, crc: int) -> bytes:
    """The header of a committed frame of ``length`` payload bytes whose CRC32C is ``crc``."""
    return _FRAME.pack(FRAME_MAGIC, FRAME_FLAG_COMMITTED, length, crc)


def decode_frame_header(data: ReadableBuffer, pos: int = 0) -> tuple[int, ...]:
    """``(magic, flags, length, crc)`` of the frame header at ``data[pos:]``, unchecked."""
    return _FRAME.unpack_from(data, pos)


def segment_name(base: int) -> str:
    return f"seg-{base:020d}.k7"


SIDE_FILES = ("torn", "stray", "orphaned")
"""The kinds of side file recovery and the writer leave (see the ``*_name`` functions)."""


def torn_name(base: int, pos: int, ns: int) -> str:
    """The side file of the bytes that recovery cut at ``pos`` of the segment at ``base``,
    at ``ns`` (``time.time_ns()``)."""
    return f"{OWN_PREFIX}torn-{base:020d}-{pos:012d}-{ns}.bin"


def stray_name(base: int) -> str:
    """Where a frameless stray segment at ``base`` that holds data is kept aside."""
    return f"{OWN_PREFIX}stray-{segment_name(base)}"


def orphaned_name(base: int) -> str:
    """The image of the segment at ``base`` whose file a writer found lost."""
    return f"{OWN_PREFIX}orphaned-{segment_name(base)}"


def shared_spare_name(writer_id: int) -> str:
    """The spare segment a shared writer prepares (each its own, named by its random id)."""
    return f"{OWN_PREFIX}spare-{writer_id:016x}.seg"


def queue_file(name: str) -> bool:
    """Whether ``name`` is a file the queue itself owns (segments, cursors, the writer lock,
    the position file, the spare segment, recovery's side files), as opposed to another
    layer's files kept in the directory (such as Spark's sink records)."""
    return bool(
        SEGMENT_RE.match(name)
        or cursor_group(name) is not None
        or name in (WRITER_LOCK, POSITION_FILE, SPARE_SEGMENT, SHARED_FILE, SHARED_LOCK)
        or SHARED_SPARE_RE.match(name)
        or name.startswith(tuple(f"{OWN_PREFIX}{kind}-" for kind in SIDE_FILES))
    )


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
    """The name of the cursor file of ``group``."""
    return f"{CURSOR_PREFIX}{group}{CURSOR_SUFFIX}"


def cursor_group(name: str) -> str | None:
    """The group whose cursor file is named ``name``; None when ``name`` is not shaped as a
    cursor file's (the group name is not checked)."""
    if name.startswith(CURSOR_PREFIX) and name.endswith(CURSOR_SUFFIX):
        return name[len(CURSOR_PREFIX) : -len(CURSOR_SUFFIX)]
    return None


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
