"""A consumer group's members in one process: assignment, hand-over (drain), fairness,
seek, nack, stats and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from k7core import ClosedError, InvalidNameError
from k7core.topics import (
    MemberBusyError,
    NotAssignedError,
    ProducerRecord,
    Record,
    Topic,
    TopicError,
)

SEG = 1 << 20


def fill(topic: Topic, per_partition: int) -> None:
    """``per_partition`` records in each partition (explicit keys that land there)."""
    keys: dict[int, list[str]] = {p: [] for p in range(topic.partitions)}
    i = 0
    while any(len(k) < per_partition for k in keys.values()):
        key = f"k{i}"
        p = topic.partition_for(key)
        if len(keys[p]) < per_partition:
            keys[p].append(key)
        i += 1
    topic.send_many(
        [ProducerRecord(f"{k}".encode(), key=k) for p in keys for k in keys[p]]
    )


def drain(c: object, n: int) -> list[Record]:
    from k7core.topics import TopicConsumer

    assert isinstance(c, TopicConsumer)
    out: list[Record] = []
    while len(out) < n:
        got = c.poll(n - len(out), 5.0)
        assert got, f"only {len(out)} of {n} records came"
        out += got
    return out


def test_one_member_gets_every_partition_and_commits(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=4, segment_size=SEG) as t:
        fill(t, 5)
        with t.consumer("g", "m") as c:
            assert c.assignment == (0, 1, 2, 3) and c.generation == 1
            recs = drain(c, 20)
            assert c.in_flight == 20
            assert c.ack_many(recs) == 20
            assert c.in_flight == 0 and not c.ack(recs[0])
            ends = [t.partition(p).end for p in range(4)]
            assert [c.committed(p) for p in range(4)] == ends
        # committed offsets are the partitions' cursors: a new member starts after them
        with t.consumer("g", "m2") as c2:
            assert c2.poll(10, 0) == []


def test_poll_is_fair_across_partitions(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=4, segment_size=SEG) as t:
        fill(t, 50)
        with t.consumer("g") as c:
            got = c.poll(40, 1.0)
            per = {p: sum(1 for r in got if r.partition == p) for p in range(4)}
            assert per == {0: 10, 1: 10, 2: 10, 3: 10}
            # what one partition lacks goes to the others
            c.ack_many(got)
            c.seek(0, t.partition(0).end)
            got = c.poll(40, 1.0)
            assert len(got) == 40 and not any(r.partition == 0 for r in got)


def test_a_second_member_takes_half_after_the_first_drains(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=4, segment_size=SEG) as t:
        fill(t, 3)
        a = t.consumer("g", "a", strategy="range")
        held = a.poll(100, 1.0)  # every record in flight at a
        assert len(held) == 12
        b = t.consumer("g", "b", strategy="range")
        assert b.assigned == (2, 3) and not b.assignment  # a still holds them
        a.beat()
        assert a.assignment == (0, 1)  # 2 and 3 no longer delivered by a, but held
        b.beat()
        assert not b.assignment
        a.ack_many([r for r in held if r.partition in (2, 3)])
        a.beat()
        b.beat()
        assert b.assignment == (2, 3)
        assert b.poll(10, 0) == []  # a acked them: nothing comes again
        a.ack_many([r for r in held if r.partition in (0, 1)])
        a.close()
        b.beat()
        assert list(b.assignment) == [0, 1, 2, 3]
        b.close()


def test_a_revoked_partition_is_released_after_revoke_timeout(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        fill(t, 2)
        a = t.consumer("g", "a", strategy="range", revoke_timeout=0.0)
        held = a.poll(10, 1.0)
        b = t.consumer("g", "b", strategy="range")
        a.beat()
        b.beat()
        assert b.assignment == (1,)
        late = [r for r in held if r.partition == 1]
        assert not a.ack(late[0])  # handed over: the ack is not a's to make
        again = b.poll(10, 1.0)
        assert [r.offset for r in again] == [r.offset for r in late]
        a.close()
        b.close()


def test_nack_redelivers_and_a_nacked_partition_is_handed_over(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        fill(t, 2)
        a = t.consumer("g", "a", strategy="range")
        recs = a.poll(10, 1.0)
        first = recs[0]
        assert a.nack(first)
        again = a.poll(1, 1.0)
        assert again == [first]
        b = t.consumer("g", "b", strategy="range")
        a.beat()
        moving = [r for r in recs if r.partition == 1]
        for r in moving:
            assert a.nack(r)
        a.beat()  # every record in flight there is nacked: released now
        b.beat()
        assert b.assignment == (1,)
        assert [r.offset for r in b.poll(10, 1.0)] == [r.offset for r in moving]
        a.close()
        b.close()


def test_seek_and_committed_only_on_held_partitions(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        fill(t, 3)
        a = t.consumer("g", "a", strategy="range")
        b = t.consumer("g", "b", strategy="range")
        a.beat()
        b.beat()
        with pytest.raises(NotAssignedError, match="not assigned to member 'a'"):
            a.seek(1, 0)
        with pytest.raises(NotAssignedError):
            b.committed(0)
        recs = a.poll(10, 1.0)
        assert {r.partition for r in recs} == {0}
        a.seek(0, recs[1].offset)
        assert [r.offset for r in a.poll(10, 1.0)] == [r.offset for r in recs[1:]]
        a.close()
        b.close()


def test_member_ids_are_unique_and_checked(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG) as t:
        with t.consumer("g", "a"), pytest.raises(MemberBusyError, match="already in the group"):
            t.consumer("g", "a")
        with pytest.raises(InvalidNameError):
            t.consumer("g", "../x")
        with pytest.raises(InvalidNameError):
            t.consumer("bad/name")
        with pytest.raises(ValueError, match="strategy"):
            t.consumer("g", strategy="nope")
        with pytest.raises(ValueError, match="heartbeat"):
            t.consumer("g", heartbeat=0)
        with t.consumer("h", "a", strategy="range"), \
                pytest.raises(TopicError, match="assigns with 'range'"):
            t.consumer("h", "b", strategy="roundrobin")


def test_stats_show_members_assignment_and_lag(tmp_path: Path) -> None:
    with Topic(tmp_path / "t", partitions=3, segment_size=SEG) as t:
        fill(t, 4)
        a = t.consumer("g", "a", strategy="roundrobin")
        b = t.consumer("g", "b", strategy="roundrobin")
        a.beat()
        b.beat()
        st = b.stats()
        assert st.members == ("a", "b") and st.assigned == (1,) and st.held == (1,)
        tg = st.topic_group
        assert tg is not None and tg.assignment == {"a": [0, 2], "b": [1]}
        assert [p.lag_messages for p in tg.partitions] == [4, 4, 4]
        assert [p.holder for p in tg.partitions] == ["a", "b", "a"]
        assert tg.lag_messages == 12 and tg.lag_bytes > 0
        b.ack_many(b.poll(10, 1.0))
        tg = t.stats().groups[0]
        assert [p.lag_messages for p in tg.partitions] == [4, 0, 4]
        a.close()
        b.close()
        with pytest.raises(ClosedError):
            a.poll()
        a.close()  # idempotent
        tg = t.stats().groups[0]
        assert tg.members == () and not any(p.owned for p in tg.partitions)


def test_closing_the_topic_closes_its_consumers(tmp_path: Path) -> None:
    t = Topic(tmp_path / "t", partitions=2, segment_size=SEG)
    c = t.consumer("g")
    t.close()
    assert c.closed
    with pytest.raises(ClosedError):
        t.consumer("g")


@pytest.mark.parametrize("closer", ["consumer", "topic"])
def test_acks_after_close_raise_closed_as_a_queues_group_does(tmp_path: Path, closer: str) -> None:
    """ack, ack_many and nack on a closed consumer raise ClosedError (as ConsumerGroup's do),
    never answer "not in flight": the caller must know its acks were not recorded."""
    t = Topic(tmp_path / "t", partitions=2, segment_size=SEG)
    t.send_many([b"x%d" % i for i in range(4)])
    c = t.consumer("g")
    recs = c.poll(10, 0)
    assert len(recs) == 4
    (c if closer == "consumer" else t).close()
    with pytest.raises(ClosedError):
        c.ack(recs[0])
    with pytest.raises(ClosedError):
        c.ack_many(recs)
    with pytest.raises(ClosedError):
        c.nack(recs[0])
    t.close()


def test_a_group_known_only_by_its_cursors_counts(tmp_path: Path) -> None:
    """A group that never joined through a TopicConsumer (Spark's, or a plain
    ConsumerGroup of a partition queue) shows in stats and holds back-pressure."""
    from k7core.topics import BackPressure, BackPressureError

    bp = BackPressure(high=3, low=1, on_high="raise")
    with Topic(tmp_path / "t", partitions=2, segment_size=SEG, back_pressure=bp) as t:
        t.partition(1).consumer_group("spark").close()  # a cursor, no member ever
        assert t.group_names() == ["spark"]
        with pytest.raises(BackPressureError, match="lags 3"):
            for i in range(10):
                t.send(b"x", key=f"k{i}")
        t.sync()  # visible now, not at the flusher's next pass (late on a busy machine)
        g = t.stats().groups[0]
        assert g.name == "spark" and g.members == () and g.generation == 0
        assert g.lag_messages == 3, (t.stats(), [t.partition(p).end for p in range(2)])
