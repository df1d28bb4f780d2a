"""Batch reads through a real local SparkSession."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import k7core

pytestmark = pytest.mark.spark


def fill(path: Path, payloads: list[bytes], segment_size: int = 1 << 20) -> list[int]:
    with k7core.Queue(path, fsync="flush", segment_size=segment_size) as q:
        return q.enqueue_many(payloads)


def test_registered_name_and_default_schema(spark: Any, tmp_path: Path) -> None:
    fill(tmp_path / "q", [b"a"])
    df = spark.read.format("k7").load(str(tmp_path / "q"))
    assert df.schema.simpleString() == "struct<offset:bigint,payload:binary>"


def test_reads_everything_in_order_across_segments(spark: Any, tmp_path: Path) -> None:
    payloads = [b"m%05d" % i + b"x" * (i % 50) for i in range(5000)]
    offsets = fill(tmp_path / "q", payloads, segment_size=64 << 10)  # many segments
    df = spark.read.format("k7").load(str(tmp_path / "q"))
    assert df.rdd.getNumPartitions() > 2  # one per segment
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == offsets
    assert [bytes(r.payload) for r in rows] == payloads


def test_offset_range_group_and_value_column(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    payloads = [f"é{i}" for i in range(100)]
    offsets = fill(path, [p.encode() for p in payloads])
    with k7core.Queue(path, readonly=True) as q, q.consumer_group("g") as cg:
        for m in cg.poll(30, 0):
            cg.ack(m)
    df = (
        spark.read.format("k7")
        .option("startingOffsets", str(offsets[10]))
        .option("endingOffsets", str(offsets[20]))
        .option("includeValue", "true")
        .load(str(path))
    )
    assert [r.value for r in df.orderBy("offset").collect()] == payloads[10:20]
    by_group = spark.read.format("k7").option("group", "g").load(str(path))
    assert by_group.count() == 70
    assert by_group.agg({"offset": "min"}).collect()[0][0] == offsets[30]


def test_min_partitions_splits_one_segment_and_range_is_fixed(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "q"
    fill(path, [b"%d" % i for i in range(10_000)])
    df = spark.read.format("k7").option("minPartitions", "4").load(str(path))
    assert df.rdd.getNumPartitions() >= 4
    assert df.count() == 10_000
    fill(path, [b"later"] * 10)  # planned once: the same DataFrame reads the same range
    assert df.count() == 10_000
    assert spark.read.format("k7").load(str(path)).count() == 10_010
    assert df.select("offset").distinct().count() == 10_000


def test_bad_options_are_clear(spark: Any, tmp_path: Path) -> None:
    fill(tmp_path / "q", [b"a"])
    with pytest.raises(Exception, match="startingOffsets"):
        spark.read.format("k7").option("startingOffsets", "soon").load(str(tmp_path / "q")).count()
    with pytest.raises(Exception, match="not a queue directory"):
        spark.read.format("k7").load(str(tmp_path / "missing")).count()
