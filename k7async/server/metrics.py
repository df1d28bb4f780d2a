"""Prometheus metrics for beanstalkd servers (``pip install 'k7py[metrics]'``).

    ServerCollector(server)            # registers in prometheus_client.REGISTRY

Connections, commands by type, waiting reserves and drain mode; the jobs by tube and state
are ``k7core.jobs.metrics.JobStoreCollector``'s (``k7 serve --metrics`` registers both).
Metric names are in ``docs/server.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

from k7core.beanstalk import Op as _Op

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:
    raise ModuleNotFoundError(
        "k7async.server.metrics needs prometheus_client: pip install 'k7py[metrics]'",
        name=exc.name) from exc

from ._server import Server


class ServerCollector(Collector):
    """A collector for one server: ``k7_server_connections`` (open),
    ``k7_server_connections_total``, ``k7_server_commands_total{command}``,
    ``k7_server_waiting`` (reserves waiting for a job) and ``k7_server_draining``."""

    def __init__(self, server: Server, registry: CollectorRegistry | None = REGISTRY) -> None:
        self._server = server
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self._server.state
        sessions = list(state.sessions)
        yield GaugeMetricFamily("k7_server_connections", "Open client connections",
                                value=len(sessions))
        yield CounterMetricFamily("k7_server_connections", "Connections accepted since start",
                                  value=state.total_connections)
        commands = CounterMetricFamily("k7_server_commands", "Commands received, by type",
                                       labels=["command"])
        for op in _Op:
            if op is not _Op.UNKNOWN:
                commands.add_metric([op.word], state.commands[op])
        yield commands
        yield GaugeMetricFamily("k7_server_waiting", "Reserves waiting for a job",
                                value=sum(s.waiting for s in sessions))
        yield GaugeMetricFamily("k7_server_draining", "1 in drain mode (SIGUSR1)",
                                value=int(state.draining))


__all__ = ["ServerCollector"]
