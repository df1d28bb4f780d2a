"""Offset ranges: where a queue's readable log starts and ends, the partitions a range is
planned into, and a partition's frames read as Arrow record batches; the same for the
partitions of a topic."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from .. import ColumnarBatch, Queue
from .._storage import list_segments
from ..topics._layout import partition_dir
from ._arrow import arrow_schema, record_batch
from ._errors import K7DataLossError

BATCH_MESSAGES = 65536
"""Frames read per kernel call (and per Arrow record batch)."""


@dataclass(frozen=True)
class K7Partition(InputPartition):
    """Frames in ``[start, end)`` of the queue at ``path`` (both frame boundaries)."""

    path: str
    start: int
    end: int


def bounds(path: Path) -> tuple[int, int]:
    """(earliest readable offset, visible end) of the queue at ``path``."""
    bases = list_segments(path)
    with Queue(path, readonly=True) as q:
        end = q.end
    return (bases[0] if bases else 0), end


def plan(
    path: str, start: int, end: int, bases: list[int], min_partitions: int
) -> list[K7Partition]:
    """Offset-range partitions of ``[start, end)``: one per segment (``bases``: the segments'
    base offsets), or cut by size when that gives fewer than ``min_partitions``.
    Deterministic for a given range and segment list."""
    cuts = [start, *(b for b in bases if start < b < end), end]
    if len(cuts) - 1 < min_partitions:
        cuts = split_by_size(path, start, end, min_partitions)
    return [K7Partition(path, a, b) for a, b in itertools.pairwise(cuts)]


def split_by_size(path: str, start: int, end: int, parts: int) -> list[int]:
    """Cut [start, end) at frame boundaries into about ``parts`` equal byte ranges (one scan
    of the range: frames can only be found from a known boundary)."""
    step = max(1, (end - start) // parts)
    cuts, target = [start], start + step
    with Queue(path, readonly=True) as q:
        pos = start
        while pos < end:
            batch = q.read_columnar(pos, BATCH_MESSAGES)
            if not len(batch):
                break
            offs = batch.offsets
            while target < end and target <= offs[-1]:
                i = bisect.bisect_left(offs, target)
                if offs[i] > cuts[-1]:
                    cuts.append(offs[i])
                target = cuts[-1] + step
            pos = batch.next
    cuts.append(end)
    return cuts


def read_partition(
    partition: K7Partition, include_value: bool, *, skip_lost: bool
) -> Iterator[pa.RecordBatch]:
    """The frames of ``partition`` as Arrow record batches (batch and streaming reads)."""
    schema = arrow_schema(include_value)
    for batch in read_frames(partition, skip_lost=skip_lost):
        yield record_batch(batch, schema, include_value)


def read_frames(partition: K7Partition, *, skip_lost: bool) -> Iterator[ColumnarBatch]:
    """The frames of ``partition``, up to ``BATCH_MESSAGES`` at a time (queues and topics).

    A range that is no longer readable raises :class:`K7DataLossError`; with ``skip_lost``
    the part below the earliest segment is skipped instead."""
    path = Path(partition.path)
    pos = partition.start
    if pos >= partition.end:
        return
    bases = list_segments(path)
    earliest = bases[0] if bases else 0
    if pos < earliest:
        if not skip_lost:
            raise K7DataLossError(
                f"{path}: offsets {pos}..{min(earliest, partition.end)} were deleted before "
                f"they were read (the earliest segment starts at {earliest})",
                path=path, offset=pos, earliest=earliest,
                hint="a segment was deleted after this range was planned; a streaming query "
                "can set failOnDataLoss=false to skip what is gone",
            )
        pos = earliest
    with Queue(path, readonly=True) as q:
        while pos < partition.end:
            batch = q.read_columnar(pos, BATCH_MESSAGES)
            n = len(batch)
            if not n:
                raise K7DataLossError(
                    f"{path}: nothing readable at offset {pos}, below the planned end "
                    f"{partition.end}", path=path, offset=pos, earliest=earliest,
                    hint="was the queue rewritten or a segment deleted?",
                )
            k = bisect.bisect_left(batch.offsets, partition.end)
            if k < n:
                batch = ColumnarBatch(
                    batch.offsets[:k], batch.starts[:k], batch.lengths[:k], batch.view,
                    batch.offsets[k],
                )
            yield batch
            pos = batch.next


def limited_end(path: str, start: int, end: int, max_rows: int, max_bytes: int) -> int:
    """The frame boundary in ``(start, end]`` that takes at most ``max_rows`` frames and
    ``max_bytes`` bytes of log (frames with their headers), but always at least one frame
    (0: no limit)."""
    rows, pos = 0, start
    cap = start + max_bytes if max_bytes else end
    with Queue(path, readonly=True) as q:
        while pos < end:
            want = min(BATCH_MESSAGES, max_rows - rows) if max_rows else BATCH_MESSAGES
            batch = q.read_columnar(pos, want)
            n = len(batch)
            if not n:
                break
            offs = batch.offsets
            k = min(n, bisect.bisect_left(offs, end))  # frames that end by `end`
            if batch.next > cap:  # frames that end by `cap`: frame i ends at offs[i + 1]
                k = min(k, bisect.bisect_right(offs, cap, 1) - 1)
            if k == 0 and rows == 0:
                k = 1
            if k == 0:
                break
            rows += k
            pos = offs[k] if k < n else batch.next
            if k < n or (max_rows and rows >= max_rows):
                break
    return pos


# ---------------------------------------------------------------------------- topics


@dataclass(frozen=True)
class K7TopicPartition(K7Partition):
    """Frames in ``[start, end)`` of partition ``partition`` (its queue at ``path``) of the
    topic named ``topic``."""

    topic: str
    partition: int


def topic_bounds(topic: Path, partitions: int) -> list[tuple[int, int]]:
    """(earliest readable offset, visible end) of each partition of a topic (0, 0 for a
    partition whose queue is not there yet)."""
    out = []
    for p in range(partitions):
        d = partition_dir(topic, p)
        out.append(bounds(d) if d.is_dir() else (0, 0))
    return out


def plan_topic(
    topic: Path, ranges: list[tuple[int, int]], min_partitions: int, *, keep_empty: bool
) -> list[K7TopicPartition]:
    """Partitions of the ranges ``[start, end)`` of a topic's partitions (one range per
    partition, in partition order): at least one per partition that has frames to read
    (per segment, as ``plan``), more for the larger ones when ``min_partitions`` asks for
    more in all (shared in proportion to their bytes, as Kafka's source shares
    ``minPartitions``). ``keep_empty``: an empty partition for each empty range too."""
    total = sum(max(0, end - start) for start, end in ranges)
    out: list[K7TopicPartition] = []
    for p, (start, end) in enumerate(ranges):
        path = str(partition_dir(topic, p))
        if start >= end:
            if keep_empty:
                out.append(K7TopicPartition(path, start, start, topic.name, p))
            continue
        want = math.ceil(min_partitions * (end - start) / total) if min_partitions > 1 else 1
        for part in plan(path, start, end, list_segments(Path(path)), want):
            out.append(K7TopicPartition(part.path, part.start, part.end, topic.name, p))
    return out
