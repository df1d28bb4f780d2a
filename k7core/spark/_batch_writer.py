"""The batch writers: to a queue all or nothing, appended by the driver-side commit; to a
topic by the tasks, at least once."""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ._sink import K7TopicRows, Sink, TopicSink, append_staged, open_writer, remove, staged

log = logging.getLogger("k7core.spark")


class K7BatchWriter(Sink, DataSourceArrowWriter):
    """All-or-nothing append: tasks stage their rows next to the queue; the driver-side
    ``commit`` appends every staged file under the queue's writer lock and msyncs once;
    ``abort`` deletes the staged files and leaves the queue untouched."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [m.file for m in staged(messages)]
        try:
            with open_writer(self.path, self.lock_timeout) as q:
                append_staged(q, files)
                q.sync()
        finally:
            remove(files)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        remove(m.file for m in staged(messages))


class K7TopicBatchWriter(TopicSink, DataSourceArrowWriter):
    """Appends to a topic: each task writes its rows to the partitions (shared writers) and
    msyncs; nothing is left for ``commit``. At least once, as Kafka's sink: the rows of
    tasks that finished stay when the job fails, and a retried task writes its rows again."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(sum(m.rows.values()) for m in messages if isinstance(m, K7TopicRows))
        if done:
            log.warning("%s: the job failed; %d rows its finished tasks appended stay in the "
                        "topic", self.path, done)
