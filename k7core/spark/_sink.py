"""What the batch and streaming sinks share: rows staged by tasks in Arrow files under
``<queue>/k7py-staging/``, appended by the driver-side commit under the writer lock; for a
topic, rows appended by the tasks themselves to its partitions (shared writers)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from .. import Fsync, K7Error, Queue, QueueLockedError, StorageError
from .._shared import shared_fsync
from .._storage import map_file, open_fd
from ..topics import Topic
from ..topics._envelope import encode
from ..topics._layout import partition_dir
from ..topics._partitioner import KeylessSpreader
from ._arrow import PAYLOAD_SCHEMA, append_binary, payload_column, topic_columns, topic_rows
from ._errors import K7OptionError
from ._options import queue_path, seconds_option
from ._topic import ensure_topic, topic_meta

T = TypeVar("T")

STAGING_DIR = "k7py-staging"
"""The directory of a queue where sink tasks stage their rows (a directory, not a file)."""


@dataclass(frozen=True)
class K7StagedRows(WriterCommitMessage):
    """What one write task staged: an Arrow IPC stream file of payloads, and its row count."""

    file: str
    rows: int


class Sink:
    """Options and the task side of a sink: ``write`` stages a task's rows in ``stage``."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise K7OptionError(
                "the k7 sink only appends: use mode('append') (a queue is never overwritten)"
            )
        self.path = queue_path(options, "sink", "save")
        self.stage = os.path.join(self.path, STAGING_DIR)
        self.column, self.is_string = payload_column(schema)
        self.lock_timeout = seconds_option(options, "lockTimeout", 10.0)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> K7StagedRows:
        """Runs in a task: stage the rows' payloads in an Arrow IPC stream file."""
        make_dirs(Path(self.path), Path(self.stage))
        file = os.path.join(self.stage, f"{uuid.uuid4().hex}.arrow")
        rows = 0
        fd = open_fd(Path(file), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as sink, ipc.new_stream(sink, PAYLOAD_SCHEMA) as out:
                for batch in iterator:
                    col = batch.column(self.column)
                    if col.null_count:
                        raise K7Error(
                            f"the k7 sink got a null {self.column} (a message must have "
                            f"bytes)", path=Path(self.path),
                        )
                    if self.is_string:
                        col = col.cast(pa.binary())
                    out.write_batch(pa.RecordBatch.from_arrays([col], schema=PAYLOAD_SCHEMA))
                    rows += len(col)
        except BaseException:
            remove([file])  # a failed task leaves nothing staged
            raise
        return K7StagedRows(file, rows)


def make_dirs(queue: Path, stage: Path) -> None:
    """Create ``queue`` (as the queue would), then ``stage`` and the directories between;
    a link or a file in place of those is a ``StorageError`` (no link inside a queue
    directory is followed)."""
    queue.mkdir(parents=True, exist_ok=True)
    path = queue
    for part in stage.relative_to(queue).parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        os.close(open_fd(path, os.O_RDONLY | os.O_DIRECTORY))


def staged(messages: list[WriterCommitMessage | None]) -> list[K7StagedRows]:
    """The staged files of a job's tasks (Spark passes None for a task that failed)."""
    return [m for m in messages if isinstance(m, K7StagedRows)]


def staged_batches(file: str) -> Iterator[pa.RecordBatch]:
    """The record batches of a staged file, read from a map of it (no copy)."""
    m = map_file(Path(file), writable=False)
    if m is None or m.view is None:
        return
    try:
        yield from ipc.open_stream(pa.py_buffer(m.view))
    finally:
        m.close()  # unmapped once the last batch read from it is dropped too


def append_staged(q: Queue, files: list[str], skip: int = 0) -> None:
    """Append the staged files' payloads in order, leaving out the first ``skip``."""
    for file in files:
        for batch in staged_batches(file):
            col = batch.column(0)
            if skip >= len(col):
                skip -= len(col)
                continue
            append_binary(q, col.slice(skip))
            skip = 0


def open_writer(path: str, lock_timeout: float) -> Queue:
    """The queue at ``path`` opened as its writer: exclusive, or one more shared writer when
    processes write it with ``writers="shared"`` (with their fsync strategy); retried with
    backoff while an exclusive writer holds it, for ``lock_timeout`` seconds."""

    def attempt() -> Queue:
        shared = shared_fsync(Path(path))
        if shared is not None:
            return Queue(path, fsync=shared.value, writers="shared")
        return Queue(path, fsync="flush")

    return retry_locked(attempt, lock_timeout, f"queue {path} stayed locked by another writer",
                        Path(path))


def open_topic_writer(path: str, lock_timeout: float) -> Topic:
    """The topic at ``path`` opened to write: every partition as one more shared writer,
    with the ``fsync`` strategy of the processes that write it now (the topic's default,
    ``async``, when none does); retried as ``open_writer`` is while a partition is held by
    an exclusive writer (or by shared writers that changed their strategy meanwhile)."""

    def attempt() -> Topic:
        n = topic_meta(path).partitions
        live = (shared_fsync(partition_dir(Path(path), p)) for p in range(n))
        return Topic(path, fsync=next((f for f in live if f is not None), Fsync.ASYNC))

    return retry_locked(attempt, lock_timeout, f"topic {path}: a partition stayed locked",
                        Path(path))


def retry_locked(attempt: Callable[[], T], lock_timeout: float, what: str, path: Path) -> T:
    """``attempt()``, retried with backoff for ``lock_timeout`` seconds while it raises
    ``QueueLockedError``; then that error, saying ``what``."""
    deadline = time.monotonic() + lock_timeout
    delay = 0.01
    while True:
        try:
            return attempt()
        except QueueLockedError:
            if time.monotonic() >= deadline:
                raise QueueLockedError(
                    f"{what} for {lock_timeout} s; nothing was appended", path=path,
                    hint="close the other writer, or raise the lockTimeout option",
                ) from None
            time.sleep(delay)  # another process holds the lock: nothing to wait on here
            delay = min(delay * 2, 0.5)


def remove(files: Iterable[str]) -> None:
    """Delete staged files (those already gone are fine)."""
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(file)


def remove_stage(stage: str) -> None:
    """Delete the staging directory ``stage`` with every file in it (also those that failed
    or replayed tasks left), through a descriptor of it: a link in its place is refused."""
    try:
        fd = open_fd(Path(stage), os.O_RDONLY | os.O_DIRECTORY)
    except StorageError as exc:
        if exc.errno == errno.ENOENT:
            return
        raise
    try:
        for name in os.listdir(fd):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(stage)


# ---------------------------------------------------------------------------- topics


@dataclass(frozen=True)
class K7TopicRows(WriterCommitMessage):
    """What one write task appended to a topic: its row count per partition."""

    rows: dict[int, int]


class TopicSink:
    """Options and the task side of a topic sink: ``write`` appends a task's rows to the
    topic's partitions itself, as one more shared writer of each (at least once: a task
    retried after a failure appends its rows again, as Kafka's sink does)."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise K7OptionError(
                "the k7 sink only appends: use mode('append') (a topic is never overwritten)"
            )
        self.path = queue_path(options, "sink", "save")
        self.columns = topic_columns(schema)
        self.lock_timeout = seconds_option(options, "lockTimeout", 10.0)
        ensure_topic(self.path, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> K7TopicRows:
        """Runs in a task: each row to its partition (the ``partition`` column, else the
        topic's partitioner on the key, else round-robin), then msync."""
        rows: dict[int, int] = {}
        with open_topic_writer(self.path, self.lock_timeout) as topic:
            n = topic.partitions
            spread = KeylessSpreader()
            for batch in iterator:
                payloads: dict[int, list[bytes]] = {}
                for r in topic_rows(batch, self.columns):
                    if r.partition is not None:
                        p = r.partition
                        if not 0 <= p < n:
                            raise K7Error(
                                f"the k7 topic sink got partition {p}; topic {self.path} "
                                f"has partitions 0 .. {n - 1}", path=Path(self.path),
                            )
                    elif r.key is not None:
                        p = topic.partition_for(r.key)
                    else:
                        p = spread.next(n)
                    payloads.setdefault(p, []).append(
                        encode(r.value, r.key, r.headers, r.timestamp)
                    )
                for p, batch_payloads in payloads.items():
                    q = topic.partition(p)
                    q.check_message_size(max(len(b) for b in batch_payloads))
                    q.enqueue_many(batch_payloads)
                    rows[p] = rows.get(p, 0) + len(batch_payloads)
            topic.sync()
        return K7TopicRows(rows)
