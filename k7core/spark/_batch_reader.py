"""The batch readers: an offset range fixed once, when the DataFrame is planned (of a
queue, or one per partition of a topic)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .. import NotAQueueError, Queue
from .._storage import list_segments
from ..topics._layout import partition_dir
from ._arrow import topic_record_batch
from ._cursor import committed
from ._errors import K7OptionError
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
    plan,
    plan_topic,
    read_frames,
    read_partition,
    topic_bounds,
)
from ._topic import topic_meta


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


class K7TopicBatchReader(DataSourceReader):
    """A topic's partitions read in parallel as Kafka's source rows: a range per partition
    fixed once (repeatable actions), at least one Spark partition per topic partition."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.path = queue_path(options, "source", "load")
        topic = Path(self.path)
        n = topic_meta(self.path).partitions
        if flag(options, "includeValue"):
            raise K7OptionError(
                "option includeValue is for queues: a topic's value column is BINARY "
                "(CAST(value AS STRING) decodes it)"
            )
        self.min_partitions = int_option(options, "minPartitions", 1, 1)
        starts = topic_offsets_option(options, "startingOffsets", "earliest", topic.name, n)
        ends = topic_offsets_option(options, "endingOffsets", "latest", topic.name, n)
        group = options.get("group")
        self.ranges: list[tuple[int, int]] = []
        for p, (earliest, latest) in enumerate(topic_bounds(topic, n)):
            stored = None
            if group is not None:
                stored = committed(partition_dir(topic, p), group, latest)
            start = stored if stored is not None else topic_offset(starts[p], earliest, latest)
            end = min(topic_offset(ends[p], earliest, latest), latest)
            self.ranges.append((start, max(start, end)))

    def partitions(self) -> list[K7TopicPartition]:
        return plan_topic(Path(self.path), self.ranges, self.min_partitions, keep_empty=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7TopicPartition)
        for batch in read_frames(partition, skip_lost=False):
            yield topic_record_batch(batch, partition.topic, partition.partition)

