"""The streaming reader (PySpark >= 4.2: read limits, availableNow): micro-batches of
offset ranges, planned in one process per query run and read in executors."""

from __future__ import annotations

import bisect
import logging
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

from .. import NotAQueueError, Queue
from .._format import check_group_name
from .._storage import list_segments
from ._cursor import committed, move_cursor
from ._errors import K7DataLossError
from ._options import flag, int_option, offset_option, queue_path
from ._partitions import BATCH_MESSAGES, K7Partition, bounds, plan, read_partition

log = logging.getLogger("k7core.spark")

LOSS_HINT = "set the option failOnDataLoss=false to skip to the earliest available offset"


class K7StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
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
        self.group = options.get("group")
        if self.group is not None:
            check_group_name(self.group)
        self.max_rows = int_option(options, "maxRecordsPerTrigger", 0, 1)
        self.max_bytes = int_option(options, "maxBytesPerTrigger", 0, 1)
        self.fail_on_data_loss = flag(options, "failOnDataLoss", default=True)
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

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows:
            return ReadMaxRows(self.max_rows)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

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
        max_rows, max_bytes = 0, 0
        if isinstance(limit, ReadMaxRows):
            max_rows, max_bytes = limit.max_rows, self.max_bytes
        elif isinstance(limit, ReadMaxBytes):
            max_rows, max_bytes = self.max_rows, limit.max_bytes
        if max_rows or max_bytes:
            end = self._limited_end(pos, end, max_rows, max_bytes)
        return {"offset": end}

    def _limited_end(self, start: int, end: int, max_rows: int, max_bytes: int) -> int:
        """The frame boundary in ``(start, end]`` that takes at most ``max_rows`` frames and
        ``max_bytes`` bytes of log (frames with their headers), but always at least one frame."""
        rows, pos = 0, start
        cap = start + max_bytes if max_bytes else end
        with Queue(self.path, readonly=True) as q:
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

    def _check_start(self, start: int, earliest: int, end: int) -> int:
        """``start`` if it is still readable; else raise, or skip to ``earliest``."""
        if earliest <= start <= end:
            return start
        if start < earliest:
            what = (f"offset {start} is below the earliest segment ({earliest}): the "
                    f"messages in between were deleted before this query read them")
        else:
            what = (f"offset {start} is past the end of the queue ({end}): the queue was "
                    f"rewritten, or the offset was set past its end")
        if self.fail_on_data_loss:
            raise K7DataLossError(f"{self.path}: {what}", path=self.path, offset=start,
                                  earliest=earliest, hint=LOSS_HINT)
        log.warning("%s: %s; failOnDataLoss=false: continuing at %d", self.path, what, earliest)
        return earliest

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
