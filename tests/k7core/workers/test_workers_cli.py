"""``k7 workers``: stats and health read from a real worker's Prometheus endpoint (a
``prometheus_client`` HTTP server in this process), errors and retry against a job store's
directory and against beanstalkd servers over the network (ours and Debian's real one)."""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry, start_http_server

from k7core.beanstalk import Client
from k7core.cli import cli
from k7core.jobs import JobState, JobStore
from k7core.workers import Backoff, ManualClock, MemorySource, Worker
from k7core.workers.metrics import WorkerCollector
from tests._queuehelp import k7, wait_until
from tests.k7async.server._servers import ServerProcess, free_port, serving

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
NOW = Backoff(base=0.0, cap=0.0)  # failures retried at once


def run(*args: str | int | Path) -> Result:
    return CliRunner().invoke(cli, ["workers", *map(str, args)])


def ok(r: Result) -> str:
    assert r.exit_code == 0, (r.exit_code, r.output, r.exception)
    return r.output


def failed(r: Result, code: int = 3) -> str:
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    return r.output


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def url(registry: CollectorRegistry) -> Iterator[str]:
    """A real metrics endpoint for ``registry``, on a free port of 127.0.0.1."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def cells(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    (line,) = [x for x in text.splitlines() if x.startswith(f"│ {first} ")]
    return [c.strip() for c in line.split("│")[1:-1]]


# ---------------------------------------------------------------------------------- stats


def test_stats_shows_a_live_workers_outcomes_running_jobs_and_run_times(
        tmp_path: Path, registry: CollectorRegistry, url: str) -> None:
    slow_started, slow_go = threading.Event(), threading.Event()
    with JobStore(tmp_path / "jobs") as store, \
            Worker(store, backoff=NOW, max_retries=1) as w:
        WorkerCollector(w, name="billing", registry=registry)

        @w.consumer("charge")
        def charge(p: dict[str, int]) -> None:
            raise ValueError(f"card {p['n']} declined")

        @w.consumer("mail")
        def mail(p: int) -> int:
            return p

        @w.consumer("slow")
        def slow(p: int) -> None:
            slow_started.set()
            assert slow_go.wait(30)

        for n in range(3):
            w.put("charge", {"n": n})
        for n in range(5):
            w.put("mail", n)
        w.put("slow", 0)
        assert slow_started.wait(30)
        try:
            # each charge runs twice (max_retries=1), then is buried; a job is counted after
            # its consumer returns, and nothing signals that: the worker's counts are read
            wait_until(lambda: w.retry_stats().get("charge", {}).get("buried") == 3 and
                       w.retry_stats().get("mail", {}).get("ok") == 5, 30, "the jobs' ends")
            got = json.loads(ok(run("stats", url, "--json")))
            text = ok(run("stats", url))
        finally:
            slow_go.set()
    assert got["url"] == url and list(got["workers"]) == ["billing"]
    billing = got["workers"]["billing"]
    assert billing["healthy"] in (None, True)  # not checked yet, or in its start-up grace
    tubes = billing["tubes"]
    assert {k: v for k, v in tubes["charge"].items() if k != "seconds"} == {
        "ok": 0, "retried_ok": 0, "failures": 6, "buried": 3, "deferred": 0, "running": 0}
    assert tubes["charge"]["seconds"] is None  # no job of it succeeded
    assert tubes["mail"]["ok"] == 5 and tubes["mail"]["failures"] == 0
    q = tubes["mail"]["seconds"]
    assert list(q) == ["p50", "p90", "p95", "p99"] and 0 < q["p50"] <= q["p90"] <= q["p99"] < 30
    assert tubes["slow"]["running"] == 1 and tubes["slow"]["ok"] == 0
    assert "worker billing: " in text
    assert cells(text, "charge") == ["charge", "0", "0", "6", "3", "0", "0", "-", "-", "-", "-"]
    assert cells(text, "slow")[:7] == ["slow", "0", "0", "0", "0", "0", "1"]
    mail_row = cells(text, "mail")
    assert mail_row[:7] == ["mail", "5", "0", "0", "0", "0", "0"]
    assert all(c.endswith(("µs", "ms", " s")) for c in mail_row[7:])


def test_stats_of_several_workers_one_of_them_and_bad_endpoints(
        registry: CollectorRegistry, url: str) -> None:
    a, b = Worker(MemorySource()), Worker(MemorySource())
    WorkerCollector(a, name="billing", registry=registry)
    WorkerCollector(b, name="mail", registry=registry)
    a.consumer("t", lambda p: p)
    a.put("t", 1)
    a.consume("t")
    got = json.loads(ok(run("stats", url, "--json")))["workers"]
    assert sorted(got) == ["billing", "mail"]
    assert got["billing"]["tubes"]["t"]["ok"] == 1 and got["mail"]["tubes"] == {}
    assert "worker mail: not checked yet; no job handled yet" in ok(run("stats", url))
    only = json.loads(ok(run("stats", url, "--worker", "mail", "--json")))["workers"]
    assert list(only) == ["mail"]
    host_port = url.removeprefix("http://").removesuffix("/metrics")
    assert json.loads(ok(run("stats", host_port, "--json")))["url"] == url
    out = failed(run("stats", url, "--worker", "nosuch"))
    assert "has no worker 'nosuch' (it has 'billing', 'mail')" in out
    out = failed(run("stats", f"http://127.0.0.1:{free_port()}/metrics", "--timeout", "5"))
    assert "cannot read http://127.0.0.1:" in out and "start_http_server" in out
    out = failed(run("stats", "file:///etc/passwd"), 2)
    assert "is not an http(s) URL" in out


def test_an_endpoint_without_workers_is_an_error(url: str) -> None:
    out = failed(run("stats", url))
    assert "exports no worker's figures (no k7_worker_healthy metric" in out


# ---------------------------------------------------------------------------------- health


def test_health_exit_status_unknown_healthy_unhealthy(registry: CollectorRegistry,
                                                      url: str) -> None:
    clock = ManualClock()
    good = Worker(MemorySource(clock), grace=0.0)
    bad = Worker(MemorySource(clock), grace=0.0, allowed_error_time=60.0, max_retries=1,
                 backoff=NOW)
    WorkerCollector(good, name="good", registry=registry)
    WorkerCollector(bad, name="bad", registry=registry)
    assert failed(run("health", url), 2) == "unknown: bad not checked yet, good not checked yet\n"
    good.check_health()
    assert failed(run("health", url), 2) == "unknown: bad not checked yet, good healthy\n"
    assert ok(run("health", url, "--worker", "good")) == "healthy: good healthy\n"
    bad.consumer("t", lambda p: 1 / 0)
    bad.put("t", 1)
    for _ in range(2):  # buried after its retry
        with pytest.raises(ZeroDivisionError):
            bad.consume("t")
    assert bad.check_health() is True  # the failing job is younger than allowed_error_time
    assert ok(run("health", url)) == "healthy: bad healthy, good healthy\n"
    clock.advance(61)
    assert bad.check_health() is False
    assert failed(run("health", url), 1) == "unhealthy: bad unhealthy, good healthy\n"
    assert ok(run("health", url, "--worker", "good")) == "healthy: good healthy\n"
    # the console script, as a container probe runs it: the same exit status
    r = k7("workers", "health", url)
    assert r.returncode == 1 and r.stdout == b"unhealthy: bad unhealthy, good healthy\n"
    assert k7("workers", "health", url, "--worker", "good").returncode == 0
    down = k7("workers", "health", f"127.0.0.1:{free_port()}")
    assert down.returncode == 3 and b"cannot read" in down.stderr


# ---------------------------------------------------------------------------------- errors, retry


def bury_two(w: Worker, tube: str = "charge") -> list[int]:
    """Put two jobs the consumer fails and run each until it is buried (max_retries=1),
    with ``w`` not started (the test mode's ``consume``, on any source): their ids."""
    @w.consumer(tube, max_retries=1, backoff=NOW, context=[request_id])
    def charge(p: dict[str, Any]) -> None:
        raise ValueError(f"card {p['card']} declined for {request_id.get()}")

    request_id.set("req-7")
    for card in ("visa", "amex"):
        w.put(tube, {"card": card, "note": "x" * 300})
    for _ in range(4):
        with pytest.raises(ValueError):
            w.consume(tube)
    return [j.id for j in w.errors(tube)]


def check_errors(source: str | Path, tube: str = "charge") -> list[dict[str, Any]]:
    """``errors`` of two jobs buried by ``bury_two``, checked in each form; the JSON rows."""
    rows: list[dict[str, Any]] = json.loads(ok(run("errors", source, tube, "--json")))
    assert [r["payload"]["card"] for r in rows] == ["visa", "amex"]  # buried first, first
    for r in rows:
        assert r["tube"] == tube and r["context"] == {"request_id": "req-7"}
        assert r["priority"] == 1024 and 0 <= r["age"] < 600
        assert [e.splitlines()[0] for e in r["errors"]] == [
            f"#1 ValueError: card {r['payload']['card']} declined for req-7",
            f"#2 ValueError: card {r['payload']['card']} declined for req-7"]  # newest last
        assert '  File "' in r["errors"][0]  # its traceback
    text = ok(run("errors", source, tube)).splitlines()
    assert text[0].startswith(f"job {rows[0]['id']}  pri 1024  age ")
    assert text[0].endswith("  errors 2")
    assert text[1].startswith('  payload: {"card": "visa", "note": "xxx')
    assert text[1].endswith("… (328 characters)") and len(text[1]) < 260  # cut at 200
    assert text[2] == '  context: {"request_id": "req-7"}'
    assert text[3] == "  - #1 ValueError: card visa declined for req-7"
    assert text[-1] == f"2 buried job(s) in tube {tube!r}"
    brief = ok(run("errors", source, tube, "--brief", "--width", "0")).splitlines()
    assert brief[:5] == [
        brief[0], '  payload: {"card": "visa", "note": "' + "x" * 300 + '"}',
        '  context: {"request_id": "req-7"}',
        "  - #1 ValueError: card visa declined for req-7",
        "  - #2 ValueError: card visa declined for req-7"]
    assert len(brief) == 11
    raw = ok(run("errors", source, tube, "--codec", "raw", "--width", "20")).splitlines()
    assert raw[1] == """  body: '{"card":"visa","not… (327 characters)"""
    assert ok(run("errors", source, "nosuch")) == "no buried job in tube 'nosuch'\n"
    return rows


def check_retry(source: str | Path, ids: list[int]) -> None:
    """``retry`` of the two jobs ``bury_two`` buried, one and then the other, when a
    delayed job waits in the tube too (a retry of all kicks no delayed job)."""
    assert ok(run("retry", source, "charge", "--job", ids[0])) == (
        f"retried job {ids[0]} of tube 'charge': ready now\n")
    assert "is ready: only a buried job is retried" in failed(
        run("retry", source, "charge", "--job", ids[0]))
    assert f"job {ids[1]} is in tube 'charge', not 'other'" in failed(
        run("retry", source, "other", "--job", ids[1]))
    assert "no job 999999 in" in failed(run("retry", source, "charge", "--job", "999999"))
    assert ok(run("retry", source, "charge", "--all")) == (
        "retried 1 buried job(s) of tube 'charge': ready now\n")
    assert ok(run("retry", source, "charge", "--all")) == (
        "no buried job in tube 'charge': nothing retried\n")
    assert ok(run("retry", source, "nosuch", "--all")) == (
        "no buried job in tube 'nosuch': nothing retried\n")


def test_errors_and_retry_on_a_store_directory(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    with JobStore(d) as store:
        w = Worker(store)
        ids = bury_two(w)
        w.put("charge", {"card": "later"}, delay=3600)
        rows = check_errors(d)  # next to the live store: read only
        assert [r["id"] for r in rows] == ids
        out = failed(run("retry", d, "charge", "--all"))
        assert "QueueLockedError" in out and "Worker.retry_errors(TUBE)" in out
        w.close()
    check_retry(d, ids)
    with JobStore(d) as store:
        assert [store.peek(i).state for i in ids] == [JobState.READY] * 2  # type: ignore[union-attr]
        assert len(store.peek(ids[0]).errors) == 2  # type: ignore[union-attr]
        assert store.tube_stats("charge")["current-jobs-delayed"] == 1
        fixed = threading.Semaphore(0)
        with Worker(store) as w:
            w.consumer("charge", lambda p: fixed.release())
            assert fixed.acquire(timeout=30) and fixed.acquire(timeout=30)
    assert failed(run("retry", d, "charge"), 2).endswith("give --all or --job ID\n")
    assert "no such directory" in failed(run("errors", tmp_path / "nothere", "charge"))
    assert "is not a k7 job store" in failed(run("errors", tmp_path, "charge"))
    assert "Invalid value for 'TUBE'" in failed(run("errors", d, "bad tube!"), 2)


def test_progress_reads_the_groups_of_a_live_store(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    with JobStore(d) as store, Worker(store) as w:
        for i in range(3):
            w.put("mail", {"n": i}, group="campaign/42")
        w.put("mail", {"n": "x"}, group="Ωmega")
        job = store.peek_ready("mail")
        assert job is not None
        store.delete(job.id)
        found = json.loads(ok(run("progress", d, "mail", "--json")))  # the store is open
        assert found == {
            "campaign/42": {"ready": 2, "delayed": 0, "reserved": 0, "buried": 0,
                            "waiting": 0, "done": 1},
            "Ωmega": {"ready": 1, "delayed": 0, "reserved": 0, "buried": 0, "waiting": 0,
                      "done": 0}}
    table = ok(run("progress", d, "mail"))
    assert "campaign/42" in table and "Ωmega" in table and "done" in table
    one = json.loads(ok(run("progress", d, "mail", "campaign/42", "--json")))
    assert list(one) == ["campaign/42"] and one["campaign/42"]["done"] == 1
    assert ok(run("progress", d, "other")) == "no job group in tube 'other'\n"
    assert "group '' is not valid" in failed(run("progress", d, "mail", ""))
    assert "is not a k7 job store" in failed(run("progress", tmp_path, "mail"))


@pytest.fixture(params=["k7", "beanstalkd"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(request.param, tmp_path / "store") as proc:
        yield proc


def test_errors_and_retry_over_a_beanstalkd_server(server: ServerProcess,
                                                   tmp_path: Path) -> None:
    address = f"beanstalk://127.0.0.1:{server.port}"
    w = Worker(address)  # not started: bury_two runs the jobs in this thread
    try:
        ids = bury_two(w)
        w.put("charge", {"card": "later"}, delay=3600)
        kept = bury_two(w, "kept")
    finally:
        w.close()
    rows = check_errors(address)
    assert [r["id"] for r in rows] == ids  # reserved by id and buried again: the same ids
    assert [r["id"] for r in check_errors(f"127.0.0.1:{server.port}")] == ids
    check_retry(address, ids)
    with Client(address, timeout=10) as c:
        assert [c.stats_job(i)["state"] for i in ids] == ["ready", "ready"]
        st = c.stats_tube("charge")
        assert (st["current-jobs-ready"], st["current-jobs-buried"],
                st["current-jobs-delayed"]) == (2, 0, 1)  # the delayed job was not kicked
    for nobody in (f"beanstalk://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                   f"unix:{tmp_path}/no.sock"):  # addresses, not directories
        assert "BeanstalkConnectionError" in failed(run("errors", nobody, "charge"))
        assert "BeanstalkConnectionError" in failed(run("retry", nobody, "charge", "--all"))
    if server.name == "k7-beanstalkd":
        # the store under our server, read from its directory once the server has written
        # its journal out (it stopped): the errors are those the jobs' envelopes carry
        assert server.stop() == 0
        assert [r["id"] for r in check_errors(tmp_path / "store", "kept")] == kept
