"""Streaming throughput of the k7 Spark source and sink: 1,000,000 messages of 32 bytes.

    python examples/spark_stream_throughput.py [--messages N] [--runs R]

Each run is one ``Trigger.AvailableNow`` query with a fresh checkpoint, ``local[2]``,
``minPartitions=2``: the queue into Spark's ``noop`` sink (the source alone), then the queue
into another k7 queue (source and exactly-once sink). Prints rows/s per run; the first run
includes starting the Python workers. Needs the ``spark`` extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import k7core


def run_query(spark: Any, source: str, sink: str, checkpoint: str, target: str | None) -> float:
    """Seconds for one availableNow query from the queue ``source`` into ``sink``."""
    writer = (
        spark.readStream.format("k7").option("minPartitions", "2").load(source)
        .select("payload").writeStream.format(sink)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    query = writer.start(target) if target else writer.start()
    query.awaitTermination()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(prog="python examples/spark_stream_throughput.py")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from k7core.spark import local_session

    root = tempfile.mkdtemp(prefix="k7-spark-stream-")
    try:
        source, n = os.path.join(root, "q"), args.messages
        with k7core.Queue(source, fsync="flush") as q:
            for i in range(0, n, 10_000):
                q.enqueue_many([b"x" * 32] * min(10_000, n - i))
        spark = local_session("k7-stream-throughput")
        try:
            for run in range(args.runs):
                ck = os.path.join(root, f"ck{run}")
                read_s = run_query(spark, source, "noop", ck + "-noop", None)
                target = os.path.join(root, f"out{run}")
                copy_s = run_query(spark, source, "k7", ck + "-k7", target)
                with k7core.Queue(target, readonly=True) as out, k7core.Queue(
                    source, readonly=True
                ) as src:
                    assert out.end == src.end, (out.end, src.end)  # same frames, same sizes
                print(f"run {run}: stream read (noop sink) {n / read_s:,.0f} rows/s, "
                      f"stream read + k7 sink {n / copy_s:,.0f} rows/s")
        finally:
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
