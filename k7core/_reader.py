"""Reading frames across segments below the visible end (shared by groups and bulk reads)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from ._errors import CorruptFrameError
from ._format import FRAME_HEADER, segment_name
from ._kernel import SCAN_CORRUPT, SCAN_EMPTY, ffi, lib
from ._storage import Mapping, map_file

if TYPE_CHECKING:
    from ._queue import Queue


class Segment:
    """A read-only mapping of one segment file."""

    __slots__ = ("base", "cap", "map")

    def __init__(self, base: int, mapping: Mapping | None) -> None:
        self.base = base
        self.map = mapping
        self.cap = mapping.size if mapping is not None else 0

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None


class Reader:
    """Scans frames for one consumer (single-threaded); holds one segment mapping at a time.

    ``scan(pos, end, max_n)`` returns ``(n, segment)`` with the payload positions and lengths
    in ``self.starts`` / ``self.lens`` (C arrays) and the next global offset in ``self.next``.
    """

    def __init__(self, queue: Queue, capacity: int = 256) -> None:
        self._queue = queue
        self._seg: Segment | None = None
        self._alloc(capacity)
        self._next = ffi.new("int64_t *")
        self._status = ffi.new("int32_t *")
        self.next = 0
        self.status = 0

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self.starts: Any = ffi.new("int64_t[]", capacity)
        self.lens: Any = ffi.new("int64_t[]", capacity)

    def close(self) -> None:
        if self._seg is not None:
            self._seg.close()
            self._seg = None

    def _segment_for(self, pos: int) -> Segment:
        seg = self._seg
        if seg is not None and seg.base <= pos and (pos - seg.base < seg.cap or seg.cap == 0):
            if seg.cap == 0:
                self._reopen(seg.base)  # an empty segment may have been extended since
                assert self._seg is not None
                return self._seg
            return seg
        bases = self._queue._segment_bases()
        i = bisect.bisect_right(bases, pos) - 1
        if i < 0 or (pos > bases[i] and i + 1 < len(bases) and bases[i + 1] <= pos):
            bases = self._queue._segment_bases(refresh=True)
            i = bisect.bisect_right(bases, pos) - 1
        if i < 0:
            raise CorruptFrameError(
                f"offset {pos} is before the first segment of the queue",
                path=self._queue.path,
                offset=pos,
                hint="seek to a later offset",
            )
        self._reopen(bases[i])
        assert self._seg is not None
        return self._seg

    def _reopen(self, base: int) -> None:
        if self._seg is not None:
            self._seg.close()
            self._seg = None
        path = self._queue.path / segment_name(base)
        self._seg = Segment(base, map_file(path, writable=False))

    def scan(self, pos: int, end: int, max_n: int) -> tuple[int, Segment | None]:
        """Read up to ``max_n`` valid frames from global ``pos`` below global ``end``."""
        if max_n > self.capacity:
            self._alloc(max(max_n, 2 * self.capacity))
        for _ in range(64):  # bounded walk over empty / sealed segments
            if pos >= end:
                self.next, self.status = pos, 0
                return 0, None
            seg = self._segment_for(pos)
            local = pos - seg.base
            if seg.map is None or local >= seg.cap:
                pos = self._next_segment(seg, local, pos)
                continue
            n = lib.k7_scan(
                seg.map.ptr, seg.cap, local, end - seg.base, max_n,
                self.starts, self.lens, self._next, self._status,
            )
            self.next = seg.base + self._next[0]
            self.status = self._status[0]
            if n:
                return n, seg
            if self.status == SCAN_CORRUPT:
                raise CorruptFrameError(
                    f"corrupt frame at offset {pos} in {segment_name(seg.base)}",
                    path=self._queue.path / segment_name(seg.base),
                    offset=pos,
                    hint="seek past it, for example to the next segment's base offset",
                )
            if self.status == SCAN_EMPTY:
                pos = self._next_segment(seg, local, pos)
                continue
            self.next, self.status = pos, 0
            return 0, None
        self.next, self.status = pos, 0
        return 0, None

    def _next_segment(self, seg: Segment, local: int, pos: int) -> int:
        """The segment ends at ``local`` and data is visible beyond: move to the next one."""
        bases = self._queue._segment_bases()
        if pos not in bases or pos == seg.base:
            bases = self._queue._segment_bases(refresh=True)
        if pos in bases and pos != seg.base:
            self._reopen(pos)
            return pos
        later = [b for b in bases if b > pos]
        if later or seg.cap > 0:
            raise CorruptFrameError(
                f"no valid frame at offset {pos} in {segment_name(seg.base)} and no segment "
                "starts there",
                path=self._queue.path / segment_name(seg.base),
                offset=pos,
                hint=f"seek to {later[0]} (the next segment)" if later else "seek past it",
            )
        return pos

    def frame_offsets(self, n: int, seg: Segment) -> list[int]:
        base = seg.base - FRAME_HEADER
        return [base + s for s in ffi.unpack(self.starts, n)]
