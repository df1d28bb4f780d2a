"""k7core.workers.Worker: the test mode (a MemorySource, time moved by the test), and real
threads over a JobStore on disk."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k7core import ClosedError, K7Error
from k7core.jobs import JobStore
from k7core.workers import (
    Backoff,
    ManualClock,
    MemorySource,
    NoJobError,
    PayloadError,
    Worker,
)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")


class AlreadyDone(Exception):
    pass


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture
def w(clock: ManualClock) -> Iterator[Worker]:
    with Worker(MemorySource(clock), backoff=Backoff(base=5.0, jitter=0.0)) as worker:
        yield worker


# --- the test mode: consume, force_retry, time moved by the test ------------------------------


def test_consume_returns_the_consumers_result_and_the_job_is_done(w: Worker) -> None:
    w.consumer("q", lambda p: p["n"] * 2)
    w.put("q", {"n": 21})
    assert w.consume("q") == 42
    assert w.stats() == {}  # the job was deleted, the tube is gone
    with pytest.raises(NoJobError):
        w.consume("q")


def test_a_raising_consumer_is_retried_after_the_backoff(w: Worker, clock: ManualClock
                                                         ) -> None:
    calls: list[Any] = []

    @w.consumer("q")
    def flaky(p: Any) -> str:
        calls.append(p)
        if len(calls) < 3:
            raise ConnectionError(f"down {len(calls)}")
        return "ok"

    w.put("q", "job")
    with pytest.raises(ConnectionError, match="down 1"):
        w.consume("q")
    assert w.stats()["q"]["delayed"] == 1
    clock.advance(4.9)
    with pytest.raises(NoJobError):
        w.consume("q")
    clock.advance(0.1)  # 5 s: the first backoff
    with pytest.raises(ConnectionError, match="down 2"):
        w.consume("q")
    clock.advance(9.9)
    with pytest.raises(NoJobError):
        w.consume("q")
    clock.advance(0.1)  # 10 s: doubled
    assert w.consume("q") == "ok"
    assert w.retry_stats()["q"] == {"ok": 1, "retried_ok": 1, "failures": 2, "buried": 0,
                                    "deferred": 0, "retry_percentage": 200.0}


def test_max_retries_buries_with_every_error_and_its_traceback(w: Worker, clock: ManualClock
                                                              ) -> None:
    def broken(p: Any) -> None:
        raise ValueError(f"bad {p}")

    w.consumer("q", broken, max_retries=2)
    job_id = w.put("q", 7)
    for _ in range(3):
        with pytest.raises(ValueError):
            w.consume("q")
        clock.advance(3600)
    assert w.stats()["q"]["buried"] == 1
    [failed] = w.errors("q")
    assert failed.id == job_id and failed.payload == 7
    assert [e.splitlines()[0] for e in failed.errors] == [
        "#1 ValueError: bad 7", "#2 ValueError: bad 7", "#3 ValueError: bad 7"]
    assert all("in broken" in e for e in failed.errors)  # the traceback names the consumer


def test_invalid_payloads_are_buried_at_once_without_running(w: Worker) -> None:
    ran: list[Any] = []
    w.consumer("q", ran.append, valid_payload=lambda p: isinstance(p, dict) and "id" in p)
    w.put("q", {"no": "id"})
    with pytest.raises(PayloadError):
        w.consume("q")
    assert ran == [] and w.stats()["q"]["buried"] == 1
    assert "valid_payload rejected" in w.errors("q")[0].errors[-1]


def test_an_undecodable_body_is_buried(w: Worker) -> None:
    w.consumer("q", lambda p: p)
    w.source.put(b"{not json", tube="q", priority=1, delay=0, ttr=60, key=None,
                 depends_on=())
    with pytest.raises(PayloadError, match="JSONDecodeError"):
        w.consume("q")
    assert w.errors("q")[0].payload == b"{not json"


def test_already_done_counts_as_success(w: Worker) -> None:
    def idempotent(p: Any) -> None:
        raise AlreadyDone

    w.consumer("q", idempotent, already_done=(AlreadyDone,))
    w.put("q", 1)
    assert w.consume("q") is None  # the exception is success: nothing raised
    assert w.stats() == {} and w.retry_stats()["q"]["ok"] == 1


def test_force_retry_runs_the_last_payload_again_and_stores_nothing(w: Worker) -> None:
    seen: list[Any] = []
    def c(p: Any) -> int:
        seen.append(p)
        return len(seen)

    w.consumer("q", c)
    w.put("q", {"x": 1})
    assert w.consume("q") == 1
    assert w.force_retry("q") == 2
    assert seen == [{"x": 1}, {"x": 1}] and w.stats() == {}
    with pytest.raises(NoJobError):
        w.force_retry("other")


def test_the_gate_defers_a_failed_job_that_comes_up_while_it_is_closed(
        clock: ManualClock) -> None:
    w = Worker(MemorySource(clock), backoff=Backoff(base=5.0, factor=1.0, jitter=0.0))
    results: list[str] = []

    @w.consumer("q")
    def c(p: str) -> None:
        if p.startswith("bad"):
            raise RuntimeError(p)
        results.append(p)

    w.put("q", "bad-1")
    with pytest.raises(RuntimeError):
        w.consume("q")
    clock.advance(5.0)
    # bad-1 is due; now another job fails, closing the gate for 5 s
    w.put("q", "bad-2", priority=0)
    with pytest.raises(RuntimeError):
        w.consume("q")
    session = w.source.session()
    job = session.reserve(("q",), 0)
    assert job is not None and job.errors  # bad-1 came up again, while the gate is closed
    action = w._handle(session, job)[0]  # what a worker thread does with it
    session.close()
    assert type(action).__name__ == "Defer" and action.delay == 5.0  # type: ignore[union-attr]
    assert w.retry_stats()["q"]["deferred"] == 1
    assert w.stats()["q"]["delayed"] == 2


def test_context_is_captured_at_put_and_set_around_the_consumer_and_its_logs(
        w: Worker, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str]] = []

    class Stamp(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            record.request_id = request_id.get("-")
            return True

    @w.consumer("q", context=[request_id, tenant])
    def c(p: Any) -> None:
        seen.append((request_id.get("-"), tenant.get("-")))
        raise RuntimeError("fails, to make the worker log")

    token = request_id.set("req-42")
    w.put("q", 1)
    request_id.reset(token)
    stamp = Stamp()
    caplog.handler.addFilter(stamp)
    try:
        with caplog.at_level(logging.WARNING, "k7core.workers"), pytest.raises(RuntimeError):
            w.consume("q")
    finally:
        caplog.handler.removeFilter(stamp)
    assert seen == [("req-42", "-")]  # tenant was not set at put: not set here either
    assert request_id.get("-") == "-"  # reset after the job
    [record] = caplog.records
    assert record.request_id == "req-42"  # type: ignore[attr-defined]
    assert "failed, retry in" in record.getMessage()


def test_keys_and_dependencies_from_the_put_api(w: Worker) -> None:
    order: list[str] = []
    w.consumer("a", order.append)
    w.consumer("b", order.append, depends_on=lambda p: [("a", "a1")])
    first = w.put("a", "a1", key="a1")
    assert w.put("a", "a1 again", key="a1") == first  # a live key: the same job
    w.put("b", "b1")  # depends on (a, a1), from the consumer's depends_on
    with pytest.raises(NoJobError):
        w.consume("b")
    assert w.stats()["b"]["waiting"] == 1
    w.consume("a")
    w.consume("b")
    assert order == ["a1", "b1"]
    with pytest.raises(K7Error):
        w.put("b", "b2", depends_on=[("a", "missing")])


def test_group_progress_follows_a_campaign(w: Worker, clock: ManualClock) -> None:
    """yoltq's job groups: progress of one marketeer's mails, not of every mail."""

    @w.consumer("mail", max_retries=1)
    def send(p: dict[str, Any]) -> None:
        if p["to"] == "bad":
            raise OSError("no such mailbox")

    for to in ["a", "b", "bad", "c"]:
        w.put("mail", {"to": to}, group="campaign/42")
    w.put("mail", {"to": "x"}, group="campaign/7")
    w.put("mail", {"to": "later"}, group="campaign/42", delay=60)
    zero = {"ready": 0, "delayed": 0, "reserved": 0, "buried": 0, "waiting": 0, "done": 0}
    assert w.group_progress("mail", "campaign/42") == zero | {"ready": 4, "delayed": 1}
    for _ in range(2):
        w.consume("mail")
    with pytest.raises(OSError, match="no such mailbox"):
        w.consume("mail")
    assert w.group_progress("mail", "campaign/42") == zero | {
        "ready": 1, "delayed": 2, "done": 2}  # the failed one waits for its retry
    clock.advance(60)
    failures = 0
    for _ in range(4):  # c, bad (buried now), x (of campaign/7), later
        try:
            w.consume("mail")
        except OSError:
            failures += 1
    assert failures == 1
    assert w.group_progress("mail", "campaign/42") == zero | {"buried": 1, "done": 4}
    assert w.group_progress("mail", "campaign/7") == zero | {"done": 1}
    assert w.forget_group("mail", "campaign/42") is True
    assert w.group_progress("mail", "campaign/42") == zero
    with pytest.raises(K7Error, match="group"):
        w.put("mail", {"to": "y"}, group="")


def test_retry_one_error_runs_a_buried_job_now_and_returns_or_raises(w: Worker,
                                                                   clock: ManualClock) -> None:
    state = {"broken": True}

    @w.consumer("q", max_retries=1)
    def c(p: Any) -> str:
        if state["broken"]:
            raise OSError("still broken")
        return f"done {p}"

    w.put("q", 1)
    w.put("q", 2)
    for _ in range(2):  # the first failures close the gate; retries are not due anyway
        with pytest.raises(OSError):
            w.consume("q")
    clock.advance(5.0)  # not buried yet: delayed by the backoff
    for _ in range(2):
        with pytest.raises(OSError):
            w.consume("q")
    assert len(w.errors("q")) == 2
    with pytest.raises(OSError, match="still broken"):
        w.retry_one_error("q")
    assert len(w.errors("q")) == 2  # buried again, one more error on it
    assert max(len(e.errors) for e in w.errors("q")) == 3
    state["broken"] = False
    assert w.retry_one_error("q") in ("done 1", "done 2")
    assert len(w.errors("q")) == 1
    assert w.retry_errors("q") == 1
    assert w.consume("q") in ("done 1", "done 2")
    assert w.retry_one_error("q") is None and w.stats() == {}


def test_health_goes_false_when_a_failure_is_older_than_allowed(clock: ManualClock) -> None:
    w = Worker(MemorySource(clock), grace=60.0, allowed_error_time=900.0)
    w.consumer("q", lambda p: 1 / 0, max_retries=1)
    assert w.healthy() is None
    w.put("q", 1)
    with pytest.raises(ZeroDivisionError):
        w.consume("q")
    assert w.check_health() is True
    clock.advance(901)
    assert w.check_health() is False and w.healthy() is False
    with pytest.raises(ZeroDivisionError):
        w.consume("q")  # buried now
    assert w.check_health() is False
    w.source.kick("q", 1)
    w.consumer("ok", lambda p: p)
    session = w.source.session()
    job = session.reserve(("q",), 0)
    assert job is not None
    session.delete(job)  # removed by hand
    session.close()
    w._core.monitor.forget("q", job.id)
    assert w.check_health() is True


def test_bad_registrations_and_puts_are_refused(w: Worker) -> None:
    w.consumer("q", lambda p: p)
    with pytest.raises(K7Error, match="has a consumer"):
        w.consumer("q", lambda p: p)
    with pytest.raises(K7Error, match="not a worker option"):
        w.consumer("r", lambda p: p, retries=3)  # type: ignore[call-overload]
    with pytest.raises(PayloadError, match="cannot encode"):
        w.put("q", {1, 2})
    with pytest.raises(K7Error):
        w.put("bad tube name!", 1)
    with pytest.raises(K7Error, match="not a job source"):
        Worker(object())  # type: ignore[arg-type]


def test_codecs_per_tube(w: Worker) -> None:
    w.consumer("p", lambda p: p, codec="pickle")
    w.consumer("m", lambda p: p, codec="msgpack")
    w.put("p", {1, 2})
    w.put("m", [1, "two"])
    assert w.consume("p") == {1, 2}
    assert w.consume("m") == [1, "two"]


# --- threads over a JobStore ------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs", fsync="flush") as s:
        yield s


def test_threads_run_every_job_once(store: JobStore) -> None:
    n = 2000
    seen: list[int] = []
    lock, done = threading.Lock(), threading.Event()
    w = Worker(store)

    @w.consumer("t", concurrency=4)
    def c(p: int) -> None:
        with lock:
            seen.append(p)
            if len(seen) == n:
                done.set()

    with w:
        for i in range(n):
            w.put("t", i)
        assert done.wait(60)
    assert sorted(seen) == list(range(n))
    assert store.stats()["current-jobs-ready"] == 0 and len(store) == 0
    assert w.processing_time_stats()["t"]["count"] == n
    with pytest.raises(ClosedError):
        w.put("t", 1)


def test_stop_releases_a_job_still_running_at_once(store: JobStore) -> None:
    started, release = threading.Event(), threading.Event()
    w = Worker(store)

    @w.consumer("t")
    def c(p: int) -> None:
        started.set()
        release.wait(30)

    w.start()
    job_id = w.put("t", 1)
    assert started.wait(30)
    w.stop(timeout=0.05)
    job = store.peek(job_id)
    assert job is not None and job.state == "ready" and job.timeouts == 0
    release.set()


def test_group_progress_over_a_store_counts_what_threads_did(store: JobStore) -> None:
    n = 300
    done = threading.Event()
    w = Worker(store)

    @w.consumer("t", concurrency=3)
    def c(p: int) -> None:
        if p == n - 1:
            done.set()

    with w:
        for i in range(n):
            w.put("t", i, group="g", priority=i)  # the last put runs last
        assert done.wait(60)
        w.stop()
        progress = w.group_progress("t", "g")
    assert progress == store.group_progress("t", "g")
    assert progress["done"] == n and sum(progress.values()) == n


def test_a_consumer_added_to_a_running_worker_starts(store: JobStore) -> None:
    got = threading.Event()
    with Worker(store) as w:
        w.put("late", "x")
        w.consumer("late", lambda p: got.set())
        assert got.wait(30)


def test_a_running_job_is_touched_so_its_ttr_measures_a_live_worker(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    with JobStore(tmp_path / "j", clock=clock) as store:
        running, finish = threading.Event(), threading.Event()
        w = Worker(store, clock=clock)

        @w.consumer("t", ttr=3.0)
        def c(p: int) -> None:
            running.set()
            finish.wait(30)

        with w:
            job_id = w.put("t", 1)
            assert running.wait(30)
            first = store.peek(job_id)
            assert first is not None and first.state == "reserved"
            for _ in range(10):  # 10 ttr's worth, a third at a time
                deadline = first.ready_at
                clock.advance(1.0)
                for _ in range(200):
                    now = store.peek(job_id)
                    if now is not None and now.ready_at > deadline:
                        break
                    threading.Event().wait(0.01)  # the watch thread ticks every 0.5 s
                first = store.peek(job_id)
                assert first is not None and first.state == "reserved", "ttr ran out"
            finish.set()


def test_a_job_running_past_max_execute_time_is_logged_with_its_stack(
        store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    logged, finish = threading.Event(), threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "max_execute_time" in record.getMessage():
                logged.set()

    handler = Seen()
    logging.getLogger("k7core.workers").addHandler(handler)
    try:
        w = Worker(store, max_execute_time=0.01)

        def stuck_in_here(p: int) -> None:
            finish.wait(30)

        w.consumer("t", stuck_in_here)
        with caplog.at_level(logging.ERROR, "k7core.workers"), w:
            w.put("t", 1)
            assert logged.wait(30)
            assert w.check_health() is False  # a job runs past max_execute_time
            finish.set()
    finally:
        logging.getLogger("k7core.workers").removeHandler(handler)
    [msg] = [r.getMessage() for r in caplog.records if "max_execute_time" in r.getMessage()]
    assert "in stuck_in_here" in msg and "finish.wait(30)" in msg


@pytest.mark.parametrize("kind", ["memory", "store"])
def test_retry_errors_kicks_buried_jobs_only_never_delayed_ones(kind: str, tmp_path: Path
                                                                ) -> None:
    with contextlib.ExitStack() as stack:
        source: JobStore | MemorySource = (
            MemorySource() if kind == "memory"
            else stack.enter_context(JobStore(tmp_path / "j", fsync="flush")))
        w = stack.enter_context(Worker(source))
        w.consumer("q", lambda p: p, valid_payload=lambda p: p != "bad")
        w.put("q", "in an hour", delay=3600)
        assert w.retry_errors("q") == 0  # nothing buried: the delayed job stays delayed
        assert w.stats()["q"]["delayed"] == 1 and w.stats()["q"]["ready"] == 0
        w.put("q", "bad")
        with pytest.raises(PayloadError):
            w.consume("q")  # buried
        assert w.retry_errors("q") == 1
        assert w.retry_errors("q") == 0
        counts = w.stats()["q"]
        assert (counts["ready"], counts["delayed"], counts["buried"]) == (1, 1, 0)


def test_a_job_with_its_own_ttr_shorter_than_the_tubes_runs_once(tmp_path: Path) -> None:
    """The job's own ttr (put by another client) sets its touches, not the tube's option:
    under the default 60 s the worker touched every 20 s, and a job put with ttr=3 ran
    out in a live worker and ran again in the other slot."""
    clock = ManualClock(1_000_000.0)
    with JobStore(tmp_path / "j", clock=clock) as store:
        runs: list[Any] = []
        running, finish = threading.Event(), threading.Event()
        w = Worker(store, clock=clock)  # the tube's ttr: the default 60 s

        @w.consumer("t", concurrency=2)
        def c(p: int) -> None:
            runs.append(p)
            running.set()
            finish.wait(30)

        with w:
            job_id = store.put(b"7", tube="t", ttr=3)
            assert running.wait(30)
            for _ in range(9):  # three times its ttr, a third of it at a time
                first = store.peek(job_id)
                assert first is not None
                clock.advance(1.0)
                deadline = time.monotonic() + 30
                while (now := store.peek(job_id)) is not None and \
                        now.ready_at == first.ready_at and time.monotonic() < deadline:
                    threading.Event().wait(0.005)  # the watch thread touches it
                assert now is not None and now.state == "reserved"
                assert (now.reserves, now.timeouts) == (1, 0), "its ttr ran out"
            finish.set()
        assert runs == [7]


@pytest.mark.parametrize("kind", ["memory", "store"])
def test_health_recovers_when_the_job_that_failed_here_is_done_by_another_worker(
        kind: str, tmp_path: Path) -> None:
    clock = ManualClock()
    with contextlib.ExitStack() as stack:
        source: JobStore | MemorySource = (
            MemorySource(clock) if kind == "memory"
            else stack.enter_context(JobStore(tmp_path / "j", fsync="flush", clock=clock)))
        a = Worker(source, clock=clock, grace=0.0, allowed_error_time=900.0,
                   backoff=Backoff(base=1.0, jitter=0.0))
        b = Worker(source, clock=clock, grace=0.0, allowed_error_time=900.0)
        a.consumer("q", lambda p: 1 / 0)
        b.consumer("q", lambda p: "done")
        a.put("q", 1)
        with pytest.raises(ZeroDivisionError):
            a.consume("q")  # failed here: retrying
        assert a.check_health() is True  # not for long yet
        clock.advance(901)
        assert a.check_health() is False  # failing for more than allowed_error_time
        assert b.consume("q") == "done"  # done by the other worker
        assert a.check_health() is True and a.healthy() is True
        assert b.check_health() is True


class Odd(BaseException):
    """Not an Exception, not a request to stop."""


def test_a_consumer_raising_systemexit_stops_the_worker_and_join_raises_it(
        store: JobStore) -> None:
    w = Worker(store)
    w.consumer("t", lambda p: sys.exit(3))
    with w:
        job_id = w.put("t", 1)
        with pytest.raises(SystemExit) as raised:
            w.join(30)
        assert raised.value.code == 3
    job = store.peek(job_id)
    assert job is not None and job.state == "ready" and not job.errors  # released
    assert w.running() == {} and w.retry_stats() == {}  # not a failure, not running
    assert w.join(0) is True  # raised once


def test_another_base_exception_is_a_failure_and_the_slot_goes_on(store: JobStore) -> None:
    done = threading.Event()

    def c(p: int) -> None:
        if p == 1:
            raise Odd("odd")
        done.set()

    w = Worker(store, backoff=Backoff(base=60.0))
    w.consumer("t", c)
    with w:
        first = w.put("t", 1, priority=0)
        w.put("t", 2, priority=1)
        assert done.wait(30)  # the same slot ran the next job
        assert w.running() == {}
    job = store.peek(first)
    assert job is not None and job.state == "delayed"
    head = job.errors[0].splitlines()[0]
    assert head.startswith("#1 ") and head.endswith("Odd: odd")
    assert w.retry_stats()["t"]["failures"] == 1
