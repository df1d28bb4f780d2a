"""A two-stage Spark Structured Streaming pipeline over k7 queues.

    python examples/spark_pipeline.py [--events N] [DIR]

A producer thread fills the queue ``events`` with N small JSON events (default 1,000,000)
while stage 1 streams it (``format("k7")``), parses the JSON and writes Parquet. Stage 2
streams that Parquet output, keeps the large amounts and writes them, as JSON, into a second
queue ``alerts`` (the exactly-once k7 sink). At the end a batch query aggregates the Parquet
per kind; the script checks every count against what the producer wrote. Uses a fresh
temporary directory unless DIR is given. Needs the ``spark`` extra.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import k7core

KINDS = ("click", "view", "buy", "share", "like")
ALERT_AMOUNT = 990  # events with amount >= this become alerts


def event(i: int) -> dict[str, Any]:
    return {"id": i, "kind": KINDS[i % len(KINDS)], "amount": (i * 7) % 1000}


def produce(path: Path, n: int, done: threading.Event) -> None:
    """The producer: one writer, batches of 10,000 events."""
    try:
        with k7core.Queue(path, fsync="flush") as q:
            for lo in range(0, n, 10_000):
                q.enqueue_many(
                    [json.dumps(event(i)).encode() for i in range(lo, min(n, lo + 10_000))]
                )
    finally:
        done.set()


def read_offset(progress: dict[str, Any] | None) -> int:
    """The queue offset a query's last micro-batch read up to (0 before the first)."""
    if not progress or not progress["sources"]:
        return 0
    end = progress["sources"][0]["endOffset"]
    return int((json.loads(end) if isinstance(end, str) else end)["offset"])


def main() -> None:
    ap = argparse.ArgumentParser(prog="python examples/spark_pipeline.py")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("dir", nargs="?", type=Path)
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="k7-spark-pipeline-"))
    n = args.events
    from pyspark.sql import functions as F

    from k7core.spark import local_session

    print(f"pipeline directory: {root}")
    spark = local_session("k7-pipeline")
    events, parquet, alerts = root / "events", root / "parquet", root / "alerts"
    k7core.Queue(events, fsync="flush").close()  # exists before the query plans

    done = threading.Event()
    producer = threading.Thread(target=produce, args=(events, n, done), daemon=True)
    started = time.monotonic()
    producer.start()

    schema = "id BIGINT, kind STRING, amount BIGINT"
    stage1 = (
        spark.readStream.format("k7").option("includeValue", "true")
        .option("maxRecordsPerTrigger", "250000").load(str(events))
        .select(F.from_json("value", schema).alias("e"), "offset").select("e.*", "offset")
        .writeStream.format("parquet").option("checkpointLocation", str(root / "ck1"))
        .trigger(processingTime="1 second").start(str(parquet))
    )
    stage2 = (
        spark.readStream.schema(f"{schema}, offset BIGINT").parquet(str(parquet))
        .where(F.col("amount") >= ALERT_AMOUNT)
        .select(F.to_json(F.struct("id", "kind", "amount")).alias("value"))
        .writeStream.format("k7").option("checkpointLocation", str(root / "ck2"))
        .trigger(processingTime="1 second").start(str(alerts))
    )
    try:
        while True:  # progress until stage 1 has read everything the producer wrote
            produced = done.is_set()
            with k7core.Queue(events, readonly=True) as q:
                end = q.end
            reached = read_offset(stage1.lastProgress)
            print(f"  {time.monotonic() - started:5.1f} s  queue end {end:>11,}  "
                  f"stage 1 at {reached:>11,}  {'(producer done)' if produced else ''}")
            if produced and reached >= end:
                break
            time.sleep(2.0)
        producer.join()
        stage1.processAllAvailable()
        stage2.processAllAvailable()
    finally:
        stage1.stop()
        stage2.stop()
    print(f"both stages caught up after {time.monotonic() - started:.1f} s")

    per_kind = {
        r.kind: (r.n, r.total)
        for r in spark.read.parquet(str(parquet)).groupBy("kind")
        .agg(F.count("*").alias("n"), F.sum("amount").alias("total")).collect()
    }
    expected: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    for i in range(n):
        e = event(i)
        expected[e["kind"]][0] += 1
        expected[e["kind"]][1] += e["amount"]
    for kind in KINDS:
        print(f"  {kind:6} {per_kind[kind][0]:>9,} events, amount {per_kind[kind][1]:>12,}")
        assert per_kind[kind] == tuple(expected[kind]), (kind, per_kind[kind], expected[kind])
    distinct = spark.read.parquet(str(parquet)).select("id").distinct().count()
    assert distinct == n, (distinct, n)

    with k7core.Queue(alerts, readonly=True) as q:
        got: list[int] = []
        pos = 0
        while len(batch := q.read_columnar(pos)):
            got.extend(json.loads(bytes(batch.payload(i)))["id"] for i in range(len(batch)))
            pos = batch.next
    want = [i for i in range(n) if event(i)["amount"] >= ALERT_AMOUNT]
    counts = Counter(got)
    assert sorted(counts) == want and max(counts.values(), default=1) == 1, "alerts differ"
    print(f"alerts queue: {len(got):,} messages, each large event exactly once")
    print(f"OK: {n:,} events through both stages")
    spark.stop()


if __name__ == "__main__":
    main()
