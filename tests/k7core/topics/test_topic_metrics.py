"""The topics' Prometheus collector: what a scrape shows."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from k7core.topics import BackPressure, Topic
from k7core.topics.metrics import TopicCollector


def test_scrape_shows_groups_lag_and_back_pressure(tmp_path: Path) -> None:
    bp = BackPressure(high=4, low=2, on_high="raise")
    with Topic(tmp_path / "t", partitions=2, segment_size=1 << 20, back_pressure=bp) as t:
        reg = CollectorRegistry()
        col = TopicCollector(t, registry=reg)
        c = t.consumer("g", "m1")
        for i in range(3):
            t.send(b"x", key=f"k{i}")
        t.sync()  # visible now, not at the next flush
        t.paused()  # a reading: 3 behind, between the marks
        text = generate_latest(reg).decode()
        name = str(t.path)
        assert f'k7_topic_group_members{{group="g",topic="{name}"}} 1.0' in text
        lags = [ln for ln in text.splitlines() if ln.startswith("k7_topic_group_lag_messages{")]
        assert sum(float(ln.rsplit(" ", 1)[1]) for ln in lags) == 3.0
        assert 'k7_topic_group_partition_held{group="g",member="m1",partition="0"' in text
        assert f'k7_topic_backpressure_lag{{topic="{name}",unit="messages"}} 3.0' in text
        assert f'k7_topic_backpressure_paused{{topic="{name}"}} 0.0' in text
        assert f'k7_topic_backpressure_throttle_ratio{{topic="{name}"}} 0.5' in text
        assert f'k7_topic_group_last_active_timestamp_seconds{{group="g",topic="{name}"}}' \
            in text
        assert "k7_topic_backpressure_group_expired{" not in text
        c.close()  # leaves with nothing acked (offsets that moved would be activity)
        old = time.time() - 3600  # the group left an hour ago (the injected clock)
        os.utime(t.path / "k7py-groups" / "g" / "state.json", (old, old))
        t.paused()
        text = generate_latest(reg).decode()
        assert f'k7_topic_group_members{{group="g",topic="{name}"}} 0.0' in text
        assert f'k7_topic_backpressure_group_expired{{group="g",topic="{name}"}} 1.0' in text
        col.close()
