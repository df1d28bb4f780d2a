"""The batch writer: all or nothing, appended by the driver-side commit."""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ._sink import Sink, append_staged, open_writer, remove, staged


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
