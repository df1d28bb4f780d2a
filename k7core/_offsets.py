"""Where a consumer group may read from: the checks of a stored cursor (at open) and of a
seek target, shared by ``ConsumerGroup``, ``k7 groups`` and the topic and Spark layers."""

from __future__ import annotations

import bisect
from pathlib import Path

from ._errors import CursorError, StorageError
from ._format import cursor_name, segment_name
from ._storage import frame_start_error, list_segments, map_file


def check_cursor(directory: Path, group: str, committed: int, end: int) -> CursorError | None:
    """The error to report if ``committed``, group ``group``'s stored cursor, is not an
    offset it may read from (:func:`check_offset`): checked when a group opens."""
    return check_offset(
        directory, committed, end, said=f"the cursor of group {group!r} is",
        path=directory / cursor_name(group),
    )


def check_offset(
    directory: Path, offset: int, end: int, *, said: str, path: Path
) -> CursorError | None:
    """The error to report if a group may not read from ``offset`` in the log of
    ``directory`` that ends at ``end``: negative, past the end, or not where a frame starts
    (see :func:`frame_start_error`: one header walk of its segment, more only when it is
    refused or lies past damage). None when it may, or when it lies before the first segment
    (deleted by retention: ``poll`` reports that, see ``on_data_loss``). The message begins
    with ``said``; ``path`` is the cursor file."""
    hint = (
        f"seek({end}) to continue with new messages, or seek(queue.earliest()) to replay "
        "the log"
    )
    if offset < 0 or offset > end:
        where = "negative" if offset < 0 else f"beyond the end of the log ({end})"
        return CursorError(
            f"{said} {offset}: {where}", path=path, offset=offset, end=end, hint=hint
        )
    bases = list_segments(directory)
    i = bisect.bisect_right(bases, offset) - 1
    if offset == end or i < 0 or bases[i] == offset:
        return None
    base = bases[i]
    region = (bases[i + 1] if i + 1 < len(bases) else end) - base
    found = _frame_start_error(directory / segment_name(base), offset - base, region)
    if found is None:
        return None
    start, boundary = base + found[0], base + found[1]
    where = (
        f"inside a frame of {segment_name(base)} (it starts at {start}, the next one at "
        f"{boundary})" if start >= base else
        f"not the start of a valid frame of {segment_name(base)}, which is damaged at or "
        f"before it (the next valid position is {boundary})"
    )
    return CursorError(
        f"{said} {offset}: {where}",
        path=path, offset=offset, end=end, boundary=boundary,
        hint=f"seek({boundary}) to continue from the next frame; " + hint,
    )


def _frame_start_error(path: Path, local: int, region: int) -> tuple[int, int] | None:
    """:func:`frame_start_error` for position ``local`` of the segment file at ``path``,
    whose data may span ``region`` bytes; the next position is ``region`` (the next
    segment, or the end) when none is found before. None when the file is gone or empty
    (the reader reports that)."""
    try:
        m = map_file(path, writable=False)
    except StorageError:
        return None
    if m is None:
        return None
    try:
        limit = min(m.size, region)
        found = frame_start_error(m, local, limit)
    finally:
        m.close()
    if found is None:
        return None
    return found[0], found[1] if found[1] < limit else region
