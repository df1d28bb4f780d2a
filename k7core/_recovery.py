"""Open-time recovery of a writable queue: find the end of the log, cut what follows it.

Whatever lies past the last valid frame (a torn write, corrupt bytes) is saved to a side
file and zeroed, so it can never reappear as data; a segment left by a failed roll is
removed. Each such step is recorded as a :class:`RecoveryEvent` and logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ._errors import StorageError
from ._format import FRAME_ALIGN, segment_name, stray_name, torn_name
from ._kernel import ffi, lib
from ._options import QueueOptions
from ._stats import RecoveryEvent
from ._storage import (
    Mapping,
    create_segment,
    frame_at,
    fsync_dir,
    fsync_file,
    last_data,
    list_segments,
    map_file,
    open_fd,
)

log = logging.getLogger("k7core")


@dataclass
class Tail:
    """Where the writer goes on: the mapped last segment, its base, the end of its frames."""

    segment: Mapping
    base: int
    end: int
    bases: list[int]


def msync_range(m: Mapping, start: int, end: int) -> int:
    """msync ``[start, end)`` of ``m``; 0 or an errno."""
    return int(lib.k7_msync(m.ptr, start, end))


def recover(path: Path, options: QueueOptions, events: list[RecoveryEvent]) -> Tail:
    """Recover the log in ``path`` (the writer lock held): create the first segment if there
    is none, drop a stray last segment, cut the torn tail of the last one."""
    bases = list_segments(path)
    if not bases:
        create_segment(path, 0, options.segment_size, durable=options.durable,
                       mode=options.file_mode)
        bases = [0]
    _drop_stray_segments(path, bases, options, events)
    base = bases[-1]
    seg = path / segment_name(base)
    size = seg.stat().st_size
    if size % FRAME_ALIGN:  # cut by hand inside a frame's padding: keep offsets aligned
        os.truncate(seg, size + FRAME_ALIGN - size % FRAME_ALIGN)
    m = map_file(seg, writable=True)
    count, status = ffi.new("int64_t *"), ffi.new("int32_t *")
    end = 0 if m is None else int(lib.k7_scan_end(m.ptr, m.size, count, status))
    if m is None or (end == 0 and m.size < options.segment_size):
        if m is not None:
            cut_tail(path, options, m, base, 0, events)
            m.close()
        events.append(RecoveryEvent("short-segment-reset", base, base, size, None, time.time()))
        create_segment(path, base, options.segment_size, durable=options.durable,
                       mode=options.file_mode, replace=True)
        m = map_file(seg, writable=True)
        assert m is not None
        end = 0
    else:
        cut_tail(path, options, m, base, end, events)
    return Tail(m, base, end, bases)


def _drop_stray_segments(
    path: Path, bases: list[int], options: QueueOptions, events: list[RecoveryEvent]
) -> None:
    """Remove a last segment that holds no frame while its predecessor's frames run to
    or past its base: a roll created it, then failed (a full disk), and the writer went
    on in the predecessor. Taking it as the end of the log would hand out again the
    offsets written after it; its predecessor is where the log goes on."""
    while len(bases) >= 2:
        prev, last = bases[-2], bases[-1]
        seg = path / segment_name(last)
        if frame_at(seg, 0) or not frame_at(path / segment_name(prev), last - prev):
            return
        size = os.stat(seg, follow_symlinks=False).st_size
        side = discard_stray(path, last)
        if options.durable:
            fsync_dir(path)
        bases.pop()
        events.append(RecoveryEvent(
            "stray-segment-removed", last, last, size, side, time.time()
        ))
        log.warning(
            "k7core: %s holds no frame and its predecessor's frames run past its base "
            "(a failed roll): removed it%s; the log goes on in %s",
            segment_name(last), f" (kept as {side})" if side else "", segment_name(prev),
        )


def discard_stray(path: Path, base: int) -> str | None:
    """Remove the segment file at ``base``, which holds no frame: deleted, or renamed
    to ``stray_name(base)`` (returned) if it holds any non-zero byte."""
    seg = path / segment_name(base)
    side = None
    m = map_file(seg, writable=False)
    if m is not None:
        try:
            if last_data(m.ptr, seg, 0, m.size):  # never lose a byte: keep it aside
                side = stray_name(base)
                os.rename(seg, path / side)
        finally:
            m.close()
    if side is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg)
    return side


def cut_tail(
    path: Path, options: QueueOptions, m: Mapping, base: int, end: int,
    events: list[RecoveryEvent],
) -> None:
    """Save and zero whatever follows the last valid frame, so it can never reappear."""
    last = last_data(m.ptr, path / segment_name(base), end, m.size)
    if last <= end:
        return
    side = path / torn_name(base, end, time.time_ns())
    side_fd = open_fd(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, options.file_mode)
    try:
        with os.fdopen(side_fd, "wb") as f:
            f.write(m.read(end, last))
            f.flush()
            fsync_file(f.fileno(), side)
    except OSError as exc:  # a full disk: nothing is cut, and no empty side file is left
        with contextlib.suppress(OSError):
            os.unlink(side)
        raise StorageError(
            f"cannot save the {last - end} bytes after the last valid frame of "
            f"{segment_name(base)} (offset {base + end}) to {side.name} before cutting "
            f"them: {exc.strerror or exc}", errno_=exc.errno or 0, path=side,
            hint="free space on the queue's filesystem, then open the queue again (recovery "
                 "keeps the bytes it cuts)") from exc
    m.zero(end, last)
    err = msync_range(m, end, last)
    if err:
        raise StorageError(f"msync of {segment_name(base)} failed: {os.strerror(err)}",
                           errno_=err, path=path / segment_name(base))
    events.append(RecoveryEvent(
        "torn-tail-cut", base, base + end, last - end, side.name, time.time()
    ))
    log.warning(
        "k7core: cut the torn or corrupt tail of %s at offset %d (position %d): "
        "%d bytes discarded, saved to %s",
        segment_name(base), base + end, end, last - end, side.name,
    )
