"""A topic's directory (or a bound queue's) deleted while a Topic or an
Exchange has it open: a write raises TopicDeletedError and writes nothing, instead of
going into files nobody can open again; a topic created again at the path receives the
exchange's next record. With ``fsync="sync"`` the first write after the deletion raises;
with ``"async"`` one within ``commit_interval`` of the last check may still go through (its
window of not being durable yet), and the error counts them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from k7core import Queue, StorageError
from k7core.topics import Exchange, ProducerRecord, Topic, TopicDeletedError

SEG = 1 << 20


def closed_gone(t: Topic) -> None:
    """Close a topic whose files were deleted: the engine says what was in them is gone."""
    with pytest.raises(StorageError, match="deleted"):
        t.close()
    assert t.closed


def test_send_into_a_deleted_topic_raises(tmp_path: Path) -> None:
    t = Topic(tmp_path / "t", partitions=2, segment_size=SEG, fsync="sync")
    t.send(b"before", partition=0)
    shutil.rmtree(tmp_path / "t")
    with pytest.raises(TopicDeletedError, match="was deleted") as info:
        t.send(b"after", partition=1)
    assert info.value.hint and "open" in info.value.hint
    with pytest.raises(TopicDeletedError):
        t.send_many([ProducerRecord(b"x", partition=0), ProducerRecord(b"y", partition=1)])
    closed_gone(t)
    assert not (tmp_path / "t").exists()


def test_exchange_publish_into_a_deleted_bound_topic_raises(tmp_path: Path) -> None:
    Topic(tmp_path / "t", partitions=2, segment_size=SEG).close()
    Queue(tmp_path / "q", segment_size=SEG).close()
    with Exchange(tmp_path / "ex", "direct", fsync="sync") as ex:
        ex.bind(tmp_path / "t", "t")
        ex.bind(tmp_path / "q", "q")
        ex.publish(b"first", "t")  # both opened and cached
        ex.publish(b"first", "q")
        shutil.rmtree(tmp_path / "t")
        shutil.rmtree(tmp_path / "q")
        with pytest.raises(TopicDeletedError, match="does not exist"):
            ex.publish(b"lost?", "t")
        with pytest.raises(TopicDeletedError):
            ex.publish(b"lost?", "q")
        assert not (tmp_path / "t").exists() and not (tmp_path / "q").exists()


def test_exchange_writes_into_a_topic_created_again(tmp_path: Path) -> None:
    Topic(tmp_path / "t", partitions=2, segment_size=SEG).close()
    with Exchange(tmp_path / "ex", "fanout", fsync="sync") as ex:
        ex.bind(tmp_path / "t")
        ex.publish(b"old")
        shutil.rmtree(tmp_path / "t")
        with Topic(tmp_path / "t", partitions=3, segment_size=SEG, fsync="sync") as again:
            (d,) = ex.publish(b"new", key=b"k")
            again.sync()
            got = again.read(d.partition or 0, 0)
            assert [r.value for r in got] == [b"new"]


def test_a_destination_deleted_before_its_first_publish(tmp_path: Path) -> None:
    Topic(tmp_path / "t", partitions=2, segment_size=SEG).close()
    with Exchange(tmp_path / "ex", "fanout") as ex:
        ex.bind(tmp_path / "t")
        shutil.rmtree(tmp_path / "t")
        with pytest.raises(TopicDeletedError, match="unbind"):
            ex.publish(b"x")
        assert not (tmp_path / "t").exists()  # not created as a queue


@pytest.mark.parametrize("via", ["topic", "exchange to a topic", "exchange to a queue"])
def test_async_writes_notice_a_deletion_within_commit_interval(
    tmp_path: Path, via: str,
) -> None:
    """With fsync="async" the directory is checked at most every commit_interval: writes
    go on until the next check (bounded here by a count, not a clock), which raises and
    counts what went with the directory."""
    interval = 0.001
    if via == "exchange to a queue":
        Queue(tmp_path / "d", segment_size=SEG, commit_interval=interval).close()
    else:
        Topic(tmp_path / "d", partitions=2, segment_size=SEG).close()
    t = Topic(tmp_path / "d" if via == "topic" else tmp_path / "other", partitions=2,
              segment_size=SEG, commit_interval=interval)
    with Exchange(tmp_path / "ex", "fanout") as ex:
        ex.bind(tmp_path / "d")

        def write() -> object:
            return t.send(b"x", partition=0) if via == "topic" else ex.publish(b"x")

        write()
        shutil.rmtree(tmp_path / "d")
        with pytest.raises(TopicDeletedError, match="deleted") as info:
            for _ in range(10_000_000):  # a check comes within the interval: far fewer
                write()
        assert info.value.hint
    if via == "topic":
        closed_gone(t)
    else:
        t.close()
