"""Reading frames across segments below the visible end (shared by groups and bulk reads)."""

from __future__ import annotations

import bisect
import errno

from ._errors import CorruptFrameError, DataLossError, K7Error, StorageError
from ._format import FRAME_ALIGN, FRAME_HEADER, segment_name
from ._kernel import SCAN_CORRUPT, SCAN_EMPTY, SCAN_NOSEG, SCAN_OK, ffi, lib
from ._log import LogView
from ._native._fast import Fetcher
from ._stats import LAG_COUNT_LIMIT
from ._storage import Mapping, last_data, map_file, next_frame


class Reader:
    """One consumer's read state (single-threaded): a C ``k7_reader`` plus the mapping of the
    segment it is in.

    The fast path is ``lib.k7_read(reader.c, max_n)``: frames of the current segment below
    the visible end, payload positions and lengths in ``c.starts`` / ``c.lens``, position
    advanced in ``c.pos``. When it returns 0, :meth:`advance` moves across segment ends,
    maps segments and raises on corrupt frames.
    """

    def __init__(self, log: LogView, capacity: int = 256) -> None:
        self._log = log
        self._map: Mapping | None = None
        self.view: memoryview | None = None  # read-only view of the current segment
        self.base10 = 0  # current segment base minus the frame header: offset = base10 + start
        self.fetcher: Fetcher | None = None  # a group's fast path, told of every segment change
        # base of the segment after the mapped one when it was mapped (the mapped one then
        # ends there: its sealed end), None while it was the last
        self._next_base: int | None = None
        c = self.c = ffi.new("k7_reader *")
        c.pub = log.pub
        c.floor_end = log.floor_end
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
            if pos >= c.end or c.status == SCAN_OK:
                return 0
            if c.status in (SCAN_CORRUPT, SCAN_EMPTY) and self._sealed_since():
                pass  # the segment ends here now: read again within its sealed end
            elif c.status == SCAN_CORRUPT:
                raise self._corrupt(pos)
            elif c.status == SCAN_NOSEG:
                self._map_segment_for(pos)
            else:
                self._next_segment(pos)
            n = int(lib.k7_read(c, max_n))
            if n:
                return n
        return 0

    def _sealed_since(self) -> bool:
        """True when the mapped segment, the last one when it was mapped, has been sealed
        since (a later segment exists now) and ``c.cap`` was lowered to its sealed end:
        bytes past that end are not part of the log, whatever they hold."""
        c = self.c
        if self._next_base is not None or self._map is None:
            return False
        base = int(c.base)
        later = [b for b in self._log.segment_bases(refresh=True) if b > base]
        if not later:
            return False
        self._next_base = later[0]
        cap = min(self._map.size, later[0] - base)
        if cap >= int(c.cap):
            return False
        c.cap = cap
        return True

    def _map_segment_for(self, pos: int) -> None:
        bases = self._log.segment_bases()
        i = bisect.bisect_right(bases, pos) - 1
        fresh = i < 0 or i + 1 == len(bases) or self._map_size_is_stale(bases[i])
        if fresh:
            bases = self._log.segment_bases(refresh=True)
            i = bisect.bisect_right(bases, pos) - 1
        if i < 0:
            if bases:
                raise self._data_loss(pos, bases[0])
            raise CorruptFrameError(
                f"offset {pos} is before the first segment of the queue",
                path=self._log.path, offset=pos, hint="seek to a later offset",
            )
        if self._map is not None and bases[i] == int(self.c.base):
            # still in the mapped segment, past its file's end: the file is shorter than
            # the segment's sealed end
            raise self._short(bases[i], pos)
        self._map_segment(bases[i], fresh=fresh)

    def _corrupt(self, pos: int) -> CorruptFrameError:
        """The frame at ``pos`` of the mapped segment is not valid; the hint names where
        reading can resume: the next valid frame of this segment, else the next segment,
        else the visible end."""
        c, base = self.c, int(self.c.base)
        later = [b for b in self._log.segment_bases(refresh=True) if b > pos]
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
            path=self._log.path / segment_name(base), offset=pos, hint=hint,
        )

    def _data_loss(self, pos: int, earliest: int) -> DataLossError:
        return DataLossError(
            f"offset {pos} was deleted by retention; the log now starts at {earliest}",
            path=self._log.path, offset=pos, earliest=earliest,
            hint=f"seek({earliest}) to continue from the earliest message, or open the group "
            "with on_data_loss='earliest'",
        )

    def _missing(self, base: int, later: list[int], why: str = "is missing") -> CorruptFrameError:
        """The segment that should start at ``base`` is not in the directory (or is empty)."""
        return CorruptFrameError(
            f"segment {segment_name(base)} {why}"
            + (f": the log has a gap from offset {base} to {later[0]}" if later else ""),
            path=self._log.path / segment_name(base), offset=base,
            hint=f"restore the file, or seek to {later[0]} (the next segment)"
            if later else "restore the file",
        )

    def _short(self, base: int, pos: int) -> CorruptFrameError:
        """The file of the sealed segment at ``base`` ends before its sealed end."""
        nxt = self._next_base
        assert self._map is not None and nxt is not None
        return CorruptFrameError(
            f"segment file {segment_name(base)} is too short: it holds {self._map.size} bytes "
            f"but the segment was sealed at position {nxt - base} (the next segment starts "
            f"at {nxt}): the log has a gap from offset {pos} to {nxt}",
            path=self._log.path / segment_name(base), offset=pos,
            hint=f"restore the file, or seek to {nxt} (the next segment)",
        )

    def _map_size_is_stale(self, base: int) -> bool:
        return self._map is None and int(self.c.base) == base

    def _next_segment(self, pos: int) -> None:
        """The current segment has no frame at ``pos`` but data is visible beyond it: the
        segment was sealed there, so the next segment must start at ``pos``."""
        cur = int(self.c.base)
        bases = self._log.segment_bases()
        fresh = pos not in bases
        if fresh:
            bases = self._log.segment_bases(refresh=True)
        if pos in bases and pos != cur:
            self._map_segment(pos, fresh=fresh)
            return
        if bases and pos < bases[0]:
            raise self._data_loss(pos, bases[0])
        later = [b for b in bases if b > pos]
        m = self._map
        if later and m is not None:
            local = pos - cur
            if local > m.size - FRAME_HEADER:
                raise self._short(cur, pos)
            if last_data(m.ptr, self._log.path / segment_name(cur), local, m.size) == local:
                # only zeros follow: this segment was sealed at ``pos``, where the next
                # segment should start
                raise self._missing(pos, later)
        raise CorruptFrameError(
            f"no valid frame at offset {pos} in {segment_name(cur)} and no segment starts there",
            path=self._log.path / segment_name(cur),
            offset=pos,
            hint=f"seek to {later[0]} (the next segment)" if later else "seek past it",
        )

    def _map_segment(self, base: int, *, fresh: bool = False) -> None:
        """Map the segment at ``base``. A segment with a successor is sealed: its frames end
        where the successor begins (k7's rule), so the reader never looks past that point
        (bytes a JVM writer's recovery left there are not part of the log). ``fresh``: the
        queue's segment list was just read again, so it says whether one follows."""
        self.close()
        bases = self._log.segment_bases()
        if not fresh and (not bases or bases[-1] <= base):  # is it still the last one?
            bases = self._log.segment_bases(refresh=True)
        j = bisect.bisect_right(bases, base)
        later = bases[j : j + 1]  # the next segment, if any
        try:
            m = map_file(self._log.path / segment_name(base), writable=False)
        except StorageError as exc:
            if exc.errno != errno.ENOENT:
                raise
            bases = self._log.segment_bases(refresh=True)
            if bases and base < bases[0]:  # deleted by retention just now
                raise self._data_loss(base, bases[0]) from None
            raise self._missing(base, [b for b in bases if b > base]) from None
        c = self.c
        c.base = base
        self.base10 = base - FRAME_HEADER
        self._next_base = later[0] if later else None
        if m is None:  # an empty file
            if later:
                raise self._missing(base, later, "is empty (0 bytes)")
            c.cap = 0  # the last segment, left by a crash during a roll
            return
        self._map = m
        self.view = m.view
        c.seg = m.ptr
        c.cap = m.size if not later else min(m.size, later[0] - base)
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


def count_frames(log: LogView, start: int, end: int) -> int | None:
    """How many frames lie in [start, end) (``start`` a frame boundary), by a CRC-checked
    scan; None if that range is unreadable (deleted, corrupt)."""
    if end <= start:
        return 0
    r = Reader(log, 4096)
    r.c.pos = start
    n = 0
    try:
        while int(r.c.pos) < end:
            got = r.read(4096)
            if not got:
                break
            if int(r.c.pos) <= end:
                n += got
            else:
                n += sum(1 for i in range(got) if r.base10 + int(r.c.starts[i]) < end)
    except K7Error:
        return None
    finally:
        r.close()
    return n


def lag_messages(log: LogView, start: int, end: int) -> int | None:
    """:func:`count_frames` when the range is at most ``LAG_COUNT_LIMIT`` bytes, else None."""
    return count_frames(log, start, end) if end - start <= LAG_COUNT_LIMIT else None
