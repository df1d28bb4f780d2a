"""The streaming readers (PySpark >= 4.2: read limits, availableNow): micro-batches of
offset ranges (of a queue, or one per partition of a topic), planned in one process per
query run and read in executors."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .. import K7Error, NotAQueueError
from .._format import check_group_name
from .._storage import list_segments
from ..topics._layout import partition_dir
from ._arrow import topic_record_batch
from ._cursor import committed, move_cursor
from ._errors import K7DataLossError, K7OptionError
from ._options import (
    flag,
    int_option,
    offset_option,
    queue_path,
    topic_offset,
    topic_offsets_option,
)
from ._partitions import (
    K7Partition,
    K7TopicPartition,
    bounds,
    limited_end,
    plan,
    plan_topic,
    read_frames,
    read_partition,
    topic_bounds,
)
from ._topic import topic_meta

log = logging.getLogger("k7core.spark")

LOSS_HINT = "set the option failOnDataLoss=false to skip to the earliest available offset"


class StreamOptions:
    """What the queue and topic streams share: the options ``group``, the read limits
    (``maxRecordsPerTrigger``, ``maxBytesPerTrigger``) and ``failOnDataLoss``; Spark's
    default limit, and the two numbers in force for the limit Spark passes."""

    group: str | None
    max_rows: int
    max_bytes: int
    fail_on_data_loss: bool

    def _stream_options(self, options: dict[str, str]) -> None:
        self.group = options.get("group")
        if self.group is not None:
            check_group_name(self.group)
        self.max_rows = int_option(options, "maxRecordsPerTrigger", 0, 1)
        self.max_bytes = int_option(options, "maxBytesPerTrigger", 0, 1)
        self.fail_on_data_loss = flag(options, "failOnDataLoss", default=True)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows:
            return ReadMaxRows(self.max_rows)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def _limits(self, limit: ReadLimit | None) -> tuple[int, int]:
        """(rows, bytes) at most in a micro-batch (0: no limit): the engine passes one
        limit, the other option still applies."""
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, self.max_bytes
        if isinstance(limit, ReadMaxBytes):
            return self.max_rows, limit.max_bytes
        return 0, 0


class K7StreamReader(StreamOptions, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges; offsets are ``{"offset": N}`` (N a frame boundary).

    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` run in one long-lived
    process per query run; ``read`` runs in executor processes on a pickled copy and depends
    only on the partition and the options, so a replayed batch reads the same frames.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = queue_path(options, "source", "load")
        if not Path(self.path).is_dir():
            raise NotAQueueError(f"{self.path} is not a queue directory", path=self.path)
        self.include_value = flag(options, "includeValue")
        self.min_partitions = int_option(options, "minPartitions", 1, 1)
        self.starting = offset_option(options, "startingOffsets", "earliest")
        self._stream_options(options)
        self.target: int | None = None  # the end fixed by Trigger.AvailableNow

    def initialOffset(self) -> dict[str, int]:
        qpath = Path(self.path)
        earliest, end = bounds(qpath)
        if self.group is not None:
            stored = committed(qpath, self.group, end)
            if stored is not None:  # the group exists
                return {"offset": stored}
        if self.starting == "earliest":
            return {"offset": earliest}
        if self.starting == "latest":
            return {"offset": end}
        return {"offset": int(self.starting)}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = bounds(Path(self.path))[1]

    def reportLatestOffset(self) -> dict[str, int]:
        return {"offset": bounds(Path(self.path))[1]}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        earliest, visible = bounds(Path(self.path))
        end = visible if self.target is None else min(visible, self.target)
        if start is None:  # the pre-4.2 signature: no start, no limit
            return {"offset": end}
        pos = self._check_start(int(start["offset"]), earliest, visible)
        if end <= pos:
            return {"offset": max(pos, int(start["offset"]))}
        max_rows, max_bytes = self._limits(limit)
        if max_rows or max_bytes:
            end = limited_end(self.path, pos, end, max_rows, max_bytes)
        return {"offset": end}

    def _check_start(self, start: int, earliest: int, end: int) -> int:
        return check_start(self.path, start, earliest, end, self.fail_on_data_loss)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[K7Partition]:
        stop = int(end["offset"])
        earliest, visible = bounds(Path(self.path))
        pos = self._check_start(int(start["offset"]), earliest, max(visible, stop))
        if stop <= pos:
            return []
        return plan(self.path, pos, stop, list_segments(Path(self.path)), self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7Partition)
        return read_partition(
            partition, self.include_value, skip_lost=not self.fail_on_data_loss
        )

    def commit(self, end: dict[str, int]) -> None:
        """Move the ``group`` cursor (if any) to ``end``: Spark has processed everything
        before it. Advisory: the checkpoint, not the cursor, decides where a restart resumes."""
        if self.group is not None:
            move_cursor(Path(self.path), self.group, int(end["offset"]))


def check_start(path: str, start: int, earliest: int, end: int, fail_on_data_loss: bool) -> int:
    """``start`` if it is still readable in the log at ``path`` (``earliest`` .. ``end``);
    else raise :class:`K7DataLossError`, or (``fail_on_data_loss`` false) warn and skip to
    ``earliest``."""
    if earliest <= start <= end:
        return start
    if start < earliest:
        what = (f"offset {start} is below the earliest segment ({earliest}): the "
                f"messages in between were deleted before this query read them")
    else:
        what = (f"offset {start} is past the end of the queue ({end}): the queue was "
                f"rewritten, or the offset was set past its end")
    if fail_on_data_loss:
        raise K7DataLossError(f"{path}: {what}", path=path, offset=start,
                              earliest=earliest, hint=LOSS_HINT)
    log.warning("%s: %s; failOnDataLoss=false: continuing at %d", path, what, earliest)
    return earliest


TopicOffsets = dict[str, dict[str, int]]
"""A topic stream's offset, as in Kafka's checkpoints: ``{"<topic>": {"0": 123, ...}}``."""


class K7TopicStreamReader(StreamOptions, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a topic: a range per partition, read in parallel as Kafka's source
    rows. Offsets are ``{"<topic>": {"<partition>": N, ...}}`` (N a frame boundary of that
    partition's log); the read limits are shared between the partitions in proportion to
    their backlog (in bytes), each with a backlog getting at least one record, as Kafka's
    ``maxOffsetsPerTrigger`` does."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = queue_path(options, "source", "load")
        self.topic = Path(self.path).name
        self.n = topic_meta(self.path).partitions
        if flag(options, "includeValue"):
            raise K7OptionError(
                "option includeValue is for queues: a topic's value column is BINARY "
                "(CAST(value AS STRING) decodes it)"
            )
        if "endingoffsets" in options:
            raise K7OptionError("option endingOffsets is for batch reads, not streaming ones")
        self.min_partitions = int_option(options, "minPartitions", 1, 1)
        self.starting = topic_offsets_option(
            options, "startingOffsets", "earliest", self.topic, self.n
        )
        self._stream_options(options)
        self.target: list[int] | None = None  # the ends fixed by Trigger.AvailableNow

    def _part(self, p: int) -> str:
        return str(partition_dir(Path(self.path), p))

    def _bounds(self) -> list[tuple[int, int]]:
        return topic_bounds(Path(self.path), self.n)

    def _offsets(self, offsets: list[int]) -> TopicOffsets:
        return {self.topic: {str(p): off for p, off in enumerate(offsets)}}

    def _parse(self, offset: TopicOffsets) -> list[int]:
        """The per-partition offsets of a checkpointed offset of this topic."""
        per = offset.get(self.topic)
        if per is None or len(per) != self.n:
            raise K7Error(
                f"{self.path}: the query's checkpoint holds offsets of "
                f"{json.dumps(offset)[:200]}, not of this topic ({self.topic!r}, "
                f"{self.n} partitions)", path=self.path,
                hint="a checkpoint belongs to one source: start the query with a new "
                "checkpointLocation",
            )
        return [int(per[str(p)]) for p in range(self.n)]

    def initialOffset(self) -> TopicOffsets:
        out = []
        for p, (earliest, end) in enumerate(self._bounds()):
            stored = None
            if self.group is not None:
                stored = committed(Path(self._part(p)), self.group, end)
            out.append(stored if stored is not None
                       else topic_offset(self.starting[p], earliest, end))
        return self._offsets(out)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = [end for _, end in self._bounds()]

    def reportLatestOffset(self) -> TopicOffsets:
        return self._offsets([end for _, end in self._bounds()])

    def latestOffset(
        self, start: TopicOffsets | None = None, limit: ReadLimit | None = None
    ) -> TopicOffsets:
        bounds = self._bounds()
        ends = [visible if self.target is None else min(visible, self.target[p])
                for p, (_, visible) in enumerate(bounds)]
        if start is None:  # the pre-4.2 signature: no start, no limit
            return self._offsets(ends)
        starts = self._parse(start)
        pos = [check_start(self._part(p), s, earliest, visible, self.fail_on_data_loss)
               for p, (s, (earliest, visible)) in enumerate(zip(starts, bounds, strict=True))]
        max_rows, max_bytes = self._limits(limit)
        lags = [max(0, end - p) for p, end in zip(pos, ends, strict=True)]
        total = sum(lags)
        out = []
        for p in range(self.n):
            if not lags[p]:
                out.append(max(pos[p], starts[p]))
            elif max_rows or max_bytes:
                out.append(limited_end(
                    self._part(p), pos[p], ends[p], prorate(max_rows, lags[p], total),
                    prorate(max_bytes, lags[p], total),
                ))
            else:
                out.append(ends[p])
        return self._offsets(out)

    def partitions(
        self, start: TopicOffsets, end: TopicOffsets
    ) -> list[K7TopicPartition]:
        stops = self._parse(end)
        ranges = []
        for p, (s, (earliest, visible)) in enumerate(
            zip(self._parse(start), self._bounds(), strict=True)
        ):
            pos = check_start(self._part(p), s, earliest, max(visible, stops[p]),
                              self.fail_on_data_loss)
            ranges.append((pos, max(pos, stops[p])))
        return plan_topic(Path(self.path), ranges, self.min_partitions, keep_empty=False)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7TopicPartition)
        for batch in read_frames(partition, skip_lost=not self.fail_on_data_loss):
            yield topic_record_batch(batch, partition.topic, partition.partition)

    def commit(self, end: TopicOffsets) -> None:
        """Move the ``group`` cursor of each partition (if any) to its ``end``: advisory, as
        for a queue."""
        if self.group is not None:
            for p, off in enumerate(self._parse(end)):
                move_cursor(Path(self._part(p)), self.group, off)


def prorate(limit: int, lag: int, total: int) -> int:
    """A partition's share of a read limit (0: none), in proportion to its backlog: rounded
    down, but at least 1 (Kafka's ``maxOffsetsPerTrigger`` rule)."""
    if not limit:
        return 0
    share = limit * lag / total
    return math.ceil(share) if share < 1 else math.floor(share)
