"""Prometheus metrics for workers (``pip install 'k7py[metrics]'``).

    from prometheus_client import start_http_server
    from k7core.workers.metrics import WorkerCollector

    WorkerCollector(worker, name="billing")   # a Worker or a k7async.AsyncWorker
    start_http_server(9108)

Jobs by tube and state come from the store's own collector
(``k7core.jobs.metrics.JobStoreCollector``); this one adds what the worker knows: outcomes
since start, running jobs, run-time quantiles over the last hour, and health. Metric names
are in ``docs/workers.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from .._errors import MissingExtraError as _MissingExtraError

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        SummaryMetricFamily,
    )
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:
    raise _MissingExtraError("k7core.workers.metrics", "metrics", exc) from exc

OUTCOMES = ("ok", "retried_ok", "failures", "buried", "deferred")
"""The ``outcome`` label's values (``retry_stats()``'s keys)."""
QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.95", "p95"), ("0.99", "p99"))
"""The ``quantile`` label's values, and ``processing_time_stats()``'s keys for them."""
JOBS = "k7_worker_jobs"
RUNNING = "k7_worker_running"
PROCESSING = "k7_worker_processing_seconds"
HEALTHY = "k7_worker_healthy"
"""The metric families' names (``k7 workers stats`` reads them back)."""


class Figures(Protocol):
    """What the collector reads of a worker (both faces have it)."""

    def retry_stats(self) -> dict[str, dict[str, float]]: ...
    def processing_time_stats(self) -> dict[str, dict[str, float]]: ...
    def running(self) -> dict[str, int]: ...
    def healthy(self) -> bool | None: ...


class WorkerCollector(Collector):
    """A collector for one worker, labelled ``worker=name``."""

    def __init__(self, worker: Figures, *, name: str = "worker",
                 registry: CollectorRegistry | None = REGISTRY) -> None:
        self._worker = worker
        self._name = name
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | SummaryMetricFamily]:
        w, name = self._worker, self._name
        jobs = CounterMetricFamily(
            JOBS, "Jobs handled since the worker started, by outcome (ok, "
            "retried_ok: ok after failing before, failures: runs that raised, buried, "
            "deferred: held by the tube's gate)", labels=["worker", "tube", "outcome"])
        for tube, figures in w.retry_stats().items():
            for outcome in OUTCOMES:
                jobs.add_metric([name, tube, outcome], figures.get(outcome, 0.0))
        running = GaugeMetricFamily(RUNNING, "Jobs running now",
                                    labels=["worker", "tube"])
        for tube, n in w.running().items():
            running.add_metric([name, tube], n)
        times = GaugeMetricFamily(
            PROCESSING, "Run time quantiles over the last hour",
            labels=["worker", "tube", "quantile"])
        for tube, st in w.processing_time_stats().items():
            for q, key in QUANTILES:
                times.add_metric([name, tube, q], st[key])
        healthy = GaugeMetricFamily(HEALTHY,
                                    "1 healthy, 0 unhealthy, -1 not checked yet",
                                    labels=["worker"])
        verdict = w.healthy()
        healthy.add_metric([name], -1 if verdict is None else int(verdict))
        yield jobs
        yield running
        yield times
        yield healthy


__all__ = ["Figures", "WorkerCollector"]
