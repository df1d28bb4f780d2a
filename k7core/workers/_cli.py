"""``k7 workers``: yoltq's REPL calls from a shell.

``stats`` and ``health`` read a worker's Prometheus endpoint: its figures (outcomes, running
jobs, run times, health) live in its process, and ``k7core.workers.metrics.WorkerCollector``
exports them. ``errors`` and ``retry`` go to the jobs' source: a job store's directory (read
as ``k7 jobs`` reads it, next to the process that owns it; ``retry`` needs its lock) or a
beanstalkd address, ours or beanstalkd itself.

``k7core.cli`` adds the ``workers`` group to ``k7``; its ``K7Error`` translation covers these
commands (``Error: <Type>: message (hint)``, exit status 3).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..beanstalk import Client, JobNotFoundError
from ..jobs._cli import (
    CommandError,
    body_json,
    echo_buried,
    human_age,
    open_store,
    read_store,
    store_dir,
    tube_arg,
)
from ._beanstalk import BeanstalkSource, drive, kick_steps
from ._codec import Codec, Envelope, PayloadError, codec, unpack
from ._source import ALL, JobView, kick_buried, view

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNKNOWN = 2
"""``k7 workers health``'s exit status: healthy, unhealthy, not checked yet (3: the endpoint
could not be read; 2 is also click's for a usage error)."""
TIMEOUT = 10.0
"""Seconds a scrape or a server's reply may take (``--timeout``)."""
PAYLOAD_CHARS = 200
"""Characters of a payload ``errors`` shows (``--width``)."""
ADDRESS = re.compile(r"[^/\s]+:\d+")
"""A bare ``host:port``: a beanstalkd address when no such directory exists."""
SERVE_HINT = ("is the worker's metrics server running? `WorkerCollector(worker)` and "
              "`prometheus_client.start_http_server(PORT)` serve it")
RETRY_HINT = ("the workers' process owns the store: retry there (Worker.retry_errors(TUBE)), "
              "or stop it first; `k7 workers errors` reads a store while it is open")
HEALTH_WORDS = {True: "healthy", False: "unhealthy", None: "not checked yet"}

Figures = dict[str, dict[str, Any]]
"""Per worker: ``healthy`` (True, False, None) and ``tubes``: per tube, the outcome
counts, ``running`` and ``seconds`` (p50 ... p99, or None: no run in the last hour)."""


# ---------------------------------------------------------------------------------- reading


def _metrics_url(url: str) -> str:
    """``url`` (http or https), or ``http://HOST:PORT/metrics`` for a bare ``HOST:PORT``."""
    if "://" not in url:
        url = f"http://{url}" + ("" if "/" in url else "/metrics")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="URL")
    return url


def _scrape(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            data: bytes = reply.read()
    except urllib.error.HTTPError as exc:
        raise CommandError(f"{url} answered HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise CommandError(f"cannot read {url}: {reason} ({SERVE_HINT})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"{url} did not answer with Prometheus text: {exc}") from exc


def read_figures(url: str, timeout: float, worker: str | None = None) -> Figures:
    """The figures of the workers a metrics endpoint exports (of ``worker`` alone if
    given), parsed by prometheus_client."""
    try:
        from prometheus_client.parser import text_string_to_metric_families

        from . import metrics
    except ImportError as exc:
        raise CommandError(str(exc)) from exc
    text = _scrape(url, timeout)
    seconds = dict(metrics.QUANTILES)
    found: Figures = {}

    def of(labels: dict[str, str]) -> dict[str, Any]:
        return found.setdefault(labels["worker"], {"healthy": None, "tubes": {}})

    def tube(labels: dict[str, str]) -> dict[str, Any]:
        tubes: dict[str, dict[str, Any]] = of(labels)["tubes"]
        return tubes.setdefault(labels["tube"], {
            **dict.fromkeys(metrics.OUTCOMES, 0), "running": 0, "seconds": None})

    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = s.labels
                if "worker" not in labels:
                    continue
                if s.name == metrics.HEALTHY:
                    of(labels)["healthy"] = None if s.value < 0 else s.value > 0
                elif "tube" not in labels:
                    continue
                elif s.name == f"{metrics.JOBS}_total" and labels.get("outcome") in \
                        metrics.OUTCOMES:
                    tube(labels)[labels["outcome"]] = int(s.value)
                elif s.name == metrics.RUNNING:
                    tube(labels)["running"] = int(s.value)
                elif s.name == metrics.PROCESSING and labels.get("quantile") in seconds:
                    t = tube(labels)
                    t["seconds"] = {**(t["seconds"] or {}), seconds[labels["quantile"]]: s.value}
    except ValueError as exc:
        raise CommandError(f"{url} did not answer with Prometheus text: {exc}") from exc
    if not found:
        raise CommandError(f"{url} exports no worker's figures (no {metrics.HEALTHY} metric; "
                           "`WorkerCollector(worker, name=...)` adds a worker's)")
    if worker is None:
        return found
    if worker not in found:
        raise CommandError(f"{url} has no worker {worker!r} (it has "
                           f"{', '.join(map(repr, sorted(found)))})")
    return {worker: found[worker]}


def health_status(found: Figures) -> int:
    """The exit status for the workers' verdicts: unhealthy if one is, else unknown if one
    was not checked yet, else healthy."""
    verdicts = [w["healthy"] for w in found.values()]
    if any(v is False for v in verdicts):
        return EXIT_UNHEALTHY
    if any(v is None for v in verdicts):
        return EXIT_UNKNOWN
    return EXIT_HEALTHY


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


# ---------------------------------------------------------------------------------- group


@click.group("workers")
def workers() -> None:
    """Workers (k7core.workers): figures and health from a worker's metrics endpoint;
    buried jobs with their errors, and retries, from its job source.

    URL: a worker's Prometheus endpoint (http://HOST:PORT/metrics, or HOST:PORT).
    SOURCE: a job store's directory, or a beanstalkd address (beanstalk://HOST:PORT,
    HOST:PORT, unix:/PATH).
    """


_url = click.argument("url", callback=lambda ctx, param, value: _metrics_url(value))
_worker = click.option("--worker", "worker", metavar="NAME",
                       help="Only the worker exported under this name (its `worker` label).")
_timeout = click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
                        default=TIMEOUT, show_default=True,
                        help="Seconds the endpoint or the server may take to answer.")


# ---------------------------------------------------------------------------------- stats


@workers.command()
@_url
@_worker
@_timeout
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def stats(url: str, worker: str | None, timeout: float, as_json: bool) -> None:
    """Per worker and tube: jobs by outcome since the worker started (ok, retried_ok,
    failures, buried, deferred), jobs running now, run-time quantiles over the last hour,
    and the worker's health."""
    found = read_figures(url, timeout, worker)
    if as_json:
        click.echo(json.dumps({"url": url, "workers": found}, indent=2))
        return
    out = Console(width=max(110, shutil.get_terminal_size().columns))
    for name, w in found.items():
        t = Table("tube", "ok", "retried ok", "failures", "buried", "deferred", "running",
                  "p50", "p90", "p95", "p99",
                  title=f"worker {escape(name)}: {HEALTH_WORDS[w['healthy']]}")
        for col in t.columns[1:]:
            col.justify = "right"
        for tube, f in sorted(w["tubes"].items()):
            times = f["seconds"] or {}
            t.add_row(escape(tube), *(f"{f[k]:,}" for k in
                                      ("ok", "retried_ok", "failures", "buried", "deferred",
                                       "running")),
                      *(_duration(times.get(k)) for k in ("p50", "p90", "p95", "p99")))
        if w["tubes"]:
            out.print(t)
        else:
            out.print(f"[bold]worker {escape(name)}[/bold]: {HEALTH_WORDS[w['healthy']]}; "
                      "no job handled yet")


@workers.command()
@_url
@_worker
@_timeout
def health(url: str, worker: str | None, timeout: float) -> None:
    """Exit status 0 when healthy, 1 when unhealthy, 2 when not checked yet (a worker's
    health is unknown until its first check); one line says which. With several workers
    at URL: 1 if one is unhealthy, else 2 if one is unknown. 3: the endpoint could not be
    read. For container health probes."""
    found = read_figures(url, timeout, worker)
    status = health_status(found)
    word = {EXIT_HEALTHY: "healthy", EXIT_UNHEALTHY: "unhealthy", EXIT_UNKNOWN: "unknown"}
    click.echo(f"{word[status]}: " + ", ".join(
        f"{name} {HEALTH_WORDS[w['healthy']]}" for name, w in sorted(found.items())))
    click.get_current_context().exit(status)


# ---------------------------------------------------------------------------------- sources


def _source(spec: str) -> Path | str:
    """SOURCE: a job store's directory (checked), or a beanstalkd address."""
    if spec.startswith(("beanstalk://", "unix:")) or (
            ADDRESS.fullmatch(spec) and not Path(spec).exists()):
        return spec
    return store_dir(spec)


def _stored(job: JobView) -> JobView:
    """A job of a store's directory with the errors its envelope carries first (those a
    worker recorded through a beanstalkd server over that store), then the store's."""
    try:
        older = unpack(job.body).errors
    except PayloadError:
        return job
    return job._replace(errors=older + job.errors) if older else job


def buried_jobs(source: Path | str, tube: str, timeout: float) -> tuple[list[JobView], float]:
    """The buried jobs of ``tube`` (oldest buried first) and the time they were read at."""
    if isinstance(source, Path):
        look = read_store(source)
        return [_stored(view(j)) for j in look.state.machine.errors(tube)], look.now
    remote = BeanstalkSource(source, timeout=timeout)
    try:
        return remote.buried(tube), time.time()
    finally:
        remote.close()


def _row(job: JobView, decoder: Codec | None, now: float) -> dict[str, Any]:
    try:
        envelope = unpack(job.body)
    except PayloadError:
        envelope = Envelope(job.body, {}, (), None)
    row = {"id": job.id, "tube": job.tube, "priority": job.priority,
           "age": max(0.0, now - job.created_at), "context": dict(envelope.context),
           "errors": list(job.errors)}
    if decoder is not None:
        try:
            return {**row, "payload": decoder.decode(envelope.payload)}
        except Exception:
            pass
    return {**row, **body_json(envelope.payload)}


def _cut(text: str, width: int) -> str:
    if not width or len(text) <= width:
        return text
    return f"{text[:width]}… ({len(text):,} characters)"


def _payload_line(row: dict[str, Any], codec_name: str, width: int) -> str:
    if "payload" in row:
        shown = json.dumps(row["payload"], ensure_ascii=False, default=repr)
        return f"  payload: {_cut(shown, width)}"
    if "body" in row:
        how = "body" if codec_name == "raw" else f"body (not {codec_name})"
        return f"  {how}: {_cut(repr(row['body']), width)}"
    return f"  body (binary, base64): {_cut(row['body_base64'], width)}"


# ---------------------------------------------------------------------------------- errors


@workers.command()
@click.argument("source")
@click.argument("tube", callback=tube_arg)
@click.option("--codec", "codec_name", type=click.Choice(["json", "msgpack", "raw"]),
              default="json", show_default=True,
              help="How payloads are decoded (raw: the body's text; pickled payloads are "
                   "never unpickled here).")
@click.option("--width", type=click.IntRange(min=0), default=PAYLOAD_CHARS, show_default=True,
              help="Characters of a payload shown (0: all).")
@click.option("--brief", is_flag=True, help="Each error's first line (no traceback).")
@_timeout
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def errors(source: str, tube: str, codec_name: str, width: int, brief: bool, timeout: float,
           as_json: bool) -> None:
    """The buried jobs of TUBE (buried longest ago first): payload, context and numbered
    errors with tracebacks (newest last), as Worker.errors gives them. A store's directory
    is only read; over a beanstalkd server each buried job is reserved by id and buried
    again (its buries count grows by one)."""
    where = _source(source)
    decoder = None if codec_name == "raw" else codec(codec_name)
    found, now = buried_jobs(where, tube, timeout)
    rows = [_row(j, decoder, now) for j in found]
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False, default=repr))
        return
    echo_buried(tube, [(
        f"job {row['id']}  pri {row['priority']}  age {human_age(row['age'])}  "
        f"errors {len(row['errors'])}",
        [_payload_line(row, codec_name, width)] + (
            ["  context: " + json.dumps(row["context"], ensure_ascii=False)]
            if row["context"] else []),
        [e.split("\n", 1)[0] for e in row["errors"]] if brief else row["errors"],
    ) for row in rows])


# ---------------------------------------------------------------------------------- retry


def _check_buried(job_id: int, found: tuple[str, str] | None, tube: str, where: str) -> None:
    """``found``: the job's tube and state (None: no such job)."""
    if found is None:
        raise CommandError(f"no job {job_id} in {where} (`k7 workers errors` lists the "
                           "buried ones with their ids)")
    job_tube, state = found
    if job_tube != tube:
        raise CommandError(f"job {job_id} is in tube {job_tube!r}, not {tube!r}")
    if state != "buried":
        raise CommandError(f"job {job_id} is {state}: only a buried job is retried")


def _retry_store(d: Path, tube: str, job_id: int | None) -> int:
    with open_store(str(d), hint=RETRY_HINT) as store:
        if job_id is None:
            return kick_buried(store, tube, ALL)
        job = store.peek(job_id)
        _check_buried(job_id, None if job is None else (job.tube, job.state.value), tube,
                      str(d))
        store.kick_job(job_id)
        return 1


def _retry_remote(address: str, tube: str, job_id: int | None, timeout: float) -> int:
    with Client(address, timeout=timeout) as client:
        if job_id is None:
            return drive(client, kick_steps(tube, ALL))
        try:
            st = client.stats_job(job_id)
        except JobNotFoundError:
            found = None
        else:
            found = (str(st["tube"]), str(st["state"]))
        _check_buried(job_id, found, tube, address)
        client.kick_job(job_id)
        return 1


@workers.command()
@click.argument("source")
@click.argument("tube", callback=tube_arg)
@click.option("--all", "every", is_flag=True, help="Every buried job of TUBE.")
@click.option("--job", "job_id", metavar="ID", type=click.IntRange(min=1),
              help="The buried job ID (an id `k7 workers errors` shows).")
@_timeout
def retry(source: str, tube: str, every: bool, job_id: int | None, timeout: float) -> None:
    """Move buried jobs of TUBE back to ready (Worker.retry_errors; --job: one of them):
    the workers run them again, their errors kept. A store's directory needs its lock (the
    workers' process must not have it open); a beanstalkd server is asked over the
    network."""
    if every == (job_id is not None):
        raise click.UsageError("give --all or --job ID")
    where = _source(source)
    if isinstance(where, Path):
        n = _retry_store(where, tube, job_id)
    else:
        n = _retry_remote(where, tube, job_id, timeout)
    if job_id is not None:
        click.echo(f"retried job {job_id} of tube {tube!r}: ready now")
    elif n:
        click.echo(f"retried {n:,} buried job(s) of tube {tube!r}: ready now")
    else:
        click.echo(f"no buried job in tube {tube!r}: nothing retried")


# ---------------------------------------------------------------------------------- groups


@workers.command()
@click.argument("store", type=click.Path(file_okay=False, path_type=Path))
@click.argument("tube", callback=tube_arg)
@click.argument("group", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the progress as JSON.")
def progress(store: Path, tube: str, group: str | None, as_json: bool) -> None:
    """How far the job groups of TUBE are (yoltq's job-group-progress): per group, its
    live jobs by state and how many are done; GROUP: that group only. STORE is a job
    store's directory, only read (the workers' process may have it open)."""
    machine = read_store(store_dir(str(store))).state.machine
    names = [group] if group is not None else machine.groups(tube)
    found = {name: machine.group_progress(tube, name) for name in names}
    if as_json:
        click.echo(json.dumps(found, indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo(f"no job group in tube {tube!r}")
        return
    columns = ["ready", "delayed", "reserved", "buried", "waiting", "done"]
    table = Table("group", *columns, title=f"tube {escape(tube)}")
    for name, counts in found.items():
        table.add_row(escape(name), *(f"{counts[c]:,}" for c in columns))
    Console(width=max(100, shutil.get_terminal_size().columns)).print(table)


__all__ = ["workers"]
