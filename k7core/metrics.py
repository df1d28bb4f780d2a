"""Prometheus metrics for k7 queues (``pip install 'k7py[metrics]'``).

    from prometheus_client import start_http_server
    from k7core.metrics import K7Collector

    collector = K7Collector(queue)          # registers in prometheus_client.REGISTRY
    collector.add_group(group)              # optional: position / in flight of a live group
    start_http_server(9108)

Every scrape calls ``Queue.stats()`` (and ``ConsumerGroup.stats()`` for added groups): a
directory listing, a read of each cursor file and, for lags up to ``LAG_COUNT_LIMIT``
bytes, a frame count. Closed queues and groups are skipped. Metric names are in
``docs/operations.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._errors import MissingExtraError as _MissingExtraError

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:
    raise _MissingExtraError("k7core.metrics", "metrics", exc) from exc

from ._group import ConsumerGroup
from ._queue import Queue

_QUEUE_GAUGES = (
    ("k7_queue_earliest_offset", "First offset still in the log", "earliest_offset"),
    ("k7_queue_next_offset", "Visible end of the log (next offset)", "next_offset"),
    ("k7_queue_segments", "Segment files", "segment_count"),
    ("k7_queue_segment_bytes", "Total size of the segment files", "segment_bytes"),
    ("k7_queue_disk_bytes", "Bytes the disk holds for the queue directory", "disk_bytes"),
)


class K7Collector(Collector):
    """A collector for some queues (and optionally some of their open groups)."""

    def __init__(
        self,
        *queues: Queue,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self._queues: list[Queue] = list(queues)
        self._groups: list[ConsumerGroup] = []
        if registry is not None:
            registry.register(self)

    def add_queue(self, queue: Queue) -> None:
        self._queues.append(queue)

    def add_group(self, group: ConsumerGroup) -> None:
        """Also export this open group's position, in-flight count and data-loss jumps."""
        self._groups.append(group)

    def collect(
        self,
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        ql = ["queue"]
        gl = ["queue", "group"]
        gauges = {name: GaugeMetricFamily(name, doc, labels=ql) for name, doc, _ in _QUEUE_GAUGES}
        syncs = CounterMetricFamily("k7_queue_log_syncs", "msyncs of the log by this writer",
                                    labels=ql)
        sync_hist = HistogramMetricFamily("k7_queue_log_sync_seconds",
                                          "Durations of the writer's msyncs of the log",
                                          labels=ql)
        writers = GaugeMetricFamily("k7_queue_writer_processes",
                                    "Processes writing with writers='shared' (0: an exclusive "
                                    "writer or none)", labels=ql)
        recov = CounterMetricFamily("k7_queue_recovery_events",
                                    "What recovery did when the writer opened",
                                    labels=[*ql, "kind"])
        del_seg = CounterMetricFamily("k7_queue_retention_deleted_segments",
                                      "Segments deleted by retention since open", labels=ql)
        del_bytes = CounterMetricFamily("k7_queue_retention_deleted_bytes",
                                        "Bytes of segments deleted by retention since open",
                                        labels=ql)
        committed = GaugeMetricFamily("k7_group_committed_offset", "Committed cursor",
                                      labels=gl)
        lag = GaugeMetricFamily("k7_group_lag_bytes", "Visible end minus committed", labels=gl)
        lag_msgs = GaugeMetricFamily("k7_group_lag_messages",
                                     "Messages between committed and the end (when cheap)",
                                     labels=gl)
        owned = GaugeMetricFamily("k7_group_owned", "1 when a consumer owns the group",
                                  labels=gl)
        position = GaugeMetricFamily("k7_group_position", "Next offset poll reads", labels=gl)
        in_flight = GaugeMetricFamily("k7_group_in_flight", "Delivered, not yet acked",
                                      labels=gl)
        jumps = CounterMetricFamily("k7_group_data_loss_jumps",
                                    "Jumps to the earliest offset after retention deleted the "
                                    "next one", labels=gl)
        for q in list(self._queues):
            if q.closed:
                continue
            st = q.stats()
            name = st.path
            for metric, _, attr in _QUEUE_GAUGES:
                gauges[metric].add_metric([name], getattr(st, attr))
            if st.log_syncs is not None:
                syncs.add_metric([name], st.log_syncs)
            if st.log_sync is not None:
                sync_hist.add_metric([name], _buckets(st.log_sync.buckets),
                                     st.log_sync.total_seconds)
            writers.add_metric([name], len(st.writer_pids))
            kinds: dict[str, int] = {"torn-tail-cut": 0, "short-segment-reset": 0}
            for ev in st.recovery_events:
                kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
            for kind, n in kinds.items():
                recov.add_metric([name, kind], n)
            del_seg.add_metric([name], st.retention_deleted_segments)
            del_bytes.add_metric([name], st.retention_deleted_bytes)
            for g in st.groups:
                committed.add_metric([name, g.name], g.committed)
                lag.add_metric([name, g.name], g.lag_bytes)
                owned.add_metric([name, g.name], int(g.owned))
                if g.lag_messages is not None:
                    lag_msgs.add_metric([name, g.name], g.lag_messages)
        for grp in list(self._groups):
            if grp.closed:
                continue
            gs = grp.stats()
            labels = [str(grp.queue_path), gs.name]
            position.add_metric(labels, gs.position)
            in_flight.add_metric(labels, gs.in_flight)
            jumps.add_metric(labels, gs.data_loss_jumps)
        yield from gauges.values()
        yield from (syncs, sync_hist, writers, recov, del_seg, del_bytes, committed, lag,
                    lag_msgs, owned, position, in_flight, jumps)


def _buckets(hist: tuple[int, ...]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets from the kernel's power-of-two ones, 1 µs .. 32 s."""
    out, seen = [], sum(hist[:10])
    for k in range(10, 36):
        seen += hist[k]
        out.append((repr((1 << k) / 1e9), float(seen)))
    out.append(("+Inf", float(sum(hist))))
    return out


__all__ = ["K7Collector"]
