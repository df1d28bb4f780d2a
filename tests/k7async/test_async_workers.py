"""k7async.AsyncWorker under asyncio and trio: the test mode, and tasks over a job store on
disk under "flush" (calls in the loop) and "sync" (the owner thread, group commit)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import k7async
from k7core.workers import Backoff, ManualClock, MemorySource, NoJobError
from tests.k7core.test_full_disk import small_fs  # noqa: F401 (a fixture)
from tests.k7core.workers._fullhelp import (  # noqa: F401 (deletes: a fixture)
    Deletes,
    check_logs,
    deletes,
    fill_to_the_roll,
)

pytestmark = pytest.mark.anyio

trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id")


async def test_the_test_mode_consumes_retries_and_forces_a_retry() -> None:
    clock = ManualClock()
    async with k7async.AsyncWorker(MemorySource(clock),
                                   backoff=Backoff(base=5.0, jitter=0.0)) as w:
        calls: list[Any] = []

        @w.consumer("q", max_retries=1, context=[trace_id])
        async def c(p: Any) -> str:
            calls.append((p, trace_id.get("-")))
            if len(calls) == 1:
                raise TimeoutError("slow downstream")
            return f"sent {p}"

        token = trace_id.set("t-1")
        await w.put("q", "mail")
        trace_id.reset(token)
        with pytest.raises(TimeoutError):
            await w.consume("q")
        with pytest.raises(NoJobError):
            await w.consume("q")
        clock.advance(5.0)
        assert await w.consume("q") == "sent mail"
        assert await w.force_retry("q") == "sent mail"
        assert calls == [("mail", "t-1")] * 3
        assert await w.stats() == {}
        assert w.retry_stats()["q"]["retried_ok"] == 1


async def test_errors_and_retry_one_error() -> None:
    async with k7async.AsyncWorker(MemorySource()) as w:
        broken = [True]

        @w.consumer("q", max_retries=0, valid_payload=lambda p: p != "invalid")
        async def c(p: Any) -> Any:
            if broken[0]:
                raise ValueError("no")
            return p

        await w.put("q", "invalid")
        with pytest.raises(Exception, match="valid_payload"):
            await w.consume("q")
        [failed] = await w.errors("q")
        assert failed.payload == "invalid"
        with pytest.raises(Exception, match="valid_payload"):
            await w.retry_one_error("q")  # still invalid: buried again
        assert await w.retry_errors("q") == 1
        with pytest.raises(Exception, match="valid_payload"):
            await w.consume("q")
        assert await w.check_health() is True


@pytest.mark.parametrize("fsync", ["flush", "sync"])
async def test_tasks_run_every_job_once(tmp_path: Path, fsync: str) -> None:
    n = 500
    seen: list[int] = []
    done = anyio.Event()
    async with k7async.open_jobs(tmp_path / "j", fsync=fsync) as store:
        async with k7async.AsyncWorker(store) as w:
            @w.consumer("t", concurrency=3)
            async def c(p: int) -> None:
                seen.append(p)
                await anyio.lowlevel.checkpoint()
                if len(seen) == n:
                    done.set()

            for i in range(n):
                await w.put("t", i)
            with anyio.fail_after(60):
                await done.wait()
        assert sorted(seen) == list(range(n))
        assert len(store.store) == 0
        assert w.processing_time_stats()["t"]["count"] == n


async def test_exit_cancels_a_running_job_after_the_stop_timeout_and_it_is_ready(
        tmp_path: Path) -> None:
    started = anyio.Event()
    async with k7async.open_jobs(tmp_path / "j", fsync="flush") as store:
        async with k7async.AsyncWorker(store, stop_timeout=0.05) as w:
            @w.consumer("t")
            async def c(p: int) -> None:
                started.set()
                await anyio.sleep_forever()

            job_id = await w.put("t", 1)
            with anyio.fail_after(30):
                await started.wait()
        job = store.store.peek(job_id)
        assert job is not None and job.state == "ready" and not job.errors


async def test_a_failing_job_goes_back_delayed_with_its_error(tmp_path: Path) -> None:
    failed = anyio.Event()
    async with k7async.open_jobs(tmp_path / "j", fsync="flush") as store:
        async with k7async.AsyncWorker(store) as w:
            @w.consumer("t", backoff=Backoff(base=30.0))
            async def c(p: int) -> None:
                failed.set()
                raise KeyError(p)

            job_id = await w.put("t", 9)
            with anyio.fail_after(30):
                await failed.wait()
                while (job := store.store.peek(job_id)) is None or job.state != "delayed":
                    await anyio.sleep(0.01)
        assert job.errors[0].startswith("#1 KeyError: 9")


async def test_a_slow_job_is_logged_with_its_task_stack(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    logged = anyio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "max_execute_time" in record.getMessage():
                logged.set()

    handler = Seen()
    logging.getLogger("k7core.workers").addHandler(handler)
    try:
        async with (k7async.open_jobs(tmp_path / "j", fsync="flush") as store,
                    k7async.AsyncWorker(store, max_execute_time=0.01, stop_timeout=0.0) as w):
            async def waits_in_here(p: int) -> None:
                await anyio.sleep_forever()

            w.consumer("t", waits_in_here)
            with caplog.at_level(logging.ERROR, "k7core.workers"):
                await w.put("t", 1)
                with anyio.fail_after(30):
                    await logged.wait()
            assert await w.check_health() is False
    finally:
        logging.getLogger("k7core.workers").removeHandler(handler)
    [msg] = [r.getMessage() for r in caplog.records if "max_execute_time" in r.getMessage()]
    assert "in waits_in_here" in msg and "sleep_forever" in msg


async def test_group_progress_in_the_test_mode_and_over_a_store(tmp_path: Path) -> None:
    zero = {"ready": 0, "delayed": 0, "reserved": 0, "buried": 0, "waiting": 0, "done": 0}
    async with k7async.AsyncWorker(MemorySource()) as w:
        w.consumer("mail", _noop)
        for i in range(3):
            await w.put("mail", i, group="campaign")
        await w.consume("mail")
        assert await w.group_progress("mail", "campaign") == zero | {"ready": 2, "done": 1}
        assert await w.forget_group("mail", "campaign") is True
        assert await w.forget_group("mail", "campaign") is False
    n = 200
    done = anyio.Event()
    async with k7async.open_jobs(tmp_path / "j") as store:
        async with k7async.AsyncWorker(store) as w:
            @w.consumer("t", concurrency=2)
            async def c(p: int) -> None:
                if p == n - 1:
                    done.set()

            for i in range(n):
                await w.put("t", i, group="g", priority=i)
            with anyio.fail_after(60):
                await done.wait()
        assert await store.group_progress("t", "g") == zero | {"done": n}  # all deleted


async def _noop(p: object) -> None:
    pass


@pytest.mark.parametrize("kind", ["memory", "flush", "sync"])
async def test_retry_errors_kicks_buried_jobs_only_never_delayed_ones(tmp_path: Path,
                                                                      kind: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        source: k7async.AsyncJobStore | MemorySource = (
            MemorySource() if kind == "memory"
            else await stack.enter_async_context(k7async.open_jobs(tmp_path / "j",
                                                                   fsync=kind)))
        w = await stack.enter_async_context(k7async.AsyncWorker(source))  # no consumer
        await w.put("q", "in an hour", delay=3600)
        assert await w.retry_errors("q") == 0  # nothing buried: it stays delayed
        assert (await w.stats())["q"]["delayed"] == 1
        await w.put("q", "broken")
        session = w._src.session()
        job = await session.reserve(("q",), 0)
        assert job is not None
        await session.bury(job, "#1 broken")
        await session.aclose()
        assert await w.retry_errors("q") == 1
        assert await w.retry_errors("q") == 0
        counts = (await w.stats())["q"]
        assert (counts["ready"], counts["delayed"], counts["buried"]) == (1, 1, 0)


async def test_a_job_with_its_own_ttr_shorter_than_the_tubes_runs_once(tmp_path: Path
                                                                       ) -> None:
    """Touches follow the job's own ttr (3 s, put by another client), not the tube's 60."""
    clock = ManualClock()
    runs: list[Any] = []
    running, finish = anyio.Event(), anyio.Event()
    async with k7async.open_jobs(tmp_path / "j", fsync="flush", clock=clock) as store, \
            k7async.AsyncWorker(store, clock=clock) as w:
        @w.consumer("t", concurrency=2)
        async def c(p: int) -> None:
            runs.append(p)
            running.set()
            await finish.wait()

        job_id = await store.put(b"7", tube="t", ttr=3)
        with anyio.fail_after(30):
            await running.wait()
            for _ in range(9):  # three times its ttr, a third of it at a time
                first = store.store.peek(job_id)
                assert first is not None
                clock.advance(1.0)
                while (now := store.store.peek(job_id)) is not None and \
                        now.ready_at == first.ready_at:
                    await anyio.sleep(0.005)  # the watch task touches it
                assert now is not None and now.state == "reserved"
                assert (now.reserves, now.timeouts) == (1, 0), "its ttr ran out"
        finish.set()
    assert runs == [7]


async def test_health_recovers_when_the_job_that_failed_here_is_done_elsewhere() -> None:
    clock = ManualClock()
    source = MemorySource(clock)
    async with k7async.AsyncWorker(source, grace=0.0, allowed_error_time=900.0,
                                   backoff=Backoff(base=1.0, jitter=0.0)) as a, \
            k7async.AsyncWorker(source, grace=0.0) as b:
        a.consumer("q", _fail)
        b.consumer("q", _echo)
        await a.put("q", 1)
        with pytest.raises(ZeroDivisionError):
            await a.consume("q")
        clock.advance(901)
        assert await a.check_health() is False
        assert await b.consume("q") == 1
        assert await a.check_health() is True and a.healthy() is True


async def _echo(p: Any) -> Any:
    return p


async def _fail(p: Any) -> Any:
    return 1 / 0


class Odd(BaseException):
    """Not an Exception, not a request to stop, not a cancellation."""


async def test_a_consumer_raising_systemexit_stops_the_worker_and_exit_raises_it(
        tmp_path: Path) -> None:
    async def c(p: int) -> None:
        raise SystemExit(3)

    async with k7async.open_jobs(tmp_path / "j", fsync="flush") as store:
        w = k7async.AsyncWorker(store)
        w.consumer("t", c)
        with pytest.raises(SystemExit) as raised:
            async with w:
                job_id = await w.put("t", 1)
                with anyio.fail_after(30):
                    await anyio.sleep_forever()  # ended by the worker's stop
        assert raised.value.code == 3
        job = store.store.peek(job_id)
        assert job is not None and job.state == "ready" and not job.errors  # released
        assert w.running() == {} and w.retry_stats() == {}


async def test_another_base_exception_is_a_failure_and_the_task_goes_on(tmp_path: Path
                                                                        ) -> None:
    done = anyio.Event()

    async def c(p: int) -> None:
        if p == 1:
            raise Odd("odd")
        done.set()

    async with k7async.open_jobs(tmp_path / "j", fsync="flush") as store:
        async with k7async.AsyncWorker(store, backoff=Backoff(base=60.0)) as w:
            w.consumer("t", c)
            first = await w.put("t", 1, priority=0)
            await w.put("t", 2, priority=1)
            with anyio.fail_after(30):
                await done.wait()
            assert w.running() == {}
        job = store.store.peek(first)
        assert job is not None and job.state == "delayed"
        head = job.errors[0].splitlines()[0]
        assert head.startswith("#1 ") and head.endswith("Odd: odd")
        assert w.retry_stats()["t"]["failures"] == 1


async def test_a_job_whose_delete_the_full_disk_refuses_runs_once(
    small_fs: Path, deletes: Deletes, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    """tests/k7core/workers/test_worker_full_disk.py, on tasks: the job stays reserved and
    its delete is tried again (not the job run again) until space returns."""
    caplog.set_level(logging.INFO, logger="k7core.workers")
    runs: list[Any] = []
    ran = anyio.Event()

    async def consume(p: Any) -> None:
        runs.append(p)
        ran.set()

    async with k7async.open_jobs(small_fs / "j") as store:
        async with k7async.AsyncWorker(store) as w:
            job_id = await w.put("q", "mail", ttr=3.0)
            filler = fill_to_the_roll(store.store, small_fs)
            w.consumer("q", consume)  # starts now: the put ran no consumer
            try:
                with anyio.fail_after(60):
                    await ran.wait()
                assert await anyio.to_thread.run_sync(deletes.reached, 4)
                assert runs == ["mail"], "the job ran again while its delete was refused"
                assert not deletes.recorded.is_set()
                job = store.store.peek(job_id)
                assert job is not None and job.state == "reserved"
            finally:
                filler.unlink()
            assert await anyio.to_thread.run_sync(deletes.recorded.wait, 60)
        assert store.store.peek(job_id) is None
        assert runs == ["mail"]
    check_logs(caplog)


async def test_a_worker_stopping_while_a_delete_is_refused_releases_the_job(
    small_fs: Path, deletes: Deletes, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:

    async def consume(p: Any) -> None:
        pass

    async with k7async.open_jobs(small_fs / "j") as store:
        try:
            async with k7async.AsyncWorker(store, stop_timeout=60) as w:
                job_id = await w.put("q", "mail", ttr=3.0)
                filler = fill_to_the_roll(store.store, small_fs)
                w.consumer("q", consume)
                assert await anyio.to_thread.run_sync(deletes.reached, 2)
            job = store.store.peek(job_id)
            assert job is not None and job.state == "ready"  # released: it runs again
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert any("stops" in r.getMessage() for r in caplog.records)
        finally:
            filler.unlink()
