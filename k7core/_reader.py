"""Reading frames across segments below the visible end (shared by groups and bulk reads)."""

from __future__ import annotations

import bisect
import errno
from typing import TYPE_CHECKING

from ._errors import CorruptFrameError, DataLossError, StorageError
from ._format import FRAME_ALIGN, FRAME_HEADER, segment_name
from ._kernel import SCAN_CORRUPT, SCAN_EMPTY, ffi, lib
from ._native._fast import Fetcher
from ._storage import Mapping, map_file, next_frame

if TYPE_CHECKING:
    from ._queue import Queue

SCAN_NOSEG: int = lib.K7_SCAN_NOSEG


def _sealed_end(c: object) -> int:
    """Where the segment the reader is in was sealed: its frames end at ``c.pos`` and only
    zeros follow (so the next segment should start there)."""
    seg, cap, base, pos = c.seg, int(c.cap), int(c.base), int(c.pos)  # type: ignore[attr-defined]
    local = pos - base
    if seg == ffi.NULL or not 0 <= local <= cap:
        return -1
    return pos if int(lib.k7_last_nonzero(seg, local, cap)) == local else -1


class Reader:
    """One consumer's read state (single-threaded): a C ``k7_reader`` plus the mapping of the
    segment it is in.

    The fast path is ``lib.k7_read(reader.c, max_n)``: frames of the current segment below
    the visible end, payload positions and lengths in ``c.starts`` / ``c.lens``, position
    advanced in ``c.pos``. When it returns 0, :meth:`advance` moves across segment ends,
    maps segments and raises on corrupt frames.
    """

    def __init__(self, queue: Queue, capacity: int = 256) -> None:
        self._queue = queue
        self._map: Mapping | None = None
        self.view: memoryview | None = None  # read-only view of the current segment
        self.base10 = 0  # current segment base minus the frame header: offset = base10 + start
        self.fetcher: Fetcher | None = None  # a group's fast path, told of every segment change
        c = self.c = ffi.new("k7_reader *")
        c.pub = queue._pub
        c.floor_end = queue._floor_end
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self._starts = ffi.new("int64_t[]", capacity)
        self._lens = ffi.new("int64_t[]", capacity)
        c = self.c
        c.starts, c.lens, c.capacity = self._starts, self._lens, capacity

    def ensure_capacity(self, n: int) -> None:
        if n > self.c.capacity:
            self._alloc(max(n, 2 * int(self.c.capacity)))

    def close(self) -> None:
        self.c.seg = ffi.NULL
        self.view = None
        if self.fetcher is not None:
            self.fetcher.set_segment(None, self.base10)
        if self._map is not None:
            self._map.close()
            self._map = None

    def read(self, max_n: int) -> int:
        """Read up to ``max_n`` frames of one segment from ``c.pos``; 0 when none is visible."""
        self.ensure_capacity(max_n)
        return int(lib.k7_read(self.c, max_n)) or self.advance(max_n)

    def advance(self, max_n: int) -> int:
        """Slow path after ``k7_read`` returned 0: cross segment ends, map, report corruption."""
        c = self.c
        for _ in range(64):  # bounded walk over empty and sealed segments
            pos = int(c.pos)
            if pos >= c.end or c.status == lib.K7_SCAN_OK:
                return 0
            if c.status == SCAN_CORRUPT:
                raise self._corrupt(pos)
            if c.status == SCAN_NOSEG:
                self._map_segment_for(pos)
            elif c.status == SCAN_EMPTY:
                self._next_segment(pos)
            n = int(lib.k7_read(c, max_n))
            if n:
                return n
        return 0

    def _map_segment_for(self, pos: int) -> None:
        bases = self._queue._segment_bases()
        i = bisect.bisect_right(bases, pos) - 1
        if i < 0 or i + 1 == len(bases) or self._map_size_is_stale(bases[i]):
            bases = self._queue._segment_bases(refresh=True)
            i = bisect.bisect_right(bases, pos) - 1
        if i < 0:
            if bases:
                raise self._data_loss(pos, bases[0])
            raise CorruptFrameError(
                f"offset {pos} is before the first segment of the queue",
                path=self._queue.path, offset=pos, hint="seek to a later offset",
            )
        self._map_segment(bases[i])

    def _corrupt(self, pos: int) -> CorruptFrameError:
        """The frame at ``pos`` of the mapped segment is not valid; the hint names where
        reading can resume: the next valid frame of this segment, else the next segment,
        else the visible end."""
        c, base = self.c, int(self.c.base)
        later = [b for b in self._queue._segment_bases(refresh=True) if b > pos]
        region = (later[0] if later else int(c.end)) - base
        limit = min(int(c.cap), region)
        local = pos - base
        resume = base + (next_frame(self._map, local + FRAME_ALIGN, limit) if self._map else limit)
        if resume < base + limit:
            hint = f"seek to {resume} (the next valid frame, {resume - pos} bytes on) to skip it"
        elif later:
            hint = f"seek to {later[0]} (the next segment) to skip the rest of this one"
        else:
            hint = f"seek to {base + region} (the end of the log) to skip it"
        return CorruptFrameError(
            f"corrupt frame at offset {pos} in {segment_name(base)}",
            path=self._queue.path / segment_name(base), offset=pos, hint=hint,
        )

    def _data_loss(self, pos: int, earliest: int) -> DataLossError:
        return DataLossError(
            f"offset {pos} was deleted by retention; the log now starts at {earliest}",
            path=self._queue.path, offset=pos, earliest=earliest,
            hint=f"seek({earliest}) to continue from the earliest message, or open the group "
            "with on_data_loss='earliest'",
        )

    def _missing(self, base: int, later: list[int]) -> CorruptFrameError:
        """The segment that should start at ``base`` is not in the directory."""
        return CorruptFrameError(
            f"segment {segment_name(base)} is missing"
            + (f": the log has a gap from offset {base} to {later[0]}" if later else ""),
            path=self._queue.path / segment_name(base), offset=base,
            hint=f"restore the file, or seek to {later[0]} (the next segment)"
            if later else "restore the file",
        )

    def _map_size_is_stale(self, base: int) -> bool:
        return self._map is None and int(self.c.base) == base

    def _next_segment(self, pos: int) -> None:
        """The current segment has no frame at ``pos`` but data is visible beyond it: the
        segment was sealed there, so the next segment must start at ``pos``."""
        cur = int(self.c.base)
        bases = self._queue._segment_bases()
        if pos not in bases:
            bases = self._queue._segment_bases(refresh=True)
        if pos in bases and pos != cur:
            self._map_segment(pos)
            return
        if bases and pos < bases[0]:
            raise self._data_loss(pos, bases[0])
        later = [b for b in bases if b > pos]
        if later and pos == _sealed_end(self.c):
            raise self._missing(pos, later)
        raise CorruptFrameError(
            f"no valid frame at offset {pos} in {segment_name(cur)} and no segment starts there",
            path=self._queue.path / segment_name(cur),
            offset=pos,
            hint=f"seek to {later[0]} (the next segment)" if later else "seek past it",
        )

    def _map_segment(self, base: int) -> None:
        self.close()
        try:
            m = map_file(self._queue.path / segment_name(base), writable=False)
        except StorageError as exc:
            if exc.errno != errno.ENOENT:
                raise
            bases = self._queue._segment_bases(refresh=True)
            if bases and base < bases[0]:  # deleted by retention just now
                raise self._data_loss(base, bases[0]) from None
            raise self._missing(base, [b for b in bases if b > base]) from None
        c = self.c
        c.base = base
        self.base10 = base - FRAME_HEADER
        if m is None:  # empty file left by a crash during a roll
            c.cap = 0
            return
        self._map = m
        self.view = m.view
        c.seg, c.cap = m.ptr, m.size
        if self.fetcher is not None:
            self.fetcher.set_segment(self.view, self.base10)

    def payload_at(self, offset: int) -> memoryview | None:
        """The payload of the frame at ``offset`` (for redelivery); keeps ``c.pos``."""
        c = self.c
        saved = int(c.pos)
        c.pos = offset
        try:
            n = self.read(1)
            if not n or self.view is None:
                return None
            s = int(c.starts[0])
            return self.view[s : s + int(c.lens[0])]
        finally:
            c.pos = saved
