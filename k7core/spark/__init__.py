"""k7 queues as a PySpark data source: ``spark.dataSource.register(K7DataSource)``, then
``spark.read.format("k7").load(path)`` or ``spark.readStream.format("k7").load(path)``.

Needs the ``spark`` extra (``pip install 'k7py[spark]'``: pyspark >= 4.2 and pyarrow); without
it, importing this module raises a :class:`ModuleNotFoundError` that says so. Every method
runs in a Python worker process that Spark starts, never in the user's process, so the queue
is opened ``readonly=True`` there (a live writer elsewhere is fine). The workers must import
this k7core: :func:`local_session` points ``PYSPARK_PYTHON`` at the running interpreter.

Status: batch read, batch write (all or nothing), streaming read (read limits, availableNow,
group cursor, failOnDataLoss) and streaming write (exactly once per batch id); the streaming
classes are in :mod:`k7core.spark._stream`.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import MissingExtraError

try:
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.types import BinaryType, StringType, StructType
except ImportError as exc:
    raise MissingExtraError("k7core.spark", "spark", exc) from exc

from .. import Queue
from .._columnar import ColumnarBatch
from .._errors import DataLossError, K7Error, NotAQueueError, QueueLockedError, StorageError
from .._format import check_group_name, cursor_name, decode_cursor
from .._group import check_cursor
from .._storage import list_segments, read_file

if TYPE_CHECKING:
    from ._stream import K7StreamReader, K7StreamWriter

__all__ = [
    "STAGING_DIR",
    "K7DataLossError",
    "K7DataSource",
    "K7OptionError",
    "K7Partition",
    "K7StagedRows",
    "local_session",
]

DEFAULT_SCHEMA = "offset BIGINT, payload BINARY"
VALUE_SCHEMA = "offset BIGINT, payload BINARY, value STRING"
BATCH_MESSAGES = 65536

log = logging.getLogger("k7core.spark")


class K7OptionError(K7Error, ValueError):
    """A data source option is missing or malformed."""


class K7DataLossError(DataLossError):
    """Offsets a query still had to read are gone: their segment was deleted, or the queue
    now ends before them (a streaming query with ``failOnDataLoss=false`` skips them). A
    :class:`k7core.DataLossError`, with ``earliest`` the first offset still in the log."""


LOSS_HINT = "set the option failOnDataLoss=false to skip to the earliest available offset"


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


def _committed(path: Path, group: str, end: int) -> int:
    """A group's committed cursor as stored on disk (read without taking the group);
    ``CursorError`` when the group could not read from there in the log that ends at
    ``end`` (as its ``poll`` would say)."""
    cursor = path / cursor_name(check_group_name(group))
    try:
        committed = decode_cursor(read_file(cursor))
    except StorageError as exc:
        if exc.errno == errno.ENOENT:
            return 0
        raise
    err = check_cursor(path, group, committed, end)
    if err is not None:
        raise err
    return committed


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

    Streaming reads take the same options except ``endingOffsets``; ``startingOffsets`` and
    ``group`` apply to a new query only (a restart resumes at its checkpoint), ``group`` only
    if the group exists, and the group's cursor follows the query's progress. Also:

    - ``maxRecordsPerTrigger`` / ``maxBytesPerTrigger``: at most this many messages / bytes
      of log (frames with headers) per micro-batch, at least one message;
    - ``failOnDataLoss``: ``true`` (default) fails the query when offsets it still has to
      read are gone; ``false`` logs a warning and continues at the earliest offset.

    Writing (``df.write.format("k7").mode("append").save(path)``, or ``writeStream`` with a
    ``checkpointLocation``) takes a ``payload`` BINARY or a ``value`` STRING column (UTF-8
    encoded); ``lockTimeout`` (seconds, default 10) bounds the wait for the queue's writer
    lock at commit.
    """

    @classmethod
    def name(cls) -> str:
        return "k7"

    def schema(self) -> str:
        return VALUE_SCHEMA if _flag(_lower(self.options), "includeValue") else DEFAULT_SCHEMA

    def reader(self, schema: StructType) -> K7BatchReader:
        return K7BatchReader(_lower(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> K7BatchWriter:
        return K7BatchWriter(_lower(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> K7StreamReader:
        try:
            from ._stream import K7StreamReader
        except ImportError as exc:
            raise _needs_new_pyspark(exc) from exc
        return K7StreamReader(_lower(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> K7StreamWriter:
        try:
            from ._stream import K7StreamWriter
        except ImportError as exc:
            raise _needs_new_pyspark(exc) from exc
        return K7StreamWriter(_lower(self.options), schema, overwrite)


def _needs_new_pyspark(exc: ImportError) -> K7Error:
    """Streaming needs pyspark >= 4.2 (read limits, the Arrow stream writer)."""
    import pyspark

    return K7Error(
        f"k7 streaming needs pyspark >= 4.2; this is pyspark {pyspark.__version__} ({exc})",
        hint="pip install -U 'k7py[spark]'",
    )


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
            start = _committed(qpath, options["group"], latest)
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
        return _plan(self.path, self.start, self.end, self.bases, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7Partition)
        return _read_partition(partition, self.include_value, skip_lost=False)


def _plan(
    path: str, start: int, end: int, bases: list[int], min_partitions: int
) -> list[K7Partition]:
    """Offset-range partitions of ``[start, end)``: one per segment, or cut by size when that
    gives fewer than ``min_partitions``. Deterministic for a given range and segment list."""
    cuts = [start, *(b for b in bases if start < b < end), end]
    if len(cuts) - 1 < min_partitions:
        cuts = _split_by_size(path, start, end, min_partitions)
    return [K7Partition(path, a, b) for a, b in itertools.pairwise(cuts)]


def _split_by_size(path: str, start: int, end: int, parts: int) -> list[int]:
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


def _arrow_schema(include_value: bool) -> pa.Schema:
    return pa.schema(
        [pa.field("offset", pa.int64()), pa.field("payload", pa.binary())]
        + ([pa.field("value", pa.string())] if include_value else [])
    )


def _read_partition(
    partition: K7Partition, include_value: bool, *, skip_lost: bool
) -> Iterator[pa.RecordBatch]:
    """The frames of ``partition`` as Arrow record batches (batch and streaming reads).

    A range that is no longer readable raises :class:`K7DataLossError`; with ``skip_lost``
    the part below the earliest segment is skipped instead."""
    schema = _arrow_schema(include_value)
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
            yield _record_batch(batch, schema, include_value)
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


# ---------------------------------------------------------------------- batch write

STAGING_DIR = "k7py-staging"


@dataclass(frozen=True)
class K7StagedRows(WriterCommitMessage):
    """What one write task staged: an Arrow IPC stream file of payloads, and its row count."""

    file: str
    rows: int


class _K7Sink:
    """What the batch and streaming writers share: options, staging, the writer lock."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise K7OptionError(
                "the k7 sink only appends: use mode('append') (a queue is never overwritten)"
            )
        path = options.get("path")
        if not path:
            raise K7OptionError("the k7 sink needs a path: save(path) or option('path', ...)")
        self.path = os.path.abspath(path)
        self.stage = os.path.join(self.path, STAGING_DIR)
        fields = {f.name: f.dataType for f in schema.fields}
        if isinstance(fields.get("payload"), BinaryType):
            self.column, self.is_string = "payload", False
        elif isinstance(fields.get("value"), StringType):
            self.column, self.is_string = "value", True
        else:
            found = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
            raise K7OptionError(
                f"the k7 sink needs a 'payload' BINARY or a 'value' STRING column; "
                f"the DataFrame has: {found or 'no columns'}"
            )
        try:
            self.lock_timeout = float(options.get("locktimeout", "10"))
        except ValueError:
            raise K7OptionError("option lockTimeout must be seconds (a number)") from None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> K7StagedRows:
        """Runs in a task: stage the rows' payloads in an Arrow IPC stream file."""
        import pyarrow.ipc as ipc

        stage = Path(self.stage)
        stage.mkdir(parents=True, exist_ok=True)
        file = stage / f"{uuid.uuid4().hex}.arrow"
        rows = 0
        schema = pa.schema([pa.field("payload", pa.binary())])
        with pa.OSFile(str(file), "wb") as sink, ipc.new_stream(sink, schema) as out:
            for batch in iterator:
                col = batch.column(self.column)
                if col.null_count:
                    raise K7Error(
                        f"the k7 sink got a null {self.column} (a message must have bytes)",
                        path=Path(self.path),
                    )
                if self.is_string:
                    col = col.cast(pa.binary())
                out.write_batch(pa.RecordBatch.from_arrays([col], schema=schema))
                rows += len(col)
        return K7StagedRows(str(file), rows)

    @staticmethod
    def _append_staged(q: Queue, files: list[str], skip: int = 0) -> None:
        """Append the staged files' payloads in order, leaving out the first ``skip``."""
        import pyarrow.ipc as ipc

        for file in files:
            with pa.memory_map(file) as src:
                for batch in ipc.open_stream(src):
                    col = batch.column(0)
                    if skip >= len(col):
                        skip -= len(col)
                        continue
                    _append_binary(q, col.slice(skip))
                    skip = 0

    def _open_writer(self) -> Queue:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.01
        while True:
            try:
                return Queue(self.path, fsync="flush")
            except QueueLockedError:
                if time.monotonic() >= deadline:
                    raise QueueLockedError(
                        f"queue {self.path} stayed locked by another writer for "
                        f"{self.lock_timeout} s; nothing was appended",
                        path=Path(self.path),
                        hint="close the other writer, or raise the lockTimeout option",
                    ) from None
                time.sleep(delay)  # another process holds the lock: nothing to wait on here
                delay = min(delay * 2, 0.5)

    @staticmethod
    def _remove(files: Iterable[str]) -> None:
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file)


def _staged(messages: list[WriterCommitMessage | None]) -> list[K7StagedRows]:
    return [m for m in messages if isinstance(m, K7StagedRows)]


class K7BatchWriter(_K7Sink, DataSourceArrowWriter):
    """All-or-nothing append: tasks stage their rows next to the queue; the driver-side
    ``commit`` appends every staged file under the queue's writer lock and msyncs once;
    ``abort`` deletes the staged files and leaves the queue untouched."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        staged = _staged(messages)
        try:
            with self._open_writer() as q:
                self._append_staged(q, [m.file for m in staged])
                q.sync()
        finally:
            self._remove(m.file for m in staged)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._remove(m.file for m in _staged(messages))


def _append_binary(q: Queue, col: pa.Array) -> None:
    """Append an Arrow binary column as it is: its data buffer and int32 offsets."""
    n = len(col)
    if not n:
        return
    buffers = col.buffers()
    offsets = memoryview(buffers[1]).cast("i")[col.offset : col.offset + n + 1]
    data = buffers[2] if buffers[2] is not None else b""
    q.enqueue_columnar(memoryview(data), offsets)


def local_session(app_name: str = "k7", **conf: str) -> Any:
    """A SparkSession on this machine (``local[2]``, UI and console progress off, 2 shuffle
    partitions, UTC) with ``format("k7")`` registered: for examples, tests and benchmarks.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` unless set, and ``PYSPARK_PYTHON`` to this interpreter
    so that Spark's Python workers import this k7core. ``conf`` adds Spark settings (dots
    as ``_``: ``sql_warehouse_dir="/tmp/w"`` is ``spark.sql.warehouse.dir``).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]").appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config("spark." + key.replace("_", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(K7DataSource)
    return session
