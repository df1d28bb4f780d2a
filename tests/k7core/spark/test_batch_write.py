"""Batch writes through a real local SparkSession: all-or-nothing appends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import k7core
from k7core.spark import STAGING_DIR
from tests._childproc import Child
from tests._queuehelp import read_all as read_queue
from tests.k7core._shared_children import parse_payload

SHARED_CHILDREN = "tests.k7core._shared_children"

pytestmark = pytest.mark.spark


def read_all(path: Path) -> list[bytes]:
    with k7core.Queue(path, readonly=True) as q:
        return read_queue(q)


def staged(path: Path) -> list[Path]:
    return list((path / STAGING_DIR).glob("*")) if (path / STAGING_DIR).exists() else []


def test_append_payload_and_value_columns(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    with k7core.Queue(path) as q:
        q.enqueue(b"already there")
    rows = [(b"p%d" % i,) for i in range(1000)]
    spark.createDataFrame(rows, "payload BINARY").repartition(3).write.format("k7").mode(
        "append"
    ).save(str(path))
    spark.createDataFrame([("é",), ("",)], "value STRING").write.format("k7").mode(
        "append"
    ).save(str(path))
    got = read_all(path)
    assert got[0] == b"already there"
    assert sorted(got[1:1001]) == sorted(r[0] for r in rows)
    assert sorted(got[1001:]) == sorted(["é".encode(), b""])
    assert staged(path) == []


def test_failed_job_leaves_the_queue_untouched(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.functions import udf

    path = tmp_path / "q"
    with k7core.Queue(path) as q:
        q.enqueue(b"before")

    @udf("binary", useArrow=False)
    def explode_on_77(x: int) -> bytes:
        if x == 77:
            raise RuntimeError("task failure on purpose")
        return b"%d" % x

    df = spark.range(200).repartition(4).select(explode_on_77("id").alias("payload"))
    with pytest.raises(Exception, match="task failure on purpose"):
        df.write.format("k7").mode("append").save(str(path))
    assert read_all(path) == [b"before"]
    assert staged(path) == []


def test_clear_errors(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    df = spark.createDataFrame([(1,)], "n INT")
    with pytest.raises(Exception, match="'payload' BINARY or a 'value' STRING"):
        df.write.format("k7").mode("append").save(str(path))
    ok = spark.createDataFrame([(b"x",)], "payload BINARY")
    with pytest.raises(Exception, match="only appends"):
        ok.write.format("k7").mode("overwrite").save(str(path))
    # this process holds the writer lock while Spark's commit waits for it
    with k7core.Queue(path), pytest.raises(Exception, match="stayed locked by another writer"):
        ok.write.format("k7").mode("append").option("lockTimeout", "0.3").save(str(path))
    assert read_all(path) == []
    assert staged(path) == []


def test_append_beside_shared_writer_processes(spark: Any, tmp_path: Path) -> None:
    """With processes writing the queue with writers="shared", the commit joins them (with
    their fsync) instead of waiting for the writer lock; nothing of anyone's is lost."""
    path = tmp_path / "q"
    count = 30_000
    with k7core.Queue(path, writers="shared", fsync="sync") as here, \
            Child("write", str(path), "sync", str(1 << 20), "1", "5", str(count),
                  program=SHARED_CHILDREN) as child:
        assert child.line() == b"ready"
        lines: list[bytes] = []
        drain = threading.Thread(target=lambda: lines.extend(child.lines_until_exit()))
        drain.start()
        here.enqueue(b"from the test")
        rows = [(b"spark-%d" % i,) for i in range(2000)]
        spark.createDataFrame(rows, "payload BINARY").repartition(3).write.format("k7").option(
            "lockTimeout", "1").mode("append").save(str(path))
        here.enqueue(b"after spark")
        drain.join()
    assert lines[-1] == b"done", child.stderr()
    got = read_all(path)
    spark_rows = [m for m in got if m.startswith(b"spark-")]
    assert sorted(spark_rows) == sorted(r[0] for r in rows)
    mine = [parse_payload(m) for m in got if m.startswith(b"w")]
    assert mine == [(1, seq) for seq in range(count)]
    assert got.index(b"from the test") < got.index(b"after spark")
    assert len(got) == len(rows) + count + 2
    assert staged(path) == []
