"""Prometheus metrics for topics (``pip install 'k7py[metrics]'``).

    from prometheus_client import start_http_server
    from k7core.topics.metrics import TopicCollector

    TopicCollector(topic)                   # registers in prometheus_client.REGISTRY
    start_http_server(9108)

Every scrape reads each topic's directory through a read-only Topic of the collector's own
(partition ends, every group's members, owners and lag per partition) and the
back-pressure state of the Topic passed in as its last reading (so the scrape never calls
into a Topic that another thread uses). Metric names are in ``docs/topics.md``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from .._errors import K7Error as _K7Error
from .._errors import MissingExtraError as _MissingExtraError

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:
    raise _MissingExtraError("k7core.topics.metrics", "metrics", exc) from exc

from ._topic import Topic

__all__ = ["TopicCollector"]


class TopicCollector(Collector):
    """A collector for some topics: partition ends, groups (generation, members, owner and
    lag of each partition) and back-pressure (watched lag, marks, paused, throttle ratio,
    pauses, seconds blocked)."""

    def __init__(self, *topics: Topic, registry: CollectorRegistry | None = REGISTRY) -> None:
        self._topics: list[Topic] = list(topics)
        self._readers: dict[str, Topic] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def add_topic(self, topic: Topic) -> None:
        with self._lock:
            self._topics.append(topic)

    def close(self) -> None:
        """Close the collector's read-only topics (reopened by the next scrape)."""
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        g = GaugeMetricFamily
        end = g("k7_topic_partition_next_offset", "The visible end of each partition",
                labels=["topic", "partition"])
        gen = g("k7_topic_group_generation", "The group's membership generation",
                labels=["topic", "group"])
        members = g("k7_topic_group_members", "Live members of the group",
                    labels=["topic", "group"])
        owner = g("k7_topic_group_partition_held", "1 for the member holding the partition",
                  labels=["topic", "group", "partition", "member"])
        active = g("k7_topic_group_last_active_timestamp_seconds",
                   "The group's last activity: heartbeat, generation or offsets moving",
                   labels=["topic", "group"])
        lag_b = g("k7_topic_group_lag_bytes", "Bytes between the group's cursor and the end",
                  labels=["topic", "group", "partition"])
        lag_m = g("k7_topic_group_lag_messages",
                  "Records between the group's cursor and the end (when countable)",
                  labels=["topic", "group", "partition"])
        bp_lag = g("k7_topic_backpressure_lag", "The lag back-pressure watches, in its unit",
                   labels=["topic", "unit"])
        bp_high = g("k7_topic_backpressure_high", "The high watermark", labels=["topic", "unit"])
        bp_low = g("k7_topic_backpressure_low", "The low watermark", labels=["topic", "unit"])
        bp_paused = g("k7_topic_backpressure_paused", "1 while sends are paused",
                      labels=["topic"])
        bp_ratio = g("k7_topic_backpressure_throttle_ratio",
                     "0 below the low mark, 1 at the high mark or paused", labels=["topic"])
        bp_expired = g("k7_topic_backpressure_group_expired",
                       "1 for a group inactive for group_expiry: not counted",
                       labels=["topic", "group"])
        bp_pauses = CounterMetricFamily("k7_topic_backpressure_pauses",
                                        "Times sends went from running to paused",
                                        labels=["topic"])
        bp_blocked = CounterMetricFamily("k7_topic_backpressure_blocked_seconds",
                                         "Seconds sends spent waiting for the lag to fall",
                                         labels=["topic"])
        with self._lock:
            for topic in list(self._topics):
                if topic.closed:
                    continue
                name = str(topic.path)
                ps = topic.pressure_stats(refresh=False)
                if ps is not None:
                    bp_lag.add_metric([name, ps.unit], ps.lag)
                    bp_high.add_metric([name, ps.unit], ps.high)
                    bp_low.add_metric([name, ps.unit], ps.low)
                    bp_paused.add_metric([name], 1.0 if ps.paused else 0.0)
                    bp_ratio.add_metric([name], ps.throttle_ratio)
                    bp_pauses.add_metric([name], ps.pauses)
                    bp_blocked.add_metric([name], ps.blocked_seconds)
                    for gone in ps.expired_groups:
                        bp_expired.add_metric([name, gone], 1.0)
                try:
                    reader = self._readers.get(name)
                    if reader is None:
                        reader = self._readers[name] = Topic(topic.path, readonly=True)
                    st = reader.stats()
                except _K7Error:
                    continue
                for p in st.partitions:
                    end.add_metric([name, str(p.partition)], p.next_offset)
                for grp in st.groups:
                    gen.add_metric([name, grp.name], grp.generation)
                    members.add_metric([name, grp.name], len(grp.members))
                    if grp.last_active is not None:
                        active.add_metric([name, grp.name], grp.last_active)
                    for pl in grp.partitions:
                        part = str(pl.partition)
                        lag_b.add_metric([name, grp.name, part], pl.lag_bytes)
                        if pl.lag_messages is not None:
                            lag_m.add_metric([name, grp.name, part], pl.lag_messages)
                        if pl.holder is not None:
                            owner.add_metric([name, grp.name, part, pl.holder], 1.0)
        yield from (end, gen, members, active, owner, lag_b, lag_m, bp_lag, bp_high, bp_low,
                    bp_paused, bp_ratio, bp_expired, bp_pauses, bp_blocked)
