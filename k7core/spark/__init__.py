"""k7 queues as a PySpark data source: ``spark.dataSource.register(K7DataSource)``, then
``spark.read.format("k7").load(path)``.

Needs the ``spark`` extra (``pip install 'k7core[spark]'``: pyspark >= 4.0 and pyarrow).
Every method runs in a Python worker process that Spark starts, never in the user's process,
so the queue is opened ``readonly=True`` there (a live writer elsewhere is fine).

Status: batch read and batch write. Streaming read and write are not built yet.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from .. import Queue
from .._errors import GroupBusyError, K7Error, NotAQueueError, QueueLockedError
from .._format import check_group_name, cursor_name
from .._queue import ColumnarBatch
from .._storage import fsync_dir, list_segments

__all__ = ["STAGING_DIR", "K7DataSource", "K7OptionError", "K7Partition", "K7StagedRows"]

DEFAULT_SCHEMA = "offset BIGINT, payload BINARY"
VALUE_SCHEMA = "offset BIGINT, payload BINARY, value STRING"
BATCH_MESSAGES = 65536

log = logging.getLogger("k7core.spark")


class K7OptionError(K7Error, ValueError):
    """A data source option is missing or malformed."""


class K7DataLossError(K7Error):
    """Offsets a streaming query still had to read are gone: their segment was deleted, or
    the queue now ends before them (``failOnDataLoss=false`` skips them instead)."""


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

    Writing (``df.write.format("k7").mode("append").save(path)``) takes a ``payload`` BINARY
    or a ``value`` STRING column (UTF-8 encoded); ``lockTimeout`` (seconds, default 10) bounds
    the wait for the queue's writer lock at commit.
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

    def streamWriter(self, schema: StructType, overwrite: bool) -> K7StreamWriter:
        return K7StreamWriter(_lower(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> K7StreamReader:
        return K7StreamReader(_lower(self.options), schema)


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
                path=path, offset=pos, hint=LOSS_HINT,
            )
        pos = earliest
    with Queue(path, readonly=True) as q:
        while pos < partition.end:
            batch = q.read_columnar(pos, BATCH_MESSAGES)
            n = len(batch)
            if not n:
                raise K7DataLossError(
                    f"{path}: nothing readable at offset {pos}, below the planned end "
                    f"{partition.end}", path=path, offset=pos,
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


# ---------------------------------------------------------------------- streaming read


def _int_option(options: dict[str, str], key: str, default: int, minimum: int) -> int:
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise K7OptionError(f"option {key} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise K7OptionError(f"option {key} must be >= {minimum}, not {value}")
    return value


def _bounds(path: Path) -> tuple[int, int]:
    """(earliest readable offset, visible end) of the queue at ``path``."""
    bases = list_segments(path)
    with Queue(path, readonly=True) as q:
        end = q.end
    return (bases[0] if bases else 0), end


class K7StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges; offsets are ``{"offset": N}`` (N a frame boundary).

    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` run in one long-lived
    process per query run; ``read`` runs in executor processes on a pickled copy and depends
    only on the partition and the options, so a replayed batch reads the same frames.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        path = options.get("path")
        if not path:
            raise K7OptionError("the k7 source needs a path: load(path) or option('path', ...)")
        self.path = os.path.abspath(path)
        if not Path(self.path).is_dir():
            raise NotAQueueError(f"{self.path} is not a queue directory", path=self.path)
        self.include_value = _flag(options, "includeValue")
        self.min_partitions = _int_option(options, "minPartitions", 1, 1)
        self.starting = _option_offset(options, "startingOffsets", "earliest")
        self.group = options.get("group")
        if self.group is not None:
            check_group_name(self.group)
        self.max_rows = _int_option(options, "maxRecordsPerTrigger", 0, 1)
        self.max_bytes = _int_option(options, "maxBytesPerTrigger", 0, 1)
        fail = options.get("failondataloss", "true").strip().lower()
        if fail not in ("true", "false"):
            raise K7OptionError(f"option failOnDataLoss must be true or false, not {fail!r}")
        self.fail_on_data_loss = fail == "true"
        self.target: int | None = None  # the end fixed by Trigger.AvailableNow

    def initialOffset(self) -> dict[str, int]:
        qpath = Path(self.path)
        earliest, end = _bounds(qpath)
        if self.group is not None and (qpath / cursor_name(self.group)).exists():
            return {"offset": _committed(qpath, self.group)}
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
        self.target = _bounds(Path(self.path))[1]

    def reportLatestOffset(self) -> dict[str, int]:
        return {"offset": _bounds(Path(self.path))[1]}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        earliest, end = _bounds(Path(self.path))
        if self.target is not None:
            end = min(end, self.target)
        if start is None:  # pyspark < 4.2: no start, no limit
            return {"offset": end}
        pos = self._check_start(int(start["offset"]), earliest, end)
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
                                  hint=LOSS_HINT)
        log.warning("%s: %s; failOnDataLoss=false: continuing at %d", self.path, what, earliest)
        return earliest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[K7Partition]:
        stop = int(end["offset"])
        earliest, visible = _bounds(Path(self.path))
        pos = self._check_start(int(start["offset"]), earliest, max(visible, stop))
        if stop <= pos:
            return []
        return _plan(self.path, pos, stop, list_segments(Path(self.path)), self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, K7Partition)
        return _read_partition(
            partition, self.include_value, skip_lost=not self.fail_on_data_loss
        )

    def commit(self, end: dict[str, int]) -> None:
        """Move the ``group`` cursor (if any) to ``end``: Spark has processed everything
        before it. Advisory: the checkpoint, not the cursor, decides where a restart resumes."""
        if self.group is None:
            return
        try:
            with Queue(self.path, readonly=True) as q, q.consumer_group(
                self.group, cursor_fsync="sync"
            ) as cg:
                cg.seek(int(end["offset"]))
        except GroupBusyError:  # the next commit seeks again (absolute): nothing accumulates
            log.warning("%s: group %r is busy; its cursor was not moved to %s",
                        self.path, self.group, end["offset"])


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


# ---------------------------------------------------------------------- streaming write

SINK_PREFIX = "k7py-sink-"


def _query_id(options: dict[str, str]) -> str:
    """The streaming query's id, read from its checkpoint (it survives restarts; a new
    checkpoint is a new query)."""
    location = options.get("checkpointlocation")
    if not location:
        raise K7OptionError(
            "the k7 streaming sink needs option('checkpointLocation', ...): its exactly-once "
            "bookkeeping is keyed by the query id kept there"
        )
    if location.startswith("file:"):
        location = location[len("file:"):]
        location = "/" + location.lstrip("/")
    meta = Path(location) / "metadata"
    try:
        query_id = str(json.loads(meta.read_text())["id"])
    except (OSError, ValueError, KeyError) as exc:
        raise K7Error(
            f"cannot read the streaming query id from {meta}: {exc}", path=meta,
            hint="the k7 sink needs a checkpoint on a filesystem this process can read",
        ) from None
    if not query_id.replace("-", "").isalnum():
        raise K7Error(f"unexpected query id {query_id!r} in {meta}", path=meta)
    return query_id


class K7StreamWriter(_K7Sink, DataSourceStreamArrowWriter):
    """Exactly once per ``batchId``. Tasks stage Arrow files (as the batch writer does) in
    ``k7py-staging/<query id>/``; ``commit(messages, batchId)`` then, under the writer lock:

    1. reads the sink record ``k7py-sink-<query id>.json`` in the queue directory; if it says
       a commit was interrupted (``appending``), finishes that commit first (below);
    2. skips the batch if ``batchId`` <= the recorded batch (a replay after a crash);
    3. else records ``appending`` with the batch id, the queue end ``start`` and the staged
       files (written atomically: temp file, fsync, rename), appends the files, msyncs, and
       records ``done`` with the new end; then empties the staging directory.

    An interrupted commit is finished from its own staged files, kept until ``done``: the
    frames from ``start`` that equal the staged payloads in order are what was appended
    before the crash; the rest is appended. (Only if another writer appended, after the
    crash, frames equal to the next staged payloads could this be fooled.) A crash after
    ``done`` but before Spark recorded the batch makes Spark replay it, and step 2 skips it.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.query_id = _query_id(options)
        self.stage = os.path.join(self.path, STAGING_DIR, self.query_id)
        self.record = os.path.join(self.path, f"{SINK_PREFIX}{self.query_id}.json")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = _staged(messages)
        with self._open_writer() as q:
            rec = self._load()
            if rec is not None and rec["state"] == "appending":
                self._finish(q, rec)
                rec = self._load()
            if rec is not None and batchId <= int(rec["batch"]):
                log.info("%s: batch %d was committed before; skipped", self.path, batchId)
            else:
                files = [m.file for m in staged]
                start = q.end
                self._save({"batch": batchId, "state": "appending", "start": start,
                            "files": files})
                self._append_staged(q, files)
                q.sync()
                self._save({"batch": batchId, "state": "done", "start": start, "end": q.end})
        # Batches of one query run one after another: nothing else stages here now.
        with contextlib.suppress(FileNotFoundError):
            self._remove(e.path for e in os.scandir(self.stage))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._remove(m.file for m in _staged(messages))

    def _finish(self, q: Queue, rec: dict[str, Any]) -> None:
        """Complete the commit that a crash interrupted, from its own staged files."""
        files = [str(f) for f in rec["files"]]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise K7Error(
                f"{self.path}: batch {rec['batch']} of query {self.query_id} was interrupted "
                f"while being appended, and its staged files are gone ({missing[0]}, ...)",
                path=self.path, offset=int(rec["start"]),
                hint=f"the queue holds part of that batch after offset {rec['start']}",
            )
        done = self._count_appended(q, int(rec["start"]), files)
        log.warning("%s: finishing batch %s interrupted after %d messages",
                    self.path, rec["batch"], done)
        self._append_staged(q, files, skip=done)
        q.sync()
        self._save({"batch": rec["batch"], "state": "done", "start": rec["start"],
                    "end": q.end})

    @staticmethod
    def _count_appended(q: Queue, start: int, files: list[str]) -> int:
        """How many of the staged payloads (in order) are in the queue from ``start``."""
        import pyarrow.ipc as ipc

        matched, pos = 0, start
        batch, i = q.read_columnar(pos, BATCH_MESSAGES), 0
        for file in files:
            with pa.memory_map(file) as src:
                for staged in ipc.open_stream(src):
                    for value in staged.column(0).to_pylist():
                        if i == len(batch):
                            if not len(batch):
                                return matched
                            batch, i = q.read_columnar(batch.next, BATCH_MESSAGES), 0
                            if not len(batch):
                                return matched
                        if bytes(batch.payload(i)) != value:
                            return matched
                        i += 1
                        matched += 1
        return matched

    def _load(self) -> dict[str, Any] | None:
        try:
            with open(self.record, "rb") as f:
                rec: dict[str, Any] = json.loads(f.read())
        except FileNotFoundError:
            return None
        return rec

    def _save(self, rec: dict[str, Any]) -> None:
        """Replace the sink record atomically and durably."""
        tmp = self.record + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(rec).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.record)
        fsync_dir(Path(self.path))


def _append_binary(q: Queue, col: pa.Array) -> None:
    """Append an Arrow binary column as it is: its data buffer and int32 offsets."""
    n = len(col)
    if not n:
        return
    buffers = col.buffers()
    offsets = memoryview(buffers[1]).cast("i")[col.offset : col.offset + n + 1]
    data = buffers[2] if buffers[2] is not None else b""
    q.enqueue_columnar(memoryview(data), offsets)
