"""The batch reader: an offset range fixed once, when the DataFrame is planned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .. import NotAQueueError, Queue
from .._storage import list_segments
from ._cursor import committed
from ._errors import K7OptionError
from ._options import flag, int_option, offset_option, queue_path
from ._partitions import K7Partition, plan, read_partition


class K7BatchReader(DataSourceReader):
    """Plans a fixed offset range once (repeatable actions), reads it as Arrow batches."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = queue_path(options, "source", "load")
        self.include_value = flag(options, "includeValue")
        self.min_partitions = int_option(options, "minPartitions", 1, 1)
        start_opt = offset_option(options, "startingOffsets", "earliest")
        end_opt = offset_option(options, "endingOffsets", "latest")
        if end_opt == "earliest":
            raise K7OptionError("option endingOffsets cannot be 'earliest'")
        qpath = Path(self.path)
        if not qpath.is_dir():
            raise NotAQueueError(f"{qpath} is not a queue directory", path=qpath)
        bases = list_segments(qpath)
        with Queue(qpath, readonly=True) as q:
            latest = q.end
        earliest = bases[0] if bases else 0
        if "group" in options:
            start = committed(qpath, options["group"], latest) or 0  # no cursor yet: 0
        elif start_opt == "earliest":
            start = earliest
        elif start_opt == "latest":
            start = latest
        else:
            start = int(start_opt)
        end = latest if end_opt == "latest" else min(int(end_opt), latest)
        self.start, self.end = start, max(start, end)
        self.bases = bases

    def partitions(self) -> list[K7Partition]:
        if self.start >= self.end:
            return [K7Partition(self.path, self.start, self.start)]
        return plan(self.path, self.start, self.end, self.bases, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7Partition)
        return read_partition(partition, self.include_value, skip_lost=False)
