"""Queue.stats() / ConsumerGroup.stats(): offsets, segments, groups, lag, recovery events."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

import k7core
from k7core._format import encode_frame_header
from tests._childproc import Child
from tests._queuehelp import fill

SEG = 4096


def test_queue_stats_offsets_segments_groups(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        offs = fill(q, 100)  # 112-byte frames: 36 per segment -> 3 segments
        with q.consumer_group("a") as a, q.consumer_group("b"):
            a.ack_many(a.poll(max_batch=10))
            st = q.stats()
            assert st.earliest_offset == 0
            assert st.next_offset == offs[-1] + 112 == q.end
            assert st.segment_count == 3 == len(st.segments)
            assert [s.base for s in st.segments] == [0, 36 * 112, 72 * 112]
            assert st.segment_bytes == 3 * SEG
            assert st.disk_bytes >= st.segment_bytes
            assert st.log_syncs is not None and not st.readonly and st.writer_active
            assert st.recovery_events == ()
            ga, gb = st.groups
            assert (ga.name, ga.committed, ga.lag_messages, ga.owned) == ("a", offs[10], 90, True)
            assert ga.lag_bytes == st.next_offset - offs[10]
            assert (gb.name, gb.committed, gb.lag_messages) == ("b", 0, 100)
            gs = a.stats()
            assert (gs.committed, gs.position, gs.in_flight) == (offs[10], offs[10], 0)
            assert gs.lag_messages == 90 and gs.unread_bytes == gs.lag_bytes
            msgs = a.poll(max_batch=5)
            gs = a.stats()
            assert gs.in_flight == 5 and gs.position == offs[15] and gs.committed == offs[10]
            a.ack_many(msgs)
        # closed groups still show from their cursor files, no longer owned
        assert [(g.name, g.owned) for g in q.stats().groups] == [("a", False), ("b", False)]
        with pytest.raises(dataclasses.FrozenInstanceError):
            q.stats().next_offset = 0  # type: ignore[misc]


def test_lag_messages_none_above_the_limit(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=1 << 20, fsync="flush") as q:
        n = k7core.LAG_COUNT_LIMIT // (64 << 10) + 2
        q.enqueue_many([b"z" * (64 << 10)] * n)
        with q.consumer_group("g") as g:
            st = g.stats()
            assert st.lag_bytes > k7core.LAG_COUNT_LIMIT and st.lag_messages is None
            assert q.count_messages(0, q.end) == n


def test_recovery_event_for_a_torn_tail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        end = fill(q, 3)[-1] + 112
    seg = tmp_path / "seg-00000000000000000000.k7"
    torn = encode_frame_header(0x40, 0) + b"garbage"  # half a frame after the last one
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(torn)
    with caplog.at_level(logging.WARNING, "k7core"), k7core.Queue(
        tmp_path, segment_size=SEG, fsync="flush"
    ) as q:
        (ev,) = q.stats().recovery_events
        assert (ev.kind, ev.segment, ev.offset, ev.nbytes) == ("torn-tail-cut", 0, end, len(torn))
        assert ev.side_file is not None and (tmp_path / ev.side_file).exists()


def test_stats_of_a_readonly_queue_in_another_process(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        offs = fill(q, 50)
        with q.consumer_group("w") as g:
            g.ack_many(g.poll(max_batch=20))
            with Child("stats", str(tmp_path)) as child:
                st = json.loads(child.line())
                assert child.wait() == 0
    assert st["readonly"] and st["writer_active"] and st["log_syncs"] is None
    assert st["fsync"] is None and st["segment_size"] is None
    assert st["next_offset"] == offs[-1] + 112 and st["segment_count"] == 2
    assert st["groups"] == [{"name": "w", "committed": offs[20], "lag_bytes": 30 * 112,
                             "lag_messages": 30, "owned": True}]


def test_group_stats_after_close_raises(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        g = q.consumer_group("g")
        g.close()
        with pytest.raises(k7core.ClosedError):
            g.stats()
    with pytest.raises(k7core.ClosedError):
        q.stats()


def test_sync_latency_summary(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=1 << 20, fsync="sync") as q:
        for i in range(20):
            q.enqueue(b"%d" % i)
        st = q.stats()
        lat = st.log_sync
        assert lat is not None and st.log_syncs == lat.count >= 20
        assert sum(lat.buckets) == lat.count
        assert 0 < lat.mean_seconds <= lat.max_seconds <= lat.total_seconds
        assert lat.p50_seconds <= lat.p99_seconds
    with k7core.Queue(tmp_path, readonly=True) as q:
        assert q.stats().log_sync is None
