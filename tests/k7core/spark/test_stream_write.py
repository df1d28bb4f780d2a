"""Streaming writes, and streaming queries killed mid-batch then restarted."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

import k7core
from k7core.spark import SINK_PREFIX, STAGING_DIR, K7StagedRows, K7StreamWriter
from tests._queuehelp import read_all as read_queue
from tests.k7core.spark._stream_child import StreamChild, start

pytestmark = pytest.mark.spark

def read_all(path: Path) -> list[bytes]:
    with k7core.Queue(path, readonly=True) as q:
        return read_queue(q)


def batches(checkpoint: Path, log: str) -> int:
    """How many micro-batches the checkpoint's offsets/ or commits/ log holds."""
    try:
        return sum(1 for f in os.listdir(checkpoint / log) if f.isdigit())
    except FileNotFoundError:
        return 0


def mid_batch(checkpoint: Path) -> bool:
    """At least one batch done, and the next one planned but not committed."""
    done = batches(checkpoint, "commits")
    return done >= 1 and batches(checkpoint, "offsets") > done


def test_killed_mid_batch_restarts_exactly_once_into_parquet_and_k7(
    spark: Any, stream_child: StreamChild
) -> None:
    child, ck = stream_child, stream_child.checkpoints
    try:
        deadline = time.monotonic() + 180
        while not (mid_batch(ck / "parquet") and mid_batch(ck / "k7")):
            if child.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the child query never got mid-batch: {child.log.read_text()[-2000:]}")
            time.sleep(0.01)  # polling files another process writes; no event to wait on
    finally:
        os.killpg(child.process.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
        child.process.wait()
    assert len(read_all(child.target)) < len(child.payloads)  # killed before the end

    # both at once; no read limit now: the replayed batch keeps its range, the rest is one batch
    queries = [
        start(spark, str(child.source), str(ck / sink), sink, str(target), None)
        for sink, target in (("parquet", child.parquet), ("k7", child.target))
    ]
    try:
        for query in queries:
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    rows = spark.read.parquet(str(child.parquet)).collect()
    assert Counter(bytes(r.payload) for r in rows) == Counter(child.payloads)
    assert Counter(read_all(child.target)) == Counter(child.payloads)
    staging = child.target / STAGING_DIR
    assert not staging.exists() or not any(staging.iterdir())


def test_stream_write_value_column_and_replayed_batch(spark: Any, tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "target"
    with k7core.Queue(source, fsync="flush") as q:
        q.enqueue_many([b"v%d" % i for i in range(300)])
    query = (
        spark.readStream.format("k7").option("includeValue", "true")
        .option("maxRecordsPerTrigger", "100").load(str(source)).select("value")
        .writeStream.format("k7").option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start(str(target))
    )
    query.awaitTermination()
    assert read_all(target) == [b"v%d" % i for i in range(300)]
    record = json.loads(next(target.glob(f"{SINK_PREFIX}*.json")).read_text())
    assert record["batch"] == 2 and record["state"] == "done"
    # a checkpoint root from the session conf does not reach the sink: a clear error
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "root"))
    try:
        with pytest.raises(Exception, match="bookkeeping is keyed by the query id"):
            spark.readStream.format("k7").load(str(source)).select("payload").writeStream.format(
                "k7"
            ).start(str(target)).processAllAvailable()
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")


# ------------------------------------------------- the sink's recovery, driven directly


QUERY_ID = "0b7bbb37-f2de-4b56-a551-e4292151ead9"


def writer(tmp_path: Path, target: Path) -> K7StreamWriter:
    """A fresh writer per micro-batch, as Spark makes them (commit runs on a new one)."""
    ck = tmp_path / "ck"
    ck.mkdir(exist_ok=True)
    (ck / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    schema = StructType([StructField("payload", BinaryType())])
    return K7StreamWriter({"path": str(target), "checkpointlocation": str(ck)}, schema, False)


def stage(w: K7StreamWriter, payloads: list[bytes]) -> K7StagedRows:
    batch = pa.record_batch([pa.array(payloads, pa.binary())], names=["payload"])
    return w.write(iter([batch]))


def test_replayed_batch_is_skipped_and_interrupted_commit_is_finished(tmp_path: Path) -> None:
    target = tmp_path / "target"
    b0 = [b"zero-%d" % i for i in range(5)]
    writer(tmp_path, target).commit([stage(writer(tmp_path, target), b0)], 0)
    # a crash after the commit but before Spark recorded it: the batch is replayed
    writer(tmp_path, target).commit([stage(writer(tmp_path, target), b0)], 0)
    assert read_all(target) == b0

    # batch 1 was killed after 13 of its 20 messages were appended: its record says
    # "appending", its staged files are still there
    b1 = [b"one-%d" % i for i in range(20)]
    w = writer(tmp_path, target)
    files = [stage(w, b1[:10]).file, stage(w, b1[10:]).file]
    with k7core.Queue(target, fsync="flush") as q:
        start_offset = q.end
        q.enqueue_many(b1[:13])
    record = target / f"{SINK_PREFIX}{QUERY_ID}.json"
    record.write_text(json.dumps(
        {"batch": 1, "state": "appending", "start": start_offset, "files": files}
    ))
    # Spark replays batch 1 (new staged files, same rows), then runs batch 2
    w = writer(tmp_path, target)
    w.commit([stage(w, b1[10:]), stage(w, b1[:10])], 1)
    b2 = [b"two"]
    w = writer(tmp_path, target)
    w.commit([stage(w, b2)], 2)
    assert read_all(target) == b0 + b1 + b2
    assert json.loads(record.read_text())["batch"] == 2
    assert not (target / STAGING_DIR / QUERY_ID).exists()

    # interrupted before anything was appended, and its files are gone: a clear error
    record.write_text(json.dumps(
        {"batch": 3, "state": "appending", "start": 0, "files": [str(tmp_path / "gone")]}
    ))
    with pytest.raises(k7core.K7Error, match="interrupted while being appended"):
        writer(tmp_path, target).commit([], 3)


def test_interrupted_commit_is_finished_beside_shared_writers(tmp_path: Path) -> None:
    """A shared writer holds the queue open: the sink joins it, and finishing an interrupted
    commit skips the other writer's frames between the sink's own."""
    target = tmp_path / "target"
    b1 = [b"one-%d" % i for i in range(20)]
    w = writer(tmp_path, target)
    files = [stage(w, b1[:10]).file, stage(w, b1[10:]).file]
    with k7core.Queue(target, writers="shared", fsync="flush") as other:
        other.enqueue(b"before")
        start_offset = other.end
        # the sink appended 13 of batch 1's 20 messages in three calls, with the other
        # writer's between them, then was killed
        with k7core.Queue(target, writers="shared", fsync="flush") as sink:
            sink.enqueue_many(b1[:6])
            other.enqueue_many([b"x1", b"x2"])
            sink.enqueue_many(b1[6:13])
            other.enqueue(b"x3")
        record = target / f"{SINK_PREFIX}{QUERY_ID}.json"
        record.write_text(json.dumps(
            {"batch": 1, "state": "appending", "start": start_offset, "files": files}
        ))
        w = writer(tmp_path, target)
        w.commit([stage(w, b1)], 1)  # the replay of batch 1: finished, not appended again
        w = writer(tmp_path, target)
        w.commit([stage(w, [b"two"])], 2)
        other.enqueue(b"after")
    assert read_all(target) == [
        b"before", *b1[:6], b"x1", b"x2", *b1[6:13], b"x3", *b1[13:], b"two", b"after"
    ]
    assert json.loads(record.read_text())["state"] == "done"
