"""Sending with an explicit partition (Kafka's and TitanMQ's ProducerRecord partition)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k7core.topics import ProducerRecord, Topic


def test_an_explicit_partition_wins_over_the_key(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=3, segment_size=1 << 20) as t:
        key = "customer-1"
        other = (t.partition_for(key) + 1) % 3
        assert t.send(b"a", key=key, partition=other)[0] == other
        got = t.send_many([ProducerRecord(b"b", key=key, partition=other),
                           ProducerRecord(b"c", key=key)])
        assert [p for p, _ in got] == [other, t.partition_for(key)]
        t.sync()  # visible now (with "async", at the flusher's next pass)
        assert [r.value for r in t.records(other)] == [b"a", b"b"]
        ends = [t.partition(p).end for p in range(3)]
        for bad, err in ((3, ValueError), (-1, ValueError), (True, TypeError), ("1", TypeError)):
            with pytest.raises(err, match="partition must"):
                t.send(b"x", partition=bad)  # type: ignore[arg-type]
            with pytest.raises(err, match="partition must"):
                t.send_many([b"ok", ProducerRecord(b"x", partition=bad)])  # type: ignore[arg-type]
        assert [t.partition(p).end for p in range(3)] == ends  # nothing written


def test_a_topic_keeps_the_segment_size_it_was_created_with(tmp_path: Path) -> None:
    Topic(tmp_path / "t", partitions=2, segment_size=8192).close()
    with Topic(tmp_path / "t") as t:  # no segment_size: the recorded one
        t.send(b"v", partition=1)
    sizes = {f.stat().st_size for f in (tmp_path / "t").glob("partition-*/seg-*.k7")}
    assert sizes == {8192}


def test_a_queue_directory_is_not_made_a_topic(tmp_path: Path) -> None:
    from k7core import Queue
    from k7core.topics import TopicError

    Queue(tmp_path / "q", segment_size=4096).close()
    with pytest.raises(TopicError, match="is a queue, not a topic"):
        Topic(tmp_path / "q", partitions=2)
    assert not (tmp_path / "q" / "k7py-topic.json").exists()
