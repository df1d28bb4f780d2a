"""Streaming queries run in a child process that the tests SIGKILL mid-batch.

``python _stream_child.py SOURCE CHECKPOINTS PARQUET_OUT K7_OUT``: two queries read the k7
queue SOURCE (``maxRecordsPerTrigger`` 200), one into a Parquet directory, one into another
k7 queue, checkpointing under CHECKPOINTS/parquet and CHECKPOINTS/k7, until killed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

MAX_RECORDS = "200"


def start(
    spark: Any, source: str, checkpoint: str, sink: str, target: str,
    max_records: str | None = MAX_RECORDS,
) -> Any:
    """Start a query from the k7 queue ``source`` into ``sink`` (``parquet`` or ``k7``)."""
    reader = spark.readStream.format("k7")
    if max_records is not None:
        reader = reader.option("maxRecordsPerTrigger", max_records)
    df = reader.load(source)
    return (
        df.select("payload").writeStream.format(sink)
        .option("checkpointLocation", checkpoint)
        .start(target)
    )


def main(source: str, checkpoints: str, parquet_out: str, k7_out: str) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from k7core.spark import K7DataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("k7core-stream-child")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(K7DataSource)
    start(spark, source, os.path.join(checkpoints, "parquet"), "parquet", parquet_out)
    start(spark, source, os.path.join(checkpoints, "k7"), "k7", k7_out)
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
