"""Workers whose jobs come from a beanstalkd server over the network: ours (k7-beanstalkd on
a job store) and Debian's real beanstalkd, the same tests against both, with the sync
Worker and the AsyncWorker (asyncio and trio)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import k7async
from k7core import K7Error
from k7core.beanstalk import Client
from k7core.workers import Backoff, Worker

from ._servers import ServerProcess, serving


@pytest.fixture(params=["k7", "beanstalkd"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(request.param, tmp_path / "store") as proc:
        yield proc


def address(server: ServerProcess) -> str:
    return f"beanstalk://127.0.0.1:{server.port}"


def test_jobs_are_run_and_failures_retried_with_their_errors(server: ServerProcess) -> None:
    runs: list[tuple[int, Any]] = []
    done = threading.Event()
    with Worker(address(server), backoff=Backoff(base=0.0, cap=0.0)) as w:
        @w.consumer("mail", concurrency=2)
        def send(p: dict[str, int]) -> None:
            runs.append((p["n"], p))
            if p["n"] == 3 and sum(1 for n, _ in runs if n == 3) < 3:
                raise ConnectionError("smtp down")
            if len(runs) == 7:
                done.set()

        for n in range(5):
            w.put("mail", {"n": n})
        assert done.wait(60)
    assert sorted(n for n, _ in runs) == [0, 1, 2, 3, 3, 3, 4]
    stats = w.retry_stats()["mail"]
    assert stats["ok"] == 5 and stats["failures"] == 2 and stats["retried_ok"] == 1
    with Client(("127.0.0.1", server.port)) as c:
        assert c.stats()["current-jobs-ready"] == 0


def test_a_job_given_up_is_buried_with_every_error_and_can_be_retried(
        server: ServerProcess) -> None:
    w = Worker(address(server), max_retries=1, backoff=Backoff(base=0.0, cap=0.0))
    failing = [True]

    @w.consumer("t")
    def c(p: str) -> str:
        if failing[0]:
            raise ValueError(f"cannot {p}")
        return f"did {p}"

    w.put("t", "a")
    w.put("t", "b")
    for _ in range(4):
        with pytest.raises(ValueError):
            w.consume("t")
    errors = w.errors("t")
    assert sorted(e.payload for e in errors) == ["a", "b"]
    assert all([x.splitlines()[0] for x in e.errors] ==
               [f"#1 ValueError: cannot {e.payload}", f"#2 ValueError: cannot {e.payload}"]
               for e in errors)
    assert [e.payload for e in w.errors("t")] == [e.payload for e in errors]  # order kept
    with pytest.raises(ValueError):
        w.retry_one_error("t")
    failing[0] = False
    assert w.retry_one_error("t") in ("did a", "did b")
    assert w.retry_errors("t") == 1
    assert w.consume("t") in ("did a", "did b")
    assert w.stats() == {}
    w.close()


def test_keys_dependencies_and_groups_are_refused_with_a_reason(server: ServerProcess
                                                                ) -> None:
    with Worker(address(server)) as w:
        with pytest.raises(K7Error, match="no unique keys"):
            w.put("t", 1, key="k")
        with pytest.raises(K7Error, match="no unique keys"):
            w.put("t", 1, depends_on=[1])
        with pytest.raises(K7Error, match="job groups"):
            w.put("t", 1, group="g")
        with pytest.raises(K7Error, match="job groups"):
            w.group_progress("t", "g")
        with pytest.raises(K7Error, match="job groups"):
            w.forget_group("t", "g")
        assert w.stats() == {}  # nothing was put


def test_a_killed_worker_process_releases_its_job_at_once(server: ServerProcess,
                                                          tmp_path: Path) -> None:
    ready = tmp_path / "running"
    child = f"""
import pathlib, threading
from k7core.workers import Worker
w = Worker({address(server)!r})
def hold(p):
    pathlib.Path({str(ready)!r}).write_text("x")
    threading.Event().wait()
w.consumer("t", hold, ttr=3600)
w.start()
threading.Event().wait()
"""
    with Worker(address(server)) as w:
        job_id = w.put("t", 1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", child], env=env)
    try:
        with Client(("127.0.0.1", server.port), timeout=30) as c:
            while not ready.exists():  # the child has it reserved
                assert proc.poll() is None
                threading.Event().wait(0.01)
            assert c.stats_job(job_id)["state"] == "reserved"
            c.watch("t")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            got = c.reserve(timeout=5)  # ready at once, not after its hour of ttr
            assert got is not None and got.id == job_id
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_async_worker_over_a_server(server: ServerProcess, anyio_backend: str
                                              ) -> None:
    seen: list[int] = []
    done = anyio.Event()
    async with k7async.AsyncWorker(address(server), backoff=Backoff(base=0.0, cap=0.0)) as w:
        @w.consumer("t", concurrency=2)
        async def c(p: int) -> None:
            seen.append(p)
            if p == 0 and seen.count(0) == 1:
                raise RuntimeError("first time")
            if len(seen) == 11:
                done.set()

        for i in range(10):
            await w.put("t", i)
        with anyio.fail_after(60):
            await done.wait()
        assert await w.check_health() is True
    assert sorted(seen) == [0, *range(10)]


def _bury_one(server: ServerProcess, tube: str) -> None:
    with Client(("127.0.0.1", server.port)) as c:
        c.use(tube)
        c.put(b'"broken"')
        c.watch(tube)
        got = c.reserve(timeout=5)
        assert got is not None
        c.bury(got.id)


def _states(server: ServerProcess, tube: str) -> tuple[int, int, int]:
    with Client(("127.0.0.1", server.port)) as c:
        st = c.stats_tube(tube)
    return (int(st["current-jobs-ready"]), int(st["current-jobs-delayed"]),
            int(st["current-jobs-buried"]))


def test_retry_errors_kicks_buried_jobs_only_never_delayed_ones(server: ServerProcess
                                                                ) -> None:
    with Worker(address(server)) as w:  # no consumer: nothing takes the jobs
        w.put("q", "in an hour", delay=3600)
        assert w.retry_errors("q") == 0  # beanstalkd's kick would kick the delayed job
        assert _states(server, "q") == (0, 1, 0)
        _bury_one(server, "q")
        _bury_one(server, "q")
        assert w.retry_errors("q") == 2
        assert w.retry_errors("q") == 0
        assert _states(server, "q") == (2, 1, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_retry_errors_kicks_buried_jobs_only(server: ServerProcess,
                                                         anyio_backend: str) -> None:
    async with k7async.AsyncWorker(address(server)) as w:
        await w.put("q", "in an hour", delay=3600)
        assert await w.retry_errors("q") == 0
        assert _states(server, "q") == (0, 1, 0)
        _bury_one(server, "q")
        assert await w.retry_errors("q") == 1
        assert _states(server, "q") == (1, 1, 0)


def _held_past(server: ServerProcess, job_id: int, seconds: int) -> None:
    """Wait (bounded) until job ``job_id`` is ``seconds`` old on the server, checking all
    along that it stayed reserved once, without a timeout (the server's clock is real)."""
    with Client(("127.0.0.1", server.port), timeout=30) as c:
        deadline = time.monotonic() + 60
        while True:
            st = c.stats_job(job_id)
            assert (st["state"], st["reserves"], st["timeouts"]) == ("reserved", 1, 0), st
            if int(st["age"]) >= seconds:
                return
            assert time.monotonic() < deadline
            threading.Event().wait(0.05)


def _put_with_ttr(server: ServerProcess, ttr: int) -> int:
    with Client(("127.0.0.1", server.port)) as c:  # another client's job, its own ttr
        c.use("t")
        return c.put(b"7", ttr=ttr)


def test_a_job_with_its_own_ttr_shorter_than_the_tubes_runs_once(server: ServerProcess
                                                                 ) -> None:
    runs: list[int] = []
    running, finish = threading.Event(), threading.Event()
    with Worker(address(server)) as w:  # the tube's ttr: the default 60 s, touches at 20 s
        @w.consumer("t", concurrency=2)
        def c(p: int) -> None:
            runs.append(p)
            running.set()
            finish.wait(60)

        job_id = _put_with_ttr(server, 2)
        assert running.wait(30)
        try:
            _held_past(server, job_id, 5)  # 2.5 times its ttr
        finally:
            finish.set()
    assert runs == [7]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_a_job_with_its_own_ttr_runs_once(server: ServerProcess,
                                                      anyio_backend: str) -> None:
    runs: list[int] = []
    running, finish = anyio.Event(), anyio.Event()
    async with k7async.AsyncWorker(address(server)) as w:
        @w.consumer("t", concurrency=2)
        async def c(p: int) -> None:
            runs.append(p)
            running.set()
            await finish.wait()

        job_id = _put_with_ttr(server, 2)
        with anyio.fail_after(30):
            await running.wait()
        try:
            await anyio.to_thread.run_sync(_held_past, server, job_id, 5)
        finally:
            finish.set()
    assert runs == [7]


def test_health_recovers_when_the_job_that_failed_here_is_done_by_another_worker(
        server: ServerProcess) -> None:
    a = Worker(address(server), grace=0.0, allowed_error_time=0.0,
               backoff=Backoff(base=0.0, cap=0.0))
    b = Worker(address(server), grace=0.0)
    try:
        a.consumer("q", lambda p: 1 / 0)
        b.consumer("q", lambda p: "done")
        a.put("q", 1)
        with pytest.raises(ZeroDivisionError):
            a.consume("q")  # put again under a new id, with its error
        assert a.check_health() is False  # failing (for longer than 0 s)
        assert b.consume("q") == "done"
        assert a.check_health() is True
    finally:
        a.close()
        b.close()
