"""Topics through the k7 data source: Kafka's source schema, per-partition offsets as JSON,
streaming with a checkpoint, and writes that place keys with the topic's partitioner."""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StructType

import k7core
from k7core.spark import K7OptionError, K7TopicBatchReader, K7TopicStreamReader
from k7core.topics import ProducerRecord, Record, Topic

pytestmark = pytest.mark.spark

SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
)
T0 = 1_700_000_000_000


def records(path: Path) -> dict[int, list[Record]]:
    """Every record of the topic at ``path``, per partition, in order."""
    with Topic(path, readonly=True) as t:
        return {p: t.read(p, 0, 100_000) for p in range(t.partitions)}


def by_partition(rows: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
        out.setdefault(r.partition, []).append(r)
    return out


def utc(ms: int) -> datetime.datetime:
    """A record timestamp as Spark returns it (the session is in UTC)."""
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ms)


def as_row(r: Record, topic: str) -> tuple[Any, ...]:
    return (r.key, r.value, topic, r.partition, r.offset, utc(r.timestamp), 0,
            [(k, v) for k, v in r.headers])


def row_tuple(r: Any) -> tuple[Any, ...]:
    return (r.key, r.value, r.topic, r.partition, r.offset, r.timestamp, r.timestampType,
            [(h.key, h.value) for h in r.headers])


def fill(path: Path, n: int, partitions: int = 3, start: int = 0) -> None:
    """Records with keys (one empty), without, with headers (a name twice), timestamps."""
    with Topic(path, partitions=partitions) as t:
        for i in range(start, start + n):
            key = None if i % 4 == 0 else (b"" if i == 1 else f"key-{i % 7}")
            headers = [("trace", b"t%d" % i), ("trace", b"again")] if i % 3 == 0 else None
            t.send(b"value-%d" % i, key=key, headers=headers, timestamp=T0 + i)


def test_batch_read_has_kafkas_columns_and_each_partition_in_order(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "orders"
    fill(path, 60)
    df = spark.read.format("k7").load(str(path))
    assert df.schema.simpleString() == SCHEMA
    assert df.rdd.getNumPartitions() >= 3  # at least one per topic partition
    got = by_partition(df.collect())
    sent = records(path)
    assert all(sent[p] for p in range(3))
    for p in range(3):
        assert [row_tuple(r) for r in got.get(p, [])] == [as_row(r, "orders") for r in sent[p]]
    rows = [r for rs in got.values() for r in rs]
    assert sum(r.key is None for r in rows) == 15 and sum(r.key == b"" for r in rows) == 1
    assert spark.read.format("k7").option("minPartitions", "6").load(
        str(path)).rdd.getNumPartitions() >= 6


def test_offsets_as_json_per_partition_and_a_groups_cursors(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    fill(path, 40, partitions=2)
    sent = records(path)
    o0, o1 = [r.offset for r in sent[0]], [r.offset for r in sent[1]]

    def read(**options: str) -> dict[int, list[int]]:
        reader = spark.read.format("k7")
        for key, value in options.items():
            reader = reader.option(key, value)
        got = by_partition(reader.load(str(path)).collect())
        return {p: [r.offset for r in got.get(p, [])] for p in range(2)}

    assert read(startingOffsets=json.dumps({"t": {"0": o0[2], "1": -2}}),
                endingOffsets=json.dumps({"t": {"0": -1, "1": o1[3]}})) == {0: o0[2:], 1: o1[:3]}
    # a partition left out takes the default: earliest to start, latest to end
    assert read(endingOffsets=json.dumps({"t": {"1": o1[1]}})) == {0: o0, 1: o1[:1]}
    assert read(startingOffsets="latest") == {0: [], 1: []}
    assert read(startingOffsets=json.dumps({"t": {"0": -1}})) == {0: [], 1: o1}
    with k7core.Queue(path / "partition-0", readonly=True) as q, q.consumer_group("g") as g:
        g.seek(o0[5])  # the group's cursor in partition 0; none in partition 1
    assert read(group="g") == {0: o0[5:], 1: o1}
    assert read(group="g", startingOffsets="latest") == {0: o0[5:], 1: []}
    with pytest.raises(Exception, match="there is no partition '7'"):
        read(startingOffsets=json.dumps({"t": {"7": 0}}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "{not json"}, r"must be 'earliest', 'latest' or JSON such as "
         r"\{\"t\": \{\"0\": 23, \"1\": -2\}\}"),
        ({"startingOffsets": '{"t": [1, 2]}'}, "JSON object of topics"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "names topic 'other'; this topic is 't'"),
        ({"startingOffsets": '{"t": {"2": 0}}'},
         r"has partitions 0 \.\. 1; there is no partition '2'"),
        ({"startingOffsets": '{"t": {"x": 0}}'}, "there is no partition 'x'"),
        ({"startingOffsets": '{"t": {"0": -3}}'}, r"must be >= 0, or -2 \(earliest\), -1"),
        ({"startingOffsets": '{"t": {"0": "5"}}'}, "must be >= 0"),
        ({"endingOffsets": '{"t": {"0": -2}}'}, r"must be >= 0, or -1 \(latest\); not -2"),
        ({"endingOffsets": "earliest"}, "endingOffsets cannot be 'earliest'"),
        ({"includeValue": "true"}, "includeValue is for queues"),
        ({"minPartitions": "0"}, "minPartitions must be >= 1"),
    ],
)
def test_bad_topic_options_are_clear(tmp_path: Path, options: dict[str, str],
                                     message: str) -> None:
    fill(tmp_path / "t", 4, partitions=2)
    with pytest.raises(K7OptionError, match=message):
        K7TopicBatchReader({"path": str(tmp_path / "t"), **{k.lower(): v for k, v in
                                                             options.items()}}, StructType())


def test_stream_reader_offsets_group_cursors_and_limits(tmp_path: Path) -> None:
    """Driven directly (no session): the checkpoint's offsets are per-partition JSON, a
    group's cursors are where a new query starts and follow its commits, and a read limit
    is shared between the partitions."""
    path = tmp_path / "t"
    fill(path, 30, partitions=2)
    sent = records(path)
    o0, o1 = [r.offset for r in sent[0]], [r.offset for r in sent[1]]
    with k7core.Queue(path / "partition-1", readonly=True) as q, q.consumer_group("g") as g:
        g.seek(o1[4])
    options = {"path": str(path), "group": "g", "startingoffsets": json.dumps({"t": {"0": o0[1]}})}
    reader = K7TopicStreamReader(options, StructType())
    start = reader.initialOffset()
    assert start == {"t": {"0": o0[1], "1": o1[4]}}
    assert json.loads(json.dumps(start)) == start  # what Spark keeps in the checkpoint
    from pyspark.sql.streaming.datasource import ReadMaxRows

    end = reader.latestOffset(start, ReadMaxRows(6))
    taken = [sum(start["t"][str(p)] <= o < end["t"][str(p)] for o in offs)
             for p, offs in enumerate((o0, o1))]
    assert 4 <= sum(taken) <= 6 and all(taken)  # shared in proportion to the backlogs
    parts = reader.partitions(start, end)
    assert {(p.partition, p.start, p.end) for p in parts} == {
        (0, o0[1], end["t"]["0"]), (1, o1[4], end["t"]["1"])}
    reader.commit(end)
    for p in range(2):
        with k7core.Queue(path / f"partition-{p}", readonly=True) as q, \
                q.consumer_group("g") as g:
            assert g.committed == end["t"][str(p)]
    with pytest.raises(k7core.K7Error, match="not of this topic"):
        reader.partitions({"other": {"0": 0}}, end)
    with pytest.raises(K7OptionError, match="endingOffsets is for batch reads"):
        K7TopicStreamReader({"path": str(path), "endingoffsets": "latest"}, StructType())


def test_stream_read_across_two_triggers_reads_each_record_once(
    spark: Any, tmp_path: Path
) -> None:
    path, ck, name = tmp_path / "t", tmp_path / "ck", f"k7_{uuid.uuid4().hex}"
    fill(path, 30)
    first = records(path)
    skipped = first[0][0]  # startingOffsets skips the first record of partition 0

    def run() -> list[int]:
        query = (
            spark.readStream.format("k7").option("maxRecordsPerTrigger", "12")
            .option("startingOffsets", json.dumps({"t": {"0": first[0][1].offset}}))
            .load(str(path)).writeStream.format("parquet")
            .option("checkpointLocation", str(ck)).start(str(tmp_path / name))
        )
        try:
            query.processAllAvailable()
            return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()

    sizes = run()
    assert sum(sizes) == 29 and len(sizes) > 1 and max(sizes) <= 12 + 2
    fill(path, 15, start=30)  # appended between the two runs
    assert sum(run()) == 15  # resumes at the checkpoint, not at startingOffsets
    got = by_partition(spark.read.parquet(str(tmp_path / name)).collect())
    sent = records(path)
    sent[0].remove(skipped)
    for p in range(3):
        assert [row_tuple(r) for r in got.get(p, [])] == [as_row(r, "t") for r in sent[p]]
    last = max((f for f in (ck / "offsets").iterdir() if f.name.isdigit()),
               key=lambda f: int(f.name))
    offsets = json.loads(last.read_text().splitlines()[-1])
    ends = {}
    for p in range(3):
        with k7core.Queue(path / f"partition-{p}", readonly=True) as q:
            ends[str(p)] = q.end
    assert offsets == {"t": ends}


def test_batch_write_places_keys_as_the_topic_does(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "out"
    rows = [
        (f"v{i}", None if i % 5 == 0 else f"user-{i % 11}",
         [("n", b"%d" % i)] if i % 2 else None, utc(T0 + i))
        for i in range(200)
    ]
    df = spark.createDataFrame(
        rows, "value STRING, key STRING, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
        "timestamp TIMESTAMP",
    ).repartition(2)
    with pytest.raises(Exception, match=r"is not a topic \(no k7py-topic.json\): set "
                                        r"option\('partitions', N\)"):
        df.write.format("k7").mode("append").save(str(path))
    df.write.format("k7").mode("append").option("partitions", "4").save(str(path))
    got = records(path)
    with Topic(path) as t:
        assert t.partitions == 4
        for p, recs in got.items():
            assert all(t.partition_for(r.key) == p for r in recs if r.key is not None)
    flat = {r.value: r for recs in got.values() for r in recs}
    assert len(flat) == 200
    for value, key, headers, ts in rows:
        r = flat[value.encode()]
        assert (r.key, list(r.headers), utc(r.timestamp)) == (
            None if key is None else key.encode(), headers or [], ts)
    assert sum(1 for recs in got.values() for r in recs if r.key is None) == 40
    assert all(len(recs) > 10 for recs in got.values())  # keyless rows spread too

    explicit = spark.createDataFrame(
        [(b"p3", 3, b"k"), (b"p0", 0, None), (b"by key", None, b"user-1")],
        "value BINARY, partition INT, key BINARY",
    )
    explicit.coalesce(1).write.format("k7").mode("append").save(str(path))
    after = records(path)
    new = {r.value: p for p, recs in after.items() for r in recs[len(got[p]):]}
    with Topic(path, readonly=True) as t:
        assert new == {b"p3": 3, b"p0": 0, b"by key": t.partition_for("user-1")}
    with pytest.raises(Exception, match=r"got partition 9; topic .* has partitions 0 \.\. 3"):
        spark.createDataFrame([(b"x", 9)], "value BINARY, partition INT").write.format(
            "k7").mode("append").save(str(path))
    with pytest.raises(Exception, match="has 4 partitions, not 5"):
        explicit.write.format("k7").mode("append").option("partitions", "5").save(str(path))
    with pytest.raises(Exception, match="cannot write column partition bigint"):
        spark.createDataFrame([(b"x", 1)], "value BINARY, partition BIGINT").write.format(
            "k7").mode("append").save(str(path))


def test_stream_write_from_topic_to_topic(spark: Any, tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "dst"
    fill(source, 40)
    with Topic(target, partitions=2) as t:
        t.send_many([ProducerRecord(b"already", key="x")])
    query = (
        spark.readStream.format("k7").load(str(source))
        .select("key", "value", "headers", "timestamp")
        .writeStream.format("k7").option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start(str(target))
    )
    query.awaitTermination()
    got = [r for recs in records(target).values() for r in recs]
    sent = [r for recs in records(source).values() for r in recs]

    def same(r: Record) -> tuple[Any, ...]:
        return (r.key is None, r.key or b"", r.value, r.headers, r.timestamp)

    assert sorted(same(r) for r in got if r.value != b"already") == sorted(map(same, sent))
    with Topic(target, readonly=True) as t:
        assert all(t.partition_for(r.key) == r.partition for r in got if r.key is not None)
