"""Streaming reads through a real local SparkSession."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import k7core
from k7core._format import encode_cursor
from k7core.spark import K7DataSource

pytestmark = pytest.mark.spark


def fill(path: Path, payloads: list[bytes], segment_size: int = 1 << 20) -> list[int]:
    with k7core.Queue(path, fsync="flush", segment_size=segment_size) as q:
        return q.enqueue_many(payloads)


def committed(path: Path, group: str) -> int:
    with k7core.Queue(path, readonly=True) as q, q.consumer_group(group) as cg:
        return cg.committed


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def available_now(
    spark: Any, path: Path, tmp_path: Path, **options: str
) -> tuple[list[int], list[int]]:
    """Run an availableNow query into a memory table: (offsets read, rows per batch)."""
    name = f"k7_{uuid.uuid4().hex}"
    reader = spark.readStream.format("k7")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(str(path)).writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(availableNow=True).start()
    )
    try:
        query.awaitTermination()
        rows = spark.table(name).orderBy("offset").collect()
        return [r.offset for r in rows], batch_sizes(query)
    finally:
        query.stop()


def test_limits_group_cursor_and_restart_without_loss_or_duplicates(
    spark: Any, tmp_path: Path
) -> None:
    path, out, ck = tmp_path / "q", tmp_path / "out", tmp_path / "ck"
    first = [b"a%04d" % i for i in range(1000)]
    offs = fill(path, first)

    def run() -> list[int]:
        query = (
            spark.readStream.format("k7").option("maxRecordsPerTrigger", "300")
            .option("group", "g").load(str(path))
            .writeStream.format("parquet").option("checkpointLocation", str(ck)).start(str(out))
        )
        try:
            query.processAllAvailable()
            return batch_sizes(query)
        finally:
            query.stop()

    assert run() == [300, 300, 300, 100]
    # commit(end) comes while the next batch is planned: the last batch is not committed yet
    assert committed(path, "g") == offs[900]
    second = [b"b%04d" % i for i in range(500)]
    more = fill(path, second)
    assert run() == [300, 200]  # resumes at the checkpoint, not at the group cursor
    rows = spark.read.parquet(str(out)).orderBy("offset").collect()
    assert [r.offset for r in rows] == offs + more
    assert [bytes(r.payload) for r in rows] == first + second
    assert committed(path, "g") == more[300]


def test_starting_offsets_available_now_and_byte_limit(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    offs = fill(path, [b"x" * 100] * 50)
    frame = offs[1] - offs[0]
    got, sizes = available_now(
        spark, path, tmp_path, startingOffsets=str(offs[10]), maxBytesPerTrigger=str(7 * frame)
    )
    assert got == offs[10:]
    assert sizes == [7, 7, 7, 7, 7, 5]
    got, sizes = available_now(spark, path, tmp_path, maxRecordsPerTrigger="20")
    assert got == offs
    assert sizes == [20, 20, 10]
    assert available_now(spark, path, tmp_path, startingOffsets="latest") == ([], [])
    with k7core.Queue(path, readonly=True) as q, q.consumer_group("g") as cg:
        cg.seek(offs[30])
    got, _ = available_now(spark, path, tmp_path, group="g", startingOffsets="latest")
    assert got == offs[30:]  # a new query starts at an existing group's cursor


def test_fail_on_data_loss_both_ways(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    offs = fill(path, [b"y" * 100] * 200, segment_size=4096)
    bases = sorted(int(p.name[4:24]) for p in path.glob("seg-*.k7"))
    assert len(bases) > 3
    (path / f"seg-{bases[0]:020d}.k7").unlink()  # the oldest sealed segment: data loss
    with pytest.raises(Exception, match="K7DataLossError") as info:
        available_now(spark, path, tmp_path, startingOffsets="0")
    assert "failOnDataLoss=false" in str(info.value)
    got, _ = available_now(spark, path, tmp_path, startingOffsets="0", failOnDataLoss="false")
    assert got == [o for o in offs if o >= bases[1]]
    with k7core.Queue(path, readonly=True) as q, q.consumer_group("g"):
        end = q.end
    with open(path / "cursor-g.k7", "r+b") as f:  # a damaged cursor: past the end
        f.write(encode_cursor(end + 4096))
    with pytest.raises(Exception, match=r"CursorError.*beyond the end of the log"):
        available_now(spark, path, tmp_path, group="g")


def test_bad_stream_options_are_clear(spark: Any, tmp_path: Path) -> None:
    fill(tmp_path / "q", [b"a"])
    with pytest.raises(Exception, match="maxRecordsPerTrigger must be >= 1"):
        available_now(spark, tmp_path / "q", tmp_path, maxRecordsPerTrigger="0")
    assert K7DataSource.name() == "k7"
