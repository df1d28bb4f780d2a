"""Batch-read probe of the k7 Spark source: 1,000,000 messages of 32 bytes, ``local[2]``.

    python benchmarks/spark_probe.py [--messages N] [--runs R]

Prints rows/s of ``count()`` and of a Parquet write per run; the first run includes starting
the JVM side and the Python workers. Needs the ``spark`` extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import k7core


def main() -> None:
    ap = argparse.ArgumentParser(prog="python benchmarks/spark_probe.py")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    from k7core.spark import local_session

    root = tempfile.mkdtemp(prefix="k7-spark-probe-")
    try:
        path, n = os.path.join(root, "q"), args.messages
        with k7core.Queue(path, fsync="flush") as q:
            for i in range(0, n, 10_000):
                q.enqueue_many([b"x" * 32] * min(10_000, n - i))
        spark = local_session("k7-spark-probe")
        try:
            for run in range(args.runs):
                df = spark.read.format("k7").option("minPartitions", "2").load(path)
                t0 = time.perf_counter()
                counted = df.count()
                t1 = time.perf_counter()
                df.write.mode("overwrite").parquet(os.path.join(root, "out.parquet"))
                t2 = time.perf_counter()
                assert counted == n, counted
                print(f"run {run}: count() {n / (t1 - t0):,.0f} rows/s, "
                      f"parquet write {n / (t2 - t1):,.0f} rows/s")
        finally:
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
