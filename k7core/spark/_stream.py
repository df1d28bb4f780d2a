"""The streaming half of the k7 data source (PySpark >= 4.2: read limits, availableNow, the
Arrow stream writer). Imported when a streaming query first asks for it, so batch reads and
writes also work on older PySpark."""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
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
from pyspark.sql.types import StructType

from .. import Queue
from .._errors import GroupBusyError, K7Error, NotAQueueError, StorageError
from .._format import check_group_name, cursor_name
from .._storage import list_segments, read_file, write_file_atomic
from . import (
    BATCH_MESSAGES,
    LOSS_HINT,
    STAGING_DIR,
    K7DataLossError,
    K7OptionError,
    K7Partition,
    _committed,
    _flag,
    _K7Sink,
    _option_offset,
    _plan,
    _read_partition,
    _staged,
    log,
)

__all__ = ["SINK_PREFIX", "K7StreamReader", "K7StreamWriter"]


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
            return {"offset": _committed(qpath, self.group, end)}
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
        earliest, visible = _bounds(Path(self.path))
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
        with contextlib.suppress(OSError):
            os.rmdir(self.stage)

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
            rec: dict[str, Any] = json.loads(read_file(Path(self.record)))
        except StorageError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return rec

    def _save(self, rec: dict[str, Any]) -> None:
        """Replace the sink record atomically and durably."""
        write_file_atomic(Path(self.record), json.dumps(rec).encode())
