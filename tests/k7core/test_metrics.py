"""The Prometheus collector, scraped over HTTP on localhost."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

import k7core
from k7core.metrics import K7Collector


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def test_scrape_queue_and_group_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_port
        with k7core.Queue(tmp_path, segment_size=4096, fsync="flush",
                          retention_bytes=3 * 4096) as q:
            collector = K7Collector(q, registry=registry)
            g = q.consumer_group("workers", on_data_loss="earliest")  # at 0
            offs = q.enqueue_many([b"m" * 100] * 36 * 4)  # 4 segments; the oldest deleted
            collector.add_group(g)
            msgs = g.poll(max_batch=10)
            g.ack_many(msgs[:4])
            m = scrape(port)
            qd = (("queue", str(tmp_path)),)
            gd = (("group", "workers"), ("queue", str(tmp_path)))
            end = offs[-1] + 112
            assert m[("k7_queue_next_offset", qd)] == end
            assert m[("k7_queue_earliest_offset", qd)] == 36 * 112
            assert m[("k7_queue_segments", qd)] == 3
            assert m[("k7_queue_segment_bytes", qd)] == 3 * 4096
            assert m[("k7_queue_retention_deleted_segments_total", qd)] == 1
            assert m[("k7_queue_log_syncs_total", qd)] >= 0
            assert m[("k7_queue_log_sync_seconds_count", qd)] == m[("k7_queue_log_syncs_total", qd)]
            assert ("k7_queue_log_sync_seconds_bucket", (("le", "+Inf"), *qd)) in m
            assert m[("k7_queue_recovery_events_total", (("kind", "torn-tail-cut"), *qd))] == 0
            assert m[("k7_group_committed_offset", gd)] == msgs[4].offset
            assert m[("k7_group_lag_bytes", gd)] == end - msgs[4].offset
            assert m[("k7_group_lag_messages", gd)] == 36 * 3 - 4
            assert m[("k7_group_owned", gd)] == 1
            assert m[("k7_group_position", gd)] == msgs[-1].offset + 112
            assert m[("k7_group_in_flight", gd)] == 6
            assert m[("k7_group_data_loss_jumps_total", gd)] == 1  # it was at 0
            g.ack_many(msgs[4:])
            assert scrape(port)[("k7_group_in_flight", gd)] == 0
        m = scrape(port)  # a closed queue is skipped, the scrape still works
        assert not any(name.startswith("k7_queue_next") for name, _ in m)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
