"""Streaming queries run in a child process that a test SIGKILLs mid-batch.

``python _stream_child.py SOURCE CHECKPOINTS PARQUET_OUT K7_OUT``: two queries read the k7
queue SOURCE (``maxRecordsPerTrigger`` 200, a trigger every 0.5 s), one into a Parquet
directory, one into another k7 queue, checkpointing under CHECKPOINTS/parquet and
CHECKPOINTS/k7, until killed. The Spark conftest starts it before the test session's own
SparkSession (:class:`StreamChild`), so that its JVM starts while other tests run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_RECORDS = "200"
MESSAGES = 100_000  # far more than the child gets through before the test kills it


def start(
    spark: Any, source: str, checkpoint: str, sink: str, target: str,
    max_records: str | None = MAX_RECORDS, trigger: str | None = None,
) -> Any:
    """Start a query from the k7 queue ``source`` into ``sink`` (``parquet`` or ``k7``)."""
    reader = spark.readStream.format("k7")
    if max_records is not None:
        reader = reader.option("maxRecordsPerTrigger", max_records)
    writer = (
        reader.load(source).select("payload").writeStream.format(sink)
        .option("checkpointLocation", checkpoint)
    )
    if trigger is not None:
        writer = writer.trigger(processingTime=trigger)
    return writer.start(target)


@dataclass
class StreamChild:
    """The child process and its files: the source queue, the checkpoints, both outputs."""

    source: Path
    checkpoints: Path
    parquet: Path
    target: Path
    log: Path
    payloads: list[bytes]
    process: subprocess.Popen[bytes]

    @classmethod
    def launch(cls, root: Path) -> StreamChild:
        import k7core

        payloads = [b"e%06d" % i for i in range(MESSAGES)]
        source = root / "src"
        with k7core.Queue(source, fsync="flush") as q:
            q.enqueue_many(payloads)
        paths = [source, root / "ck", root / "parquet", root / "target"]
        log = root / "child.log"
        with open(log, "wb") as err:
            process = subprocess.Popen(
                [sys.executable, __file__, *map(str, paths)],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err,
            )
        return cls(paths[0], paths[1], paths[2], paths[3], log, payloads, process)


def main(source: str, checkpoints: str, parquet_out: str, k7_out: str) -> None:
    from k7core.spark import local_session

    spark = local_session("k7core-stream-child")
    start(spark, source, os.path.join(checkpoints, "parquet"), "parquet", parquet_out,
          trigger="0.5 seconds")
    start(spark, source, os.path.join(checkpoints, "k7"), "k7", k7_out, trigger="0.5 seconds")
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
