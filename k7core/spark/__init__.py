"""k7 queues as a PySpark data source: ``spark.dataSource.register(K7DataSource)``, then
``spark.read.format("k7").load(path)``.

Needs the ``spark`` extra (``pip install 'k7core[spark]'``: pyspark >= 4.0 and pyarrow).
Every method runs in a Python worker process that Spark starts, never in the user's process,
so the queue is opened ``readonly=True`` there (a live writer elsewhere is fine).

Status: batch read. Streaming read, batch and streaming write are not built yet.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .. import Queue
from .._errors import K7Error, NotAQueueError
from .._format import check_group_name, cursor_name
from .._queue import ColumnarBatch
from .._storage import list_segments

__all__ = ["K7DataSource", "K7Partition"]

DEFAULT_SCHEMA = "offset BIGINT, payload BINARY"
VALUE_SCHEMA = "offset BIGINT, payload BINARY, value STRING"
BATCH_MESSAGES = 65536


class K7OptionError(K7Error, ValueError):
    """A data source option is missing or malformed."""


@dataclass(frozen=True)
class K7Partition(InputPartition):
    """Frames in ``[start, end)`` of the queue at ``path`` (both frame boundaries)."""

    path: str
    start: int
    end: int


def _option_offset(options: dict[str, str], key: str, default: str) -> str | int:
    raw = options.get(key.lower(), default).strip()
    if raw in ("earliest", "latest"):
        return raw
    try:
        value = int(raw)
    except ValueError:
        raise K7OptionError(
            f"option {key} must be 'earliest', 'latest' or a non-negative offset, not {raw!r}"
        ) from None
    if value < 0:
        raise K7OptionError(f"option {key} must be >= 0, not {value}")
    return value


def _committed(path: Path, group: str) -> int:
    """A group's committed cursor as stored on disk (read without taking the group)."""
    cursor = path / cursor_name(check_group_name(group))
    try:
        data = cursor.read_bytes()[:8]
    except FileNotFoundError:
        return 0
    return int.from_bytes(data, "big") if len(data) == 8 else 0


class K7DataSource(DataSource):
    """The ``"k7"`` format. Options (all strings, as Spark passes them):

    - ``path`` (or ``load(path)``): the queue directory;
    - ``startingOffsets``: ``earliest`` (default), ``latest`` or an offset (a frame boundary);
    - ``endingOffsets``: ``latest`` (default) or an offset;
    - ``group``: start from this consumer group's committed cursor (overrides
      ``startingOffsets``; the group is only read, not moved);
    - ``minPartitions``: split the range into at least this many partitions (default: one
      per segment);
    - ``includeValue``: ``true`` adds a ``value`` STRING column (the payload decoded as UTF-8,
      invalid bytes replaced).
    """

    @classmethod
    def name(cls) -> str:
        return "k7"

    def schema(self) -> str:
        return VALUE_SCHEMA if _flag(_lower(self.options), "includeValue") else DEFAULT_SCHEMA

    def reader(self, schema: StructType) -> K7BatchReader:
        return K7BatchReader(_lower(self.options), schema)


def _lower(options: Any) -> dict[str, str]:
    """Spark's option names are case-insensitive: look them up in lower case."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _flag(options: dict[str, str], key: str) -> bool:
    raw = str(options.get(key.lower(), "false")).strip().lower()
    if raw not in ("true", "false"):
        raise K7OptionError(f"option {key} must be true or false, not {raw!r}")
    return raw == "true"


class K7BatchReader(DataSourceReader):
    """Plans a fixed offset range once (repeatable actions), reads it as Arrow batches."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        path = options.get("path")
        if not path:
            raise K7OptionError("the k7 source needs a path: load(path) or option('path', ...)")
        self.path = os.path.abspath(path)
        self.include_value = _flag(options, "includeValue")
        try:
            min_partitions = int(options.get("minpartitions", "1"))
        except ValueError:
            raise K7OptionError("option minPartitions must be a positive integer") from None
        if min_partitions < 1:
            raise K7OptionError("option minPartitions must be >= 1")
        self.min_partitions = min_partitions
        start_opt = _option_offset(options, "startingOffsets", "earliest")
        end_opt = _option_offset(options, "endingOffsets", "latest")
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
            start = _committed(qpath, options["group"])
        elif start_opt == "earliest":
            start = earliest
        elif start_opt == "latest":
            start = latest
        else:
            start = int(start_opt)
        end = latest if end_opt == "latest" else min(int(end_opt), latest)
        self.start, self.end = start, max(start, end)
        self.bases = [b for b in bases if self.start < b < self.end]

    def partitions(self) -> list[K7Partition]:
        if self.start >= self.end:
            return [K7Partition(self.path, self.start, self.start)]
        cuts = [self.start, *self.bases, self.end]
        if len(cuts) - 1 < self.min_partitions:
            cuts = self._split_by_size()
        return [K7Partition(self.path, a, b) for a, b in itertools.pairwise(cuts)]

    def _split_by_size(self) -> list[int]:
        """Cut [start, end) at frame boundaries into about ``min_partitions`` equal byte
        ranges (one scan of the range: frames can only be found from a known boundary)."""
        step = max(1, (self.end - self.start) // self.min_partitions)
        cuts, target = [self.start], self.start + step
        with Queue(self.path, readonly=True) as q:
            pos = self.start
            while pos < self.end:
                batch = q.read_columnar(pos, BATCH_MESSAGES)
                if not len(batch):
                    break
                offs = batch.offsets
                while target < self.end and target <= offs[-1]:
                    i = bisect.bisect_left(offs, target)
                    if offs[i] > cuts[-1]:
                        cuts.append(offs[i])
                    target = cuts[-1] + step
                pos = batch.next
        cuts.append(self.end)
        return cuts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7Partition)
        schema = pa.schema(
            [pa.field("offset", pa.int64()), pa.field("payload", pa.binary())]
            + ([pa.field("value", pa.string())] if self.include_value else [])
        )
        if partition.start >= partition.end:
            return
        with Queue(partition.path, readonly=True) as q:
            pos = partition.start
            while pos < partition.end:
                batch = q.read_columnar(pos, BATCH_MESSAGES)
                n = len(batch)
                if not n:
                    raise K7Error(
                        f"{partition.path}: nothing readable at offset {pos}, below the "
                        f"planned end {partition.end}", path=Path(partition.path), offset=pos,
                        hint="was the queue rewritten or a segment deleted?",
                    )
                k = bisect.bisect_left(batch.offsets, partition.end)
                if k < n:
                    batch = ColumnarBatch(
                        batch.offsets[:k], batch.starts[:k], batch.lengths[:k], batch.view,
                        batch.offsets[k],
                    )
                yield _record_batch(batch, schema, self.include_value)
                pos = batch.next


def _record_batch(batch: ColumnarBatch, schema: pa.Schema, include_value: bool) -> pa.RecordBatch:
    """Column-wise: the offsets array as it is, payloads gathered by the C kernel into one
    buffer with Arrow int32 offsets. No Python object per row."""
    n = len(batch)
    data, offs = batch.gather()
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.offsets)])
    payload = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(data)]
    )
    columns = [offsets, payload]
    if include_value:
        columns.append(_utf8(payload))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _utf8(payload: pa.Array) -> pa.Array:
    """UTF-8 view of the payloads; invalid bytes replaced (per row, only where invalid)."""
    try:
        arr = payload.cast(pa.string())
        arr.validate(full=True)
        return arr
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [bytes(v).decode("utf-8", "replace") for v in payload.to_pylist()], pa.string()
        )
