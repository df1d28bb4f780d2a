"""Topic (k7core.topics.Topic) on real directories: create and open (and their refusals, two
processes creating one topic at once), send and send_many read back, Kafka's key placement,
keyless spreading, all-or-nothing batches, the lifetime, stats, and back-pressure on a
consumer group's lag (raise, block with a timeout, block until a consumer thread acks, the
throttle ratio, bytes, a named group against the slowest)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from k7core import ClosedError, K7Error, MessageTooLargeError, ReadOnlyError, StorageError
from k7core.topics import (
    BackPressure,
    BackPressureError,
    PressureStats,
    ProducerRecord,
    Record,
    Topic,
    TopicConsumer,
    TopicError,
    kafka_murmur2,
)
from k7core.topics._layout import META_FILE
from tests._queuehelp import child_env

SEG = 1 << 20
WAIT = 60.0  # the longest any event of these tests is waited for

MakeTopic = Callable[..., Topic]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[MakeTopic]:
    """Open topics under tmp_path (1 MiB segments, "flush": what is sent is visible at
    once); every one is closed at the end."""
    opened: list[Topic] = []

    def _make(partitions: int | None = 3, name: str = "t", **kwargs: Any) -> Topic:
        kwargs.setdefault("segment_size", SEG)
        kwargs.setdefault("fsync", "flush")
        t = Topic(tmp_path / name, partitions, **kwargs)
        opened.append(t)
        return t

    yield _make
    for t in reversed(opened):
        t.close()


def ends(t: Topic) -> list[int]:
    return [t.partition(p).end for p in range(t.partitions)]


def read_all(t: Topic) -> list[Record]:
    out = []
    for p in range(t.partitions):
        out += t.read(p, 0, 10_000)
    return out


# ------------------------------------------------------------------------ create and open


def test_create_and_reopen(make: MakeTopic, tmp_path: Path) -> None:
    t = make(4)
    assert (t.partitions, t.partitioner, t.readonly, t.closed) == (4, "kafka", False, False)
    assert t.path == tmp_path / "t" and t.name == "t"
    assert sorted(os.listdir(t.path)) == [
        "k7py-topic.json", "k7py-topic.lock",
        "partition-0", "partition-1", "partition-2", "partition-3",
    ]
    meta = json.loads((t.path / META_FILE).read_text())
    assert meta == {"k7py": "topic", "version": 1, "partitions": 4, "partitioner": "kafka",
                    "segment_size": SEG}
    t.send(b"one", key="k")
    t.close()
    assert "closed" in repr(t)
    again = make(None)
    assert (again.partitions, again.partitioner) == (4, "kafka")
    assert make(4).partitions == 4
    ro = make(None, readonly=True)
    assert ro.readonly and "readonly" in repr(ro)
    assert [r.value for r in read_all(ro)] == [b"one"]
    with pytest.raises(ReadOnlyError):
        ro.send(b"no")


def test_partition_count_mismatch(make: MakeTopic) -> None:
    make(4).close()
    with pytest.raises(TopicError, match="has 4 partitions, not 5") as info:
        make(5)
    assert info.value.hint is not None and "partitions=None" in info.value.hint
    assert isinstance(info.value, K7Error)
    with pytest.raises(TopicError, match="has 4 partitions, not 1"):
        make(1, readonly=True)


def test_partitioner_mismatch(make: MakeTopic) -> None:
    t = make(3, partitioner="murmur3")
    assert t.partitioner == "murmur3"
    t.close()
    with pytest.raises(TopicError, match="places keys with 'murmur3', not 'kafka'") as info:
        make(3, partitioner="kafka")
    assert info.value.hint is not None and "partitioner=None" in info.value.hint
    assert make(None).partitioner == "murmur3"


def test_unknown_partitioner_creates_nothing(make: MakeTopic, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="partitioner must be 'kafka' or 'murmur3'"):
        make(3, partitioner="crc32")
    assert not (tmp_path / "t").exists()


def test_missing_topic(make: MakeTopic, tmp_path: Path) -> None:
    with pytest.raises(TopicError, match="is not a topic"):
        make(None, readonly=True)
    with pytest.raises(TopicError, match="is not a topic"):
        make(3, readonly=True)  # readonly never creates
    with pytest.raises(TopicError, match="does not exist") as info:
        make(None)
    assert info.value.hint == "pass partitions=N to create it"
    assert not (tmp_path / "t").exists()


def test_a_plain_directory_is_not_a_topic(make: MakeTopic, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "something").write_text("x")
    with pytest.raises(TopicError, match="is not a topic"):
        make(None, readonly=True)
    with pytest.raises(TopicError, match="does not exist"):
        make(None)


def test_a_file_is_not_a_topic(tmp_path: Path) -> None:
    """A path that is a file, or under one, is a K7Error naming it (not a bare OSError),
    and nothing is created."""
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TopicError, match="is not a directory"):
        Topic(f, 2, segment_size=SEG)
    with pytest.raises(TopicError, match="is not a topic"):
        Topic(f, readonly=True)
    with pytest.raises(StorageError, match=r"cannot create topic directory .*: Not a directory"):
        Topic(f / "t", 2, segment_size=SEG)
    assert f.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file"]


def test_metadata_that_is_not_a_regular_file(make: MakeTopic, tmp_path: Path) -> None:
    """A metadata name held by a directory or a symbolic link: a StorageError saying so."""
    path = make(2).path
    (path / META_FILE).unlink()
    (path / META_FILE).mkdir()
    with pytest.raises(StorageError, match="not a regular file"):
        make(None)
    (path / META_FILE).rmdir()
    real = tmp_path / "meta.json"
    real.write_text(json.dumps({"k7py": "topic", "version": 1, "partitions": 2,
                                "partitioner": "kafka"}))
    (path / META_FILE).symlink_to(real)
    with pytest.raises(StorageError, match="symbolic link"):
        make(None, readonly=True)


@pytest.mark.parametrize(("partitions", "error"), [
    (0, ValueError), (-1, ValueError), (4097, ValueError),
    (True, TypeError), ("3", TypeError), (3.0, TypeError),
])
def test_bad_partition_count(make: MakeTopic, tmp_path: Path, partitions: Any,
                             error: type[Exception]) -> None:
    with pytest.raises(error, match="partitions must be"):
        make(partitions)
    assert not (tmp_path / "t").exists()


BAD_META = {
    "empty": b"",
    "not json": b"partitions=3",
    "not utf-8": b"\xff\xfe{}",
    "a list": b"[]",
    "not a topic": b'{"k7py": "queue", "version": 1, "partitions": 3, "partitioner": "kafka"}',
    "version 2": b'{"k7py": "topic", "version": 2, "partitions": 3, "partitioner": "kafka"}',
    "no partitions": b'{"k7py": "topic", "version": 1, "partitioner": "kafka"}',
    "no partitioner": b'{"k7py": "topic", "version": 1, "partitions": 3}',
    "zero partitions": b'{"k7py": "topic", "version": 1, "partitions": 0, "partitioner": "kafka"}',
    "partitions str": b'{"k7py": "topic", "version": 1, "partitions": "3", '
                      b'"partitioner": "kafka"}',
    "partitions bool": b'{"k7py": "topic", "version": 1, "partitions": true, '
                       b'"partitioner": "kafka"}',
    "partitions float": b'{"k7py": "topic", "version": 1, "partitions": 3.0, '
                        b'"partitioner": "kafka"}',
    "too many": b'{"k7py": "topic", "version": 1, "partitions": 5000, "partitioner": "kafka"}',
    "partitioner": b'{"k7py": "topic", "version": 1, "partitions": 3, "partitioner": "md5"}',
}


@pytest.mark.parametrize("data", BAD_META.values(), ids=BAD_META.keys())
def test_bad_metadata_file(make: MakeTopic, data: bytes) -> None:
    path = make(3).path
    (path / META_FILE).write_bytes(data)
    for kwargs in ({}, {"readonly": True}):
        with pytest.raises(TopicError, match="is not a valid topic metadata file") as info:
            make(None, **kwargs)
        assert str(path / META_FILE) in str(info.value)
        assert info.value.hint
    with pytest.raises(TopicError, match="is not a valid topic metadata file"):
        make(3)


CREATOR = r"""
import sys
from k7core.topics import Topic, TopicError
path, n = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
try:
    with Topic(path, partitions=n, segment_size=1 << 20) as t:
        print("ok", t.partitions, t.partitioner, flush=True)
except TopicError as exc:
    print("TopicError", exc, flush=True)
"""


def test_processes_creating_one_topic_agree(tmp_path: Path) -> None:
    """Eight processes create the same topic at once, half asking for 3 partitions and half
    for 5: one count wins; every process that asked for it opens the topic, every other one
    gets TopicError; the partitions on disk are the winner's."""
    path = tmp_path / "t"
    counts = [3, 5] * 4
    procs = [
        subprocess.Popen([sys.executable, "-c", CREATOR, str(path), str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=child_env())
        for n in counts
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:  # as close together as the pipes allow
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=WAIT) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    winner = json.loads((path / META_FILE).read_text())["partitions"]
    for n, (out, _) in zip(counts, outs, strict=True):
        if n == winner:
            assert out == f"ok {winner} kafka\n"
        else:
            assert out.startswith(f"TopicError topic {path} has {winner} partitions, not {n}")
    assert sorted(d for d in os.listdir(path) if d.startswith("partition-")) == [
        f"partition-{i}" for i in range(winner)
    ]
    with Topic(path, segment_size=SEG) as t:
        assert t.partitions == winner


# ------------------------------------------------------------------------ send and read


def sample_records(rng: random.Random, n: int) -> list[ProducerRecord]:
    out = []
    for i in range(n):
        key: bytes | str | None = rng.choice(
            [None, b"", "", f"user-{rng.randrange(20)}", rng.randbytes(rng.randrange(0, 9))])
        headers: Any = rng.choice([
            None, {}, {"a": "1"}, [("h", b"x"), ("h", b"y"), ("z", "é")], (("", b""),),
        ])
        values: list[bytes | str] = [rng.randbytes(rng.randrange(0, 300)), f"text {i} ✓"]
        value = rng.choice(values)
        ts = rng.choice([None, 0, -1, (1 << 63) - 1, -(1 << 63), 1_700_000_000_000 + i])
        out.append(ProducerRecord(value, key, headers, ts))
    return out


def expected_record(r: ProducerRecord, p: int, off: int, read: Record) -> Record:
    def b(v: bytes | bytearray | memoryview | str) -> bytes:
        return v.encode() if isinstance(v, str) else bytes(v)

    pairs: list[tuple[str, bytes | str]] = list(
        r.headers.items() if isinstance(r.headers, Mapping) else (r.headers or ()))
    return Record(p, off, None if r.key is None else b(r.key), b(r.value),
                  tuple((n, b(v)) for n, v in pairs),
                  read.timestamp if r.timestamp is None else r.timestamp)


def test_send_and_send_many_read_back(make: MakeTopic) -> None:
    t = make(4)
    rng = random.Random(7)
    records = sample_records(rng, 300)
    before = time.time_ns() // 1_000_000
    where = [t.send(*r) for r in records[:150]]
    where += t.send_many(records[150:])
    after = time.time_ns() // 1_000_000
    assert len(set(where)) == len(where)
    for r, (p, off) in zip(records, where, strict=True):
        [got] = t.read(p, off, 1)
        assert got == expected_record(r, p, off, got)
        if r.timestamp is None:
            assert before <= got.timestamp <= after
    # each partition holds exactly what was sent to it, in the order sent
    by_partition: dict[int, list[int]] = {}
    for p, off in where:
        by_partition.setdefault(p, []).append(off)
    for p in range(4):
        assert [r.offset for r in t.read(p, 0, 10_000)] == by_partition.get(p, [])
    assert t.read(0, ends(t)[0]) == []


def test_send_many_takes_bare_values(make: MakeTopic) -> None:
    t = make(1)
    where = t.send_many([b"a", "b", bytearray(b"c"), memoryview(b"d"),
                         ProducerRecord(b"e")])
    assert [p for p, _ in where] == [0] * 5
    assert [r.value for r in read_all(t)] == [b"a", b"b", b"c", b"d", b"e"]
    assert t.send_many([]) == []
    assert t.send_many(iter([b"f"])) == [(0, where[-1][1] + 24)]


def test_async_topic_reads_back_after_sync(make: MakeTopic) -> None:
    """With the default fsync="async", what was sent is visible once synced."""
    t = make(2, fsync="async")
    where = t.send_many([ProducerRecord(f"v{i}", key=str(i)) for i in range(20)])
    t.sync()
    got = {(r.partition, r.offset): r.value for r in read_all(t)}
    assert got == {w: f"v{i}".encode() for i, w in enumerate(where)}


GOLDEN_KEY, GOLDEN_HASH = "21", -973932308  # Kafka's UtilsTest.testMurmur2


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 100])
def test_key_placement_is_kafkas(make: MakeTopic, n: int) -> None:
    t = make(n)
    assert kafka_murmur2(GOLDEN_KEY.encode()) == GOLDEN_HASH
    golden = (GOLDEN_HASH & 0x7FFFFFFF) % n
    assert t.partition_for(GOLDEN_KEY) == golden
    assert t.send(b"v", key=GOLDEN_KEY)[0] == golden
    assert t.send(b"v", key=GOLDEN_KEY.encode())[0] == golden
    rng = random.Random(n)
    keys: list[str | bytes] = [f"customer-{i}" for i in range(50)]
    keys += [rng.randbytes(rng.randrange(0, 20)) for _ in range(50)]
    for key in keys:
        kb = key.encode() if isinstance(key, str) else key
        want = (kafka_murmur2(kb) & 0x7FFFFFFF) % n
        assert t.partition_for(key) == want
        assert t.send(b"v", key=key)[0] == want
    placed = t.send_many([ProducerRecord(b"v", key=k) for k in keys])
    assert [p for p, _ in placed] == [t.partition_for(k) for k in keys]
    assert t.send(b"v", key=bytearray(b"21"))[0] == golden
    with pytest.raises(TypeError, match="a key is needed"):
        t.partition_for(None)  # type: ignore[arg-type]


def test_murmur3_topic_places_with_partition_for(make: MakeTopic) -> None:
    t = make(5, partitioner="murmur3")
    for i in range(40):
        key = f"k{i}"
        assert t.send(b"v", key=key)[0] == t.partition_for(key)


def test_keyless_records_cover_every_partition(make: MakeTopic) -> None:
    n = 5
    t = make(n)
    sent = [t.send(f"{i}") for i in range(3 * n)]
    assert Counter(p for p, _ in sent) == {p: 3 for p in range(n)}
    many = t.send_many([b"x"] * (2 * n))
    assert Counter(p for p, _ in many) == {p: 2 for p in range(n)}
    assert Counter(r.partition for r in read_all(t)) == {p: 5 for p in range(n)}
    assert all(r.key is None for r in read_all(t))


@pytest.mark.parametrize(("bad", "error"), [
    (ProducerRecord(b"x", headers=42), TypeError),  # type: ignore[arg-type]
    (ProducerRecord(b"x", key=5), TypeError),  # type: ignore[arg-type]
    (ProducerRecord(123), TypeError),  # type: ignore[arg-type]
    (ProducerRecord(b"x", timestamp=1.5), TypeError),  # type: ignore[arg-type]
    (ProducerRecord(b"x", timestamp=1 << 64), ValueError),
    (ProducerRecord(b"x", headers=[("h", None)]), TypeError),  # type: ignore[list-item]
    (42, TypeError),
    (None, TypeError),
    (("tuple", "not a ProducerRecord"), TypeError),
    (ProducerRecord(b"x" * SEG, key="k"), MessageTooLargeError),
    (ProducerRecord(b"x" * SEG), MessageTooLargeError),
])
def test_send_many_checks_everything_before_writing(make: MakeTopic, bad: Any,
                                                    error: type[Exception]) -> None:
    t = make(3)
    t.send_many([ProducerRecord(b"before", key=str(i)) for i in range(6)])
    start = ends(t)
    batch = [ProducerRecord(b"ok", key=str(i)) for i in range(5)] + [b"keyless"] * 3
    with pytest.raises(error):
        t.send_many([*batch, bad, *batch])
    assert ends(t) == start
    assert len(read_all(t)) == 6
    assert len(t.send_many(batch)) == len(batch)  # the topic still works


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"value": 123}, TypeError, "value must be bytes or str, not int"),
    ({"value": b"x", "key": 5}, TypeError, "a record key must be"),
    ({"value": b"x", "headers": "h"}, TypeError, "headers must be a mapping"),
    ({"value": b"x", "timestamp": True}, TypeError, "timestamp must be an int"),
    ({"value": b"x", "timestamp": 1 << 63}, ValueError, "does not fit in 64 bits"),
    ({"value": "\ud800"}, ValueError, "value is not valid Unicode"),
    ({"value": b"x" * SEG}, MessageTooLargeError, "does not fit in a segment"),
])
def test_send_refuses_bad_records(make: MakeTopic, kwargs: dict[str, Any],
                                  error: type[Exception], match: str) -> None:
    t = make(2)
    with pytest.raises(error, match=match):
        t.send(**kwargs)
    assert ends(t) == [0, 0]


def test_largest_record_that_fits(make: MakeTopic) -> None:
    t = make(1)
    # frame header 10 bytes, envelope head 10 bytes, a whole segment
    p, off = t.send(b"x" * (SEG - 20))
    assert t.read(p, off)[0].value == b"x" * (SEG - 20)
    with pytest.raises(MessageTooLargeError):
        t.send(b"x" * (SEG - 19))


@pytest.mark.parametrize("one", ["abc", b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_send_many_refuses_one_value(make: MakeTopic, one: Any) -> None:
    """One str is not three records 'a', 'b', 'c' (nor bytes three ints): refused, as
    Queue.enqueue_many refuses them."""
    t = make(1)
    with pytest.raises(TypeError, match="send_many takes an iterable of records, not one"):
        t.send_many(one)
    assert ends(t) == [0]


# ------------------------------------------------------------------------ lifetime


def test_closed_topic_raises(make: MakeTopic) -> None:
    t = make(2)
    t.send(b"x")
    t.close()
    assert t.closed
    t.close()  # idempotent
    calls: list[Callable[[], object]] = [
        lambda: t.send(b"x"), lambda: t.send_many([b"x"]), lambda: t.partition(0),
        lambda: t.read(0, 0), lambda: t.consumer("g"), t.stats,
    ]
    for call in calls:
        with pytest.raises(ClosedError, match="is closed"):
            call()
    assert t.partition_for("k") in (0, 1)  # no file needed


def test_closed_topic_back_pressure_calls_raise(make: MakeTopic) -> None:
    """pressure_stats(), paused() and throttle_ratio() of a closed topic raise; they do not
    read the lag, which would open the partition queues again (and leave them open)."""
    t = make(2, back_pressure=BackPressure(high=10))
    t.close()
    for call in (t.pressure_stats, t.paused, t.throttle_ratio):
        with pytest.raises(ClosedError):
            call()
    assert t._queues == [None, None]


def test_with_closes(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", 2, segment_size=SEG) as t:
        c = t.consumer("g", "m")
        t.send(b"x")
    assert t.closed and c.closed
    with pytest.raises(ClosedError):
        t.send(b"x")
    with Topic(tmp_path / "t", segment_size=SEG) as again:  # durable
        assert [r.value for r in read_all(again)] == [b"x"]


EXIT_WITHOUT_CLOSE = r"""
import sys
from k7core.topics import Topic
t = Topic(sys.argv[1], partitions=2, segment_size=1 << 20)
t.send(b"left open", key="k")
print("sent", flush=True)
"""


def test_exit_without_close(tmp_path: Path) -> None:
    """A process that exits with a topic open exits cleanly, and what it sent is there. (A
    Topic finalizer of its own, run at exit after the partition queues' finalizers had
    unmapped them, closed them again: a segfault in k7_writer_sync.)"""
    proc = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSE, str(tmp_path / "t")],
                          capture_output=True, text=True, timeout=WAIT, env=child_env(),
                          check=False)
    assert (proc.returncode, proc.stdout) == (0, "sent\n"), proc.stderr
    with Topic(tmp_path / "t", segment_size=SEG) as t:
        assert [r.value for r in read_all(t)] == [b"left open"]


def test_stats(make: MakeTopic) -> None:
    t = make(3)
    where = t.send_many([ProducerRecord(b"v", key=f"k{i}") for i in range(12)])
    c = t.consumer("billing", "m1")
    got: list[Record] = []
    while len(got) < 12:
        more = c.poll(max_records=100, timeout=WAIT)
        assert more
        got += more
    c.ack_many(got[:5])
    st = t.stats()
    assert st.path == str(t.path) and st.partitioner == "kafka" and st.back_pressure is None
    assert [p.partition for p in st.partitions] == [0, 1, 2]
    assert [p.next_offset for p in st.partitions] == ends(t)
    assert all(p.earliest_offset == 0 and os.getpid() in p.writer_pids for p in st.partitions)
    [g] = st.groups
    assert (g.name, g.members, g.strategy) == ("billing", ("m1",), "sticky")
    assert g.generation >= 1
    assert g.assignment == {"m1": [0, 1, 2]}
    assert [lag.partition for lag in g.partitions] == [0, 1, 2]
    assert all(lag.owner == "m1" and lag.owned for lag in g.partitions)
    assert g.lag_messages == 12 - 5
    acked = Counter(r.partition for r in got[:5])
    for lag in g.partitions:
        on_p = sum(1 for p, _ in where if p == lag.partition)
        assert lag.lag_messages == on_p - acked[lag.partition]
        assert lag.lag_bytes == ends(t)[lag.partition] - lag.committed
    assert g.lag_bytes == sum(lag.lag_bytes for lag in g.partitions)
    c.close()
    [g] = t.stats().groups  # the group stays, with no member
    assert g.members == () and not any(lag.owned for lag in g.partitions)
    assert t.group_names() == ["billing"]


# ------------------------------------------------------------------------ back-pressure


def joined(t: Topic, group: str = "g") -> TopicConsumer:
    """A member that joins the group (its cursors start at the earliest records)."""
    return t.consumer(group, f"{group}-member")


def ack(c: TopicConsumer, n: int) -> None:
    """Poll and ack ``n`` records."""
    done = 0
    while done < n:
        got = c.poll(max_records=n - done, timeout=WAIT)
        assert got, "nothing to ack"
        done += c.ack_many(got)


def test_raise_until_the_group_catches_up(make: MakeTopic) -> None:
    bp = BackPressure(high=10, low=5, on_high="raise", interval=0)
    t = make(3, back_pressure=bp)
    c = joined(t)
    for i in range(10):  # lag 0 .. 9 before each: through
        t.send(f"m{i}")
    assert t.pressure_stats() == PressureStats(
        "messages", None, 10, 5, 10, True, 1.0, 1, 0.0, 300.0)
    full = ends(t)
    with pytest.raises(BackPressureError, match="the slowest group lags 10 messages") as info:
        t.send(b"refused")
    assert info.value.lag == 10 and info.value.hint
    assert isinstance(info.value, K7Error)
    with pytest.raises(BackPressureError):
        t.send_many([b"refused", b"too"])
    assert ends(t) == full  # nothing written
    ack(c, 4)  # lag 6: still paused (hysteresis: until the lag is back at 5)
    with pytest.raises(BackPressureError) as info:
        t.send(b"refused")
    assert info.value.lag == 6
    ack(c, 1)  # lag 5: sends go through again
    t.send(b"through")
    for _ in range(4):  # lag 6 .. 9
        t.send(b"through")
    with pytest.raises(BackPressureError):
        t.send(b"refused")
    ps = t.pressure_stats()
    assert ps is not None and (ps.lag, ps.paused, ps.pauses, ps.blocked_seconds) == (
        10, True, 2, 0.0)
    assert len(read_all(t)) == 15


def test_a_lone_producer_stops_at_the_mark_between_readings(make: MakeTopic) -> None:
    """With a long ``interval`` the lag is read once, then what this topic sends counts
    as lag until the next reading: the producer stops at the high mark, not later."""
    t = make(3, back_pressure=BackPressure(high=10, low=5, on_high="raise", interval=WAIT))
    joined(t)
    t.send_many([b"x"] * 4)
    for _ in range(6):
        t.send(b"x")
    with pytest.raises(BackPressureError) as info:
        t.send(b"refused")
    assert info.value.lag == 10 and sum(1 for _ in read_all(t)) == 10


def test_lag_after_retention_deleted_unread_records(make: MakeTopic) -> None:
    """retention_bytes deletes records a stalled group never read: its lag in messages is
    the records still in the partition (counted from the earliest), in bytes the end less
    its cursor (as stats' lag_bytes), and both stay right as more records arrive."""
    opts: dict[str, Any] = {"segment_size": 4096, "retention_bytes": 3 * 4096}
    t = make(1, back_pressure=BackPressure(high=10**6, interval=0), **opts)
    tb = make(None, back_pressure=BackPressure(high=10**9, unit="bytes", interval=0), **opts)
    joined(t)
    q = t.partition(0)
    for i in range(400):
        t.send(b"x" * 100)
        if i % 50 == 49:
            ps, psb = t.pressure_stats(), tb.pressure_stats()
            assert ps is not None and psb is not None
            assert ps.lag == q.count_messages(q.earliest(), q.end) == \
                (q.end - q.earliest()) // 120
            [g] = t.stats().groups
            assert psb.lag == q.end == g.lag_bytes
    assert q.earliest() > 0  # records were deleted


def test_a_group_that_has_not_joined_does_not_hold_sends(make: MakeTopic) -> None:
    t = make(2, back_pressure=BackPressure(high=3, on_high="raise", interval=0))
    t.send_many([b"x"] * 20)
    for _ in range(5):
        t.send(b"x")  # no group: nobody to wait for
    ps = t.pressure_stats()
    assert ps is not None and ps.lag == 0 and not ps.paused
    joined(t)  # a new member starts at the earliest records: 25 behind
    with pytest.raises(BackPressureError) as info:
        t.send(b"x")
    assert info.value.lag == 25


def test_block_times_out_with_a_stalled_group(make: MakeTopic) -> None:
    timeout = 0.2
    bp = BackPressure(high=3, low=1, on_high="block", timeout=timeout, interval=0.01)
    t = make(2, back_pressure=bp)
    joined(t)
    t.send_many([b"a", b"b", b"c"])
    # (a send within ``interval`` of the last reading is not held: read the lag now)
    assert t.paused()
    full = ends(t)
    start = time.monotonic()
    with pytest.raises(BackPressureError, match="lags 3 messages") as info:
        t.send(b"waits")
    assert time.monotonic() - start >= timeout
    assert info.value.lag == 3 and ends(t) == full
    ps = t.pressure_stats()
    assert ps is not None and ps.paused and ps.pauses == 1
    assert ps.blocked_seconds >= timeout
    blocked = ps.blocked_seconds
    with pytest.raises(BackPressureError):
        t.send_many([b"waits"])
    ps = t.pressure_stats()
    assert ps is not None and ps.blocked_seconds >= blocked + timeout and ps.pauses == 1


def test_block_with_zero_timeout_raises_at_once(make: MakeTopic) -> None:
    t = make(1, back_pressure=BackPressure(high=1, on_high="block", timeout=0, interval=0))
    joined(t)
    t.send(b"a")
    with pytest.raises(BackPressureError):
        t.send(b"b")
    assert ends(t) == [24]


def test_blocked_send_returns_when_a_consumer_thread_acks(
    make: MakeTopic, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A send blocks on a stalled group; a consumer (another Topic, in a thread) acks once
    the send is seen waiting; the send then returns and its record is written."""
    bp = BackPressure(high=10, low=5, on_high="block", timeout=WAIT, interval=0.001)
    t = make(2, back_pressure=bp)
    is_in, waiting = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with Topic(t.path, readonly=True) as rt, rt.consumer("g", "worker") as c:
                is_in.set()
                if not waiting.wait(WAIT):
                    raise AssertionError("the send never waited")
                ack(c, 6)
        except BaseException as exc:
            errors.append(exc)
            is_in.set()

    worker = threading.Thread(target=consume)
    worker.start()
    try:
        assert is_in.wait(WAIT)
        t.send_many([b"x"] * 10)
        assert t.paused()  # lag 10
        readings = 0
        lags = t._meter.lags

        def seen() -> dict[str, int]:  # the send's readings of the lag while it waits
            nonlocal readings
            readings += 1
            if readings >= 2:
                waiting.set()
            return lags()

        monkeypatch.setattr(t._meter, "lags", seen)
        p, off = t.send(b"after the acks")
    finally:
        waiting.set()
        worker.join(WAIT)
    assert not errors
    assert readings >= 2
    assert t.read(p, off)[0].value == b"after the acks"
    ps = t.pressure_stats()
    assert ps is not None and not ps.paused and ps.pauses == 1
    assert ps.blocked_seconds > 0
    assert ps.lag == 10 - 6 + 1


def test_throttle_ratio_between_the_marks(make: MakeTopic) -> None:
    t = make(2, back_pressure=BackPressure(high=10, low=4, on_high="raise", interval=0))
    c = joined(t)
    assert t.throttle_ratio() == 0.0 and not t.paused()
    t.send_many([b"x"] * 4)
    assert t.throttle_ratio() == 0.0
    t.send(b"x")
    assert t.throttle_ratio() == pytest.approx(1 / 6)
    t.send_many([b"x"] * 2)
    assert t.throttle_ratio() == pytest.approx(0.5)
    t.send_many([b"x"] * 3)
    assert t.throttle_ratio() == 1.0 and t.paused()
    ack(c, 3)  # lag 7, but paused until 4
    assert t.throttle_ratio() == 1.0 and t.paused()
    ack(c, 3)  # lag 4
    assert t.throttle_ratio() == 0.0 and not t.paused()
    t.send_many([b"x"] * 3)  # lag 7, running: linear again
    assert t.throttle_ratio() == pytest.approx(0.5)
    st = t.stats()
    assert st.back_pressure == t.pressure_stats()
    assert st.back_pressure == PressureStats("messages", None, 10, 4, 7, False, 0.5, 1, 0.0, 300.0)


def test_without_back_pressure(make: MakeTopic) -> None:
    t = make(1)
    joined(t)
    t.send_many([b"x"] * 50)
    assert (t.throttle_ratio(), t.paused(), t.pressure_stats()) == (0.0, False, None)
    assert t.stats().back_pressure is None


def test_bytes_unit(make: MakeTopic) -> None:
    high = 200
    t = make(2, back_pressure=BackPressure(high=high, low=50, unit="bytes", on_high="raise",
                                           interval=0))
    c = joined(t)
    seen: list[int] = []  # the log's bytes before each send that went through
    with pytest.raises(BackPressureError, match=f"lags \\d+ bytes, over the high watermark "
                                                f"{high}") as info:
        while True:
            total = sum(ends(t))
            t.send(b"y" * 13, key=str(len(seen)))
            seen.append(total)
    sent = len(seen)
    assert seen[-1] < high <= sum(ends(t)) == info.value.lag  # the lag is the log's bytes
    ps = t.pressure_stats()
    assert ps is not None and (ps.unit, ps.lag, ps.paused) == ("bytes", sum(ends(t)), True)
    ack(c, sent)
    ps = t.pressure_stats()
    assert ps is not None and (ps.lag, ps.paused) == (0, False)
    t.send(b"through")


def test_named_group_and_slowest_group(make: MakeTopic) -> None:
    """``group="fast"`` watches that group only: a stalled other group does not hold its
    sends; ``group=None`` watches the slowest group; a group with no cursor lags 0."""
    fast_only = make(3, back_pressure=BackPressure(high=5, on_high="raise", interval=0,
                                                   group="fast"))
    slowest = make(None, back_pressure=BackPressure(high=5, on_high="raise", interval=0))
    nobody = make(None, back_pressure=BackPressure(high=1, on_high="raise", interval=0,
                                                   group="nobody"))
    fast, slow = joined(fast_only, "fast"), joined(fast_only, "slow")
    for i in range(20):
        fast_only.send(f"m{i}", key=str(i))
        ack(fast, 1)
    ps = fast_only.pressure_stats()
    assert ps is not None and (ps.group, ps.lag, ps.paused) == ("fast", 0, False)
    with pytest.raises(BackPressureError, match="the slowest group lags 20 messages"):
        slowest.send(b"x")
    ps = slowest.pressure_stats()
    assert ps is not None and (ps.group, ps.lag, ps.paused) == (None, 20, True)
    nobody.send(b"x")
    ps = nobody.pressure_stats()
    assert ps is not None and (ps.group, ps.lag) == ("nobody", 0)
    ack(slow, 18)  # lag 3 (of 21): the slowest is now "slow" at 3, still paused above 2
    with pytest.raises(BackPressureError, match="lags 3"):
        slowest.send(b"x")
    ack(slow, 1)
    slowest.send(b"x")
    assert [g.name for g in fast_only.stats().groups] == ["fast", "slow"]
    with pytest.raises(BackPressureError, match="group 'fast' lags"):
        for _ in range(10):
            fast_only.send(b"x")
