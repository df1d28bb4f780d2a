"""``k7 serve DIR --listen HOST:PORT``: the server under k7's own command line (click)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from k7core.beanstalk import DEFAULT_MAX_JOB_SIZE
from k7core.outbox import DEFAULT_TABLE, Relay, relay

from ._main import MAX_JOB_SIZE, announce, check_job_size, configure_logging, run
from ._server import Listen, Server, ServerConfig


@click.command("serve")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--listen", "-l", "listen", multiple=True, default=("127.0.0.1:11300",),
              show_default=True, metavar="HOST:PORT|unix:PATH",
              help="Where to listen (repeatable); port 0 picks a free one.")
@click.option("--fsync", type=click.Choice(["flush", "sync", "async"]), default="flush",
              show_default=True, help="When a reply is sent: the job is written (flush), "
              "msync'd (sync: group commit across connections), or msync'd in the "
              "background within --commit-interval (async).")
@click.option("--commit-interval", type=float, default=50e-6, show_default=True,
              help="Seconds between background msyncs (async).")
@click.option("--max-job-size", type=int, default=DEFAULT_MAX_JOB_SIZE, show_default=True,
              help=f"Largest job body in bytes (at most {MAX_JOB_SIZE}).")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="The event loop (asyncio uses uvloop if installed).")
@click.option("--metrics", metavar="HOST:PORT", default=None,
              help="Serve Prometheus metrics over HTTP there.")
@click.option("--outbox", "outboxes", multiple=True, metavar="SOURCE",
              help="Relay this transactional outbox into the served store, exactly once "
              "(repeatable): a PostgreSQL DSN or a SQLite file; see `k7 outbox`.")
@click.option("--outbox-table", default=DEFAULT_TABLE, show_default=True,
              help="The outbox table of every --outbox.")
@click.option("--verbose", "-v", count=True, help="Log connections (-vv: more).")
def serve_command(
    directory: Path, listen: tuple[str, ...], fsync: str, commit_interval: float,
    max_job_size: int, backend: str, metrics: str | None, outboxes: tuple[str, ...],
    outbox_table: str, verbose: int,
) -> None:
    """Serve the job store in DIRECTORY over the beanstalkd protocol; prints a line
    "listening on HOST:PORT" per address once ready. SIGUSR1: drain mode (puts get
    DRAINING); SIGTERM/SIGINT: stop."""
    configure_logging(verbose)
    try:
        config = ServerConfig(
            directory=directory, listen=tuple(Listen.parse(a) for a in listen), fsync=fsync,
            commit_interval=commit_interval, max_job_size=check_job_size(max_job_size))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    relays: list[Relay] = []

    def ready(server: Server) -> None:
        if metrics is not None:
            _collect(server)
        for source in outboxes:  # a bad source stops the server here, with the reason
            relays.append(relay(source, server.jobs.store, table=outbox_table))
            relays[-1].relay_once()
            relays[-1].start()
        announce(server)

    try:
        with _metrics_http(metrics) if metrics is not None else contextlib.nullcontext():
            run(config, backend, on_ready=ready)
    finally:
        for r in relays:
            r.close()


def _collect(server: Server) -> None:
    from k7core.jobs.metrics import JobStoreCollector

    from .metrics import ServerCollector

    ServerCollector(server)
    JobStoreCollector(server.jobs.store)


@contextlib.contextmanager
def _metrics_http(where: str) -> Iterator[None]:
    from prometheus_client import start_http_server

    address = Listen.parse(where, default_port=9108)
    http, thread = start_http_server(address.port, addr=address.host)
    try:
        yield
    finally:
        http.shutdown()
        thread.join()
