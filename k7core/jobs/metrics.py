"""Prometheus metrics for job stores (``pip install 'k7py[metrics]'``).

    from prometheus_client import start_http_server
    from k7core.jobs.metrics import JobStoreCollector

    JobStoreCollector(store)                # registers in prometheus_client.REGISTRY
    start_http_server(9108)

Every scrape calls ``JobStore.overview()`` and ``JobStore.counters()`` of each store (the
store's lock twice, briefly; the oldest ready job's age scans each tube's ready jobs). Closed
stores are skipped. Metric names are in ``docs/operations.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

from .._errors import ClosedError as _ClosedError
from .._errors import MissingExtraError as _MissingExtraError

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:
    raise _MissingExtraError("k7core.jobs.metrics", "metrics", exc) from exc

from ._machine import JobState as _JobState
from ._store import JobStore

_COUNTERS = (
    ("puts", "Jobs stored since the store opened (a put that found its key's job stores none)"),
    ("reserves", "Reservations since the store opened (reserve and reserve_job)"),
    ("deletes", "Jobs deleted since the store opened"),
    ("releases", "Releases since the store opened"),
    ("buries", "Buries since the store opened"),
    ("kicks", "Jobs kicked to ready since the store opened"),
    ("timeouts", "Reservations whose time-to-run ran out since the store opened"),
)


class JobStoreCollector(Collector):
    """A collector for some job stores: live jobs per tube and state, the age of each tube's
    oldest ready job, and the store's operations since open."""

    def __init__(
        self,
        *stores: JobStore,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self._stores: list[JobStore] = list(stores)
        if registry is not None:
            registry.register(self)

    def add_store(self, store: JobStore) -> None:
        self._stores.append(store)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        jobs = GaugeMetricFamily("k7_jobs", "Live jobs by tube and state",
                                 labels=["store", "tube", "state"])
        age = GaugeMetricFamily("k7_jobs_oldest_ready_age_seconds",
                                "Seconds since the oldest ready job of the tube was put "
                                "(0 when it has no ready job)", labels=["store", "tube"])
        counters = {name: CounterMetricFamily(f"k7_jobs_{name}", doc, labels=["store"])
                    for name, doc in _COUNTERS}
        for store in list(self._stores):
            if store.closed:
                continue
            try:
                tubes = store.overview()
                counts = store.counters()
            except _ClosedError:  # closed by another thread since the check
                continue
            name = str(store.path)
            for tube, ov in tubes.items():
                for state in _JobState:
                    jobs.add_metric([name, tube, state.value], getattr(ov, state.value))
                age.add_metric([name, tube], ov.oldest_ready_age or 0.0)
            for key, family in counters.items():
                family.add_metric([name], counts[key])
        yield jobs
        yield age
        yield from counters.values()


__all__ = ["JobStoreCollector"]
