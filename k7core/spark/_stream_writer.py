"""The streaming writers (PySpark >= 4.2: the Arrow stream writer): to a queue exactly once
per batch id, with a sink record kept in the queue directory; to a topic at least once."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from .. import K7Error, Queue, StorageError
from .._storage import read_file, write_file_atomic
from ._errors import K7OptionError
from ._partitions import BATCH_MESSAGES
from ._sink import (
    STAGING_DIR,
    Sink,
    TopicSink,
    append_staged,
    open_writer,
    remove,
    remove_stage,
    staged,
    staged_batches,
)

log = logging.getLogger("k7core.spark")

SINK_PREFIX = "k7py-sink-"
"""The sink record of a query is the file ``<queue>/k7py-sink-<query id>.json``."""


def query_id(options: dict[str, str]) -> str:
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
        found = str(json.loads(read_file(meta))["id"])
    except (OSError, ValueError, KeyError) as exc:
        raise K7Error(
            f"cannot read the streaming query id from {meta}: {exc}", path=meta,
            hint="the k7 sink needs a checkpoint on a filesystem this process can read",
        ) from None
    if not found.replace("-", "").isalnum():
        raise K7Error(f"unexpected query id {found!r} in {meta}", path=meta)
    return found


class K7StreamWriter(Sink, DataSourceStreamArrowWriter):
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
    before the crash; the rest is appended. With shared writers (``writers="shared"``: the
    sink then joins them) other processes' frames may lie between the sink's, and are
    skipped. (Only if another writer appended, after the crash, frames equal to the next
    staged payloads could this be fooled.) A crash after
    ``done`` but before Spark recorded the batch makes Spark replay it, and step 2 skips it.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.query_id = query_id(options)
        self.stage = os.path.join(self.path, STAGING_DIR, self.query_id)
        self.record = os.path.join(self.path, f"{SINK_PREFIX}{self.query_id}.json")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        files = [m.file for m in staged(messages)]
        with open_writer(self.path, self.lock_timeout) as q:
            rec = self._load()
            if rec is not None and rec["state"] == "appending":
                self._finish(q, rec)
                rec = self._load()
            if rec is not None and batchId <= int(rec["batch"]):
                log.info("%s: batch %d was committed before; skipped", self.path, batchId)
            else:
                start = q.end
                self._save({"batch": batchId, "state": "appending", "start": start,
                            "files": files})
                append_staged(q, files)
                q.sync()
                self._save({"batch": batchId, "state": "done", "start": start, "end": q.end})
        # Batches of one query run one after another: nothing else stages here now.
        remove_stage(self.stage)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        remove(m.file for m in staged(messages))

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
        done = count_appended(q, int(rec["start"]), files)
        log.warning("%s: finishing batch %s interrupted after %d messages",
                    self.path, rec["batch"], done)
        append_staged(q, files, skip=done)
        q.sync()
        self._save({"batch": rec["batch"], "state": "done", "start": rec["start"],
                    "end": q.end})

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


def count_appended(q: Queue, start: int, files: list[str]) -> int:
    """How many of the staged payloads (in order) are in the queue from ``start``: the
    frames right after ``start``, or with shared writers (whose frames may come between the
    sink's appends) the frames in order with others' between them."""
    shared = q.writers == "shared"
    matched = 0
    batch, i = q.read_columnar(start, BATCH_MESSAGES), 0
    for file in files:
        for rows in staged_batches(file):
            for value in rows.column(0).to_pylist():
                while True:
                    if i == len(batch):
                        if not len(batch):
                            return matched
                        batch, i = q.read_columnar(batch.next, BATCH_MESSAGES), 0
                        if not len(batch):
                            return matched
                    same = bytes(batch.payload(i)) == value
                    i += 1
                    if same:
                        break
                    if not shared:
                        return matched
                matched += 1
    return matched


class K7TopicStreamWriter(TopicSink, DataSourceStreamArrowWriter):
    """Appends each micro-batch to a topic, as the batch topic writer does: the tasks write
    their rows to the partitions. At least once, as Kafka's sink: a batch that Spark replays
    after a failure is appended again."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
