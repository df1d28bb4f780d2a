"""A journal that lost records it had written, and the floor under the next job id.

A job's id is the journal offset of its put + 1, so the journal's next offset is the next
id. Two kinds of damage take records away, and with them offsets that ids were made of:

- a damaged frame in the middle of the journal's last segment, with valid frames after
  it: the queue's recovery keeps the longest valid prefix and cuts the rest (as it cuts a
  torn tail), so :func:`frames_after_damage` looks before the queue is opened for writing;
- a journal that ends before the position a snapshot covers (its tail never reached the
  disk, or was cut).

Both are refused (:class:`JournalDamagedError`) unless the store is opened with
``repair=True``. A torn last frame (nothing valid after it) is no damage to report, but its
put may have been acknowledged; so after every cut, and after a repair, :func:`pad` appends
PAD records until the next offset lies past every id that may have been handed out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from .._format import FRAME_ALIGN, FRAME_HEADER, WRITER_LOCK, frame_size, segment_name
from .._queue import Queue
from .._stats import RecoveryEvent
from .._storage import (
    last_data,
    list_segments,
    lock_is_free,
    map_file,
    next_frame,
    valid_end,
)
from ._codec import encode_pad
from ._errors import JournalDamagedError
from ._files import list_snapshots, save_snapshot
from ._machine import JobMachine

log = logging.getLogger("k7core.jobs")

PAD_LENGTH = 1 << 20
"""The longest PAD record (a repair pads a gap of any size with records up to this)."""
PADDED = "journal-padded"
"""The kind of the :class:`k7core.RecoveryEvent` a pad records."""


def frames_after_damage(journal: Path) -> tuple[int, int] | None:
    """The journal offsets ``(start, end)`` of what a writer's recovery would cut from the
    last segment of ``journal`` although valid frames lie in it (a damaged frame in the
    middle: not a torn tail); None when nothing valid follows the valid prefix, or when a
    writer holds the journal (a frame it is writing is no damage; the open is refused as
    locked). Reads only."""
    bases = list_segments(journal) if journal.is_dir() else []
    if not bases:
        return None
    base = bases[-1]
    seg = journal / segment_name(base)
    m = map_file(seg, writable=False)
    if m is None:
        return None
    try:
        start = valid_end(m, m.size)
        last = last_data(m.ptr, seg, start, m.size)
        found = next_frame(m, start + FRAME_ALIGN, m.size) if last > start else m.size
        if found >= m.size or not lock_is_free(journal / WRITER_LOCK):
            return None
        end = found
        while found < m.size:  # the last valid frame after the damage, however it is spread
            end = valid_end(m, m.size, found)
            found = next_frame(m, end + FRAME_ALIGN, m.size)
        return base + start, base + max(end, last)
    finally:
        m.close()


def middle_damage(path: Path, start: int, end: int) -> JournalDamagedError:
    """The error of a damaged frame at journal offset ``start`` with valid ones by ``end``."""
    return _damaged(path, start, end, (
        f"has a damaged frame at offset {start} with valid frames after it, up to offset "
        f"{end}: the records from offset {start} on would be lost (this is no torn tail)"),
        "the records before the damaged frame (the queue keeps the bytes it cuts in a "
        "k7py-torn-*.bin file of the journal)")


def behind_snapshot(path: Path, end: int, position: int) -> JournalDamagedError:
    """The error of a journal that ends at ``end``, before a snapshot's ``position``."""
    return _damaged(path, end, position, (
        f"ends at offset {end}, before offset {position}, which its snapshot covers: the "
        "records in between never reached the disk (a power loss), or the journal was cut"),
        "the newest readable snapshot's jobs")


def _damaged(path: Path, start: int, end: int, what: str, kept: str) -> JournalDamagedError:
    return JournalDamagedError(
        f"the journal of job store {path} {what}", path=path, start=start, end=end,
        hint=f"restore the directory from a backup; or open it with JobStore(path, "
             f"repair=True) (or `k7 jobs repair DIR`), which keeps {kept} and moves the "
             f"next job id past {end}, so that no id is handed out twice")


def id_floor(events: Iterable[RecoveryEvent], snapshots: Iterable[int]) -> int:
    """The least next offset that hands out no id again, but for the live jobs' (a job's
    id is its put's offset + 1): past whatever the queue's recovery cut, and at least
    every snapshot's position."""
    cuts = (e.offset + e.nbytes for e in events if e.kind == "torn-tail-cut")
    return max((0, *cuts, *snapshots))


def pad(journal: Queue, floor: int, segment: int) -> RecoveryEvent:
    """Append PAD records until the journal's next offset is at least ``floor``, msync
    them (the floor must outlive a power loss), log it; the event that says so
    (``segment``: the base of the journal's last segment before)."""
    start = nxt = journal.end
    while nxt < floor:
        length = min(max(floor - nxt - FRAME_HEADER, 1), PAD_LENGTH)
        nxt = journal.enqueue(encode_pad(length)) + frame_size(length)
    journal.sync()
    log.warning("k7core.jobs: the journal %s was padded from offset %d to %d: no job id below "
                "%d is handed out again", journal.path, start, nxt, nxt)
    return RecoveryEvent(PADDED, segment, start, nxt - start, None, time.time())


def raise_floor(
    path: Path, journal: Queue, machine: JobMachine, repair: bool
) -> tuple[tuple[RecoveryEvent, ...], tuple[int, int] | None]:
    """After the journal of the store in ``path`` is open and ``machine`` rebuilt: refuse a
    journal that ends before a snapshot's position (unless ``repair``); :func:`pad` it past
    every id that may have been handed out and every live job's id; replace the snapshots
    the padding made point inside a record with one of ``machine`` at the journal's new
    end. Returns the journal's events (and the pad's), and the new snapshot's (position,
    size) if one was written."""
    stats = journal.stats()
    events = stats.recovery_events
    snapshots = [offset for offset, _ in list_snapshots(path)]
    end = journal.end
    ahead = max(snapshots, default=0)
    if ahead > end and not repair:
        raise behind_snapshot(path, end, ahead)
    floor = max(id_floor(events, snapshots), machine.highest_id())
    if floor <= end:
        return events, None
    padded = pad(journal, floor, stats.segments[-1].base)
    if ahead <= end:
        return (*events, padded), None
    covered = journal.end
    size = save_snapshot(path, machine, covered)
    for offset, file in list_snapshots(path):
        if end < offset < covered:
            file.unlink(missing_ok=True)
    return (*events, padded), (covered, size)
