"""k7core.workers.metrics: what a scrape of a worker gives."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from k7core.workers import ManualClock, MemorySource, Worker
from k7core.workers.metrics import WorkerCollector


def test_a_scrape_shows_outcomes_quantiles_and_health() -> None:
    clock = ManualClock()
    w = Worker(MemorySource(clock), grace=0.0)
    w.consumer("ok", lambda p: p)
    w.consumer("bad", lambda p: 1 / 0, max_retries=1)
    registry = CollectorRegistry()
    WorkerCollector(w, name="billing", registry=registry)
    assert 'k7_worker_healthy{worker="billing"} -1.0' in generate_latest(registry).decode()
    w.put("bad", 1)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            w.consume("bad")
        clock.advance(3600)
    for i in range(3):  # after the clock moved: within the hour the quantiles cover
        w.put("ok", i)
        w.consume("ok")
    w.check_health()
    text = generate_latest(registry).decode()
    assert 'k7_worker_jobs_total{outcome="ok",tube="ok",worker="billing"} 3.0' in text
    assert 'k7_worker_jobs_total{outcome="failures",tube="bad",worker="billing"} 2.0' in text
    assert 'k7_worker_jobs_total{outcome="buried",tube="bad",worker="billing"} 1.0' in text
    assert 'k7_worker_processing_seconds{quantile="0.99",tube="ok",worker="billing"}' in text
    assert 'k7_worker_healthy{worker="billing"} 0.0' in text
