"""The workers' rules without I/O: codecs and the envelope, backoff, failure counting,
error texts, the per-tube gate, figures and health."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k7core import ClosedError, K7Error, StorageError
from k7core.jobs import JobNotFoundError
from k7core.workers import JSON, PICKLE, Backoff, JobView, Options, PayloadError, codec
from k7core.workers._codec import MAGIC, pack, unpack
from k7core.workers._core import Recorder, may_retry_record
from k7core.workers._monitor import Monitor, percentile
from k7core.workers._policy import (
    MAX_ERROR_BYTES,
    Bury,
    Delete,
    Gates,
    Retry,
    after_failure,
    error_text,
    failures,
)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


# --- codecs and the envelope ---------------------------------------------------------------


def test_a_plain_body_is_the_payload_so_any_client_reads_it() -> None:
    body = pack(JSON.encode({"a": 1}))
    assert json.loads(body) == {"a": 1}
    assert unpack(body).payload == body and unpack(body).context == {}


@given(payload=st.binary(), context=st.dictionaries(st.text(), st.integers() | st.text()),
       errors=st.lists(st.text(), max_size=3),
       created=st.none() | st.floats(0, 2e9))
def test_the_envelope_gives_back_what_was_packed(payload: bytes, context: dict[str, Any],
                                                 errors: list[str], created: float | None
                                                 ) -> None:
    back = unpack(pack(payload, context, tuple(errors), created))
    assert back == (payload, context, tuple(errors), created)


def test_a_payload_that_starts_like_an_envelope_is_enveloped() -> None:
    body = pack(MAGIC + b"tricky")
    assert body != MAGIC + b"tricky"
    assert unpack(body).payload == MAGIC + b"tricky"


@pytest.mark.parametrize("body", [MAGIC + b"\x00", MAGIC + b"\x00\x00\x00\x09{}",
                                  MAGIC + b"\x00\x00\x00\x02[]", MAGIC + b"\x00\x00\x00\x01{"])
def test_a_damaged_envelope_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        unpack(body)


def test_context_that_json_cannot_hold_is_refused_at_put() -> None:
    with pytest.raises(PayloadError, match="JSON values"):
        pack(b"x", {"v": object()})


def test_codecs_by_name() -> None:
    assert codec("json") is JSON and codec("pickle") is PICKLE
    value = {"x": [1, 2, "three"], "y": None}
    for name in ("json", "msgpack", "pickle"):
        c = codec(name)
        assert c.decode(c.encode(value)) == value
    with pytest.raises(K7Error, match="unknown codec"):
        codec("yaml")


# --- backoff, failures, error texts ----------------------------------------------------------


def test_backoff_grows_by_its_factor_up_to_its_cap_less_its_jitter() -> None:
    b = Backoff(base=5.0, factor=2.0, cap=60.0, jitter=0.5)
    assert [b.delay(n, 0.0) for n in (1, 2, 3, 4, 5, 100)] == [5, 10, 20, 40, 60, 60]
    assert b.delay(2, 0.999) == pytest.approx(10 * (1 - 0.5 * 0.999))
    for bad in ({"base": -1.0}, {"factor": 0.5}, {"cap": 1.0}, {"jitter": 2.0}):
        with pytest.raises(K7Error):
            Backoff(**bad)


def test_failures_are_counted_from_the_numbered_errors_past_the_history_bound() -> None:
    assert failures(()) == 0
    assert failures(("#1 a", "#2 b")) == 2
    assert failures(tuple(f"#{n} e" for n in range(30, 46))) == 45
    assert failures(("not numbered", "neither")) == 2


def test_an_error_text_keeps_its_head_and_the_end_of_a_long_traceback() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("the message")
        deep(n - 1)

    try:
        deep(150)
    except ValueError as exc:
        text = error_text(7, exc)
    assert text.startswith("#7 ValueError: the message\n")
    assert len(text.encode()) <= MAX_ERROR_BYTES
    assert "raise ValueError" in text  # the innermost frame survives
    assert failures((text,)) == 7


def test_retries_up_to_max_retries_then_bury() -> None:
    o = Options(max_retries=2, backoff=Backoff(base=1.0, jitter=0.0))
    exc = raised(RuntimeError("down"))
    first = after_failure(o, (), exc, 0.0)
    assert isinstance(first, Retry) and first.delay == 1.0 and first.error.startswith("#1 ")
    second = after_failure(o, (first.error,), exc, 0.0)
    assert isinstance(second, Retry) and second.delay == 2.0
    third = after_failure(o, (first.error, second.error), exc, 0.0)
    assert isinstance(third, Bury) and third.error.startswith("#3 RuntimeError: down")


def test_max_retries_zero_retries_without_limit() -> None:
    o = Options(max_retries=0)
    history = tuple(f"#{n} e" for n in range(1, 10_001))[-16:]
    assert isinstance(after_failure(o, history, raised(ValueError()), 0.5), Retry)


def test_the_gate_holds_jobs_that_failed_before_not_fresh_ones() -> None:
    g, o = Gates(), Options(backoff=Backoff(base=5.0))
    assert g.wait("t", ("#1 x",), 100.0) == 0.0
    g.failed("t", 100.0, o)
    assert g.wait("t", ("#1 x",), 101.0) == 4.0
    assert g.wait("t", (), 101.0) == 0.0  # a fresh job runs
    assert g.wait("other", ("#1 x",), 101.0) == 0.0  # other tubes are not held
    assert g.wait("t", ("#1 x",), 105.0) == 0.0


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"max_retries": -1}, {"ttr": 0.5},
                                 {"max_execute_time": 0.0}, {"context": ("x",)}])
def test_bad_options_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(K7Error):
        Options(**bad)


# --- figures and health ------------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (50, 90, 99)] == [51.0, 91.0, 100.0]
    assert percentile([3.0], 99) == 3.0


def test_processing_times_cover_the_window_only() -> None:
    m = Monitor(window=10.0)
    for i in range(10):
        m.done("t", i, False, float(i), now=100.0 + i)
    stats = m.processing_times(now=115.0)["t"]  # runs done before 105 fell out
    assert stats["count"] == 5 and stats["min"] == 5.0 and stats["max"] == 9.0
    assert stats["avg"] == 7.0 and stats["p50"] == 7.0


def check(m: Monitor, now: float, buried: dict[str, list[tuple[int, float]]], *,
          slow: bool = False, gone: frozenset[int] = frozenset()) -> bool:
    """A health check as the faces run it; ``gone``: job ids no longer in the store."""
    suspects = m.suspects(now, buried, 100)
    return m.settle(suspects, [job_id not in gone for _, job_id in suspects.jobs], slow)


def test_health_is_none_then_true_in_grace_then_follows_old_failures() -> None:
    m = Monitor(grace=2000.0, allowed_error_time=900.0, started=0.0)
    assert m.healthy(10.0) is None
    m.failed("t", 1, created_at=0.0)
    assert check(m, 1000.0, {}) is False
    assert m.healthy(1000.0) is True  # start-up grace
    assert m.healthy(2500.0) is False
    m.done("t", 1, True, 0.1, 2500.0)  # the failing job succeeded
    assert check(m, 2500.0, {}) is True
    m.failed("t", 2, created_at=2450.0)
    assert check(m, 2500.0, {}) is True  # failing, but not for long yet
    assert check(m, 3400.0, {}) is False
    assert m.healthy(3400.0) is False
    m.forget("t", 2)
    assert check(m, 3400.0, {}, slow=True) is False  # a job runs past max_execute_time
    assert check(m, 3400.0, {}) is True


def test_a_failing_job_done_elsewhere_no_longer_counts() -> None:
    """Health follows the store: a job that failed here and was done by another worker
    (or deleted) is forgotten at the next check, which asks the store about it."""
    m = Monitor(grace=0.0, allowed_error_time=10.0)
    m.failed("t", 1, created_at=0.0)
    m.failed("t", 2, created_at=5.0)
    m.failed("t", 3, created_at=95.0)
    assert m.suspects(100.0, {}, 100) == (False, [("t", 1), ("t", 2)])  # old ones, oldest first
    assert m.suspects(100.0, {}, 1).jobs == [("t", 1)]  # the oldest `limit`
    assert check(m, 100.0, {}) is False  # both still in the store
    assert check(m, 100.0, {}, gone=frozenset({1})) is False  # 2 still is
    assert m.suspects(100.0, {}, 100).jobs == [("t", 2)]  # 1 was forgotten
    assert check(m, 100.0, {}, gone=frozenset({2})) is True
    assert m.suspects(100.0, {}, 100).jobs == []
    assert check(m, 200.0, {}) is False  # 3 is old now


def test_buried_jobs_the_store_reports_count_for_health() -> None:
    m = Monitor(grace=0.0, allowed_error_time=10.0)
    assert m.suspects(100.0, {"t": [(5, 50.0)]}, 100) == (True, [])  # buried: not asked
    assert check(m, 100.0, {"t": [(5, 50.0)]}) is False
    assert check(m, 100.0, {"t": [(6, 95.0)]}) is False  # 5 may still be there
    assert check(m, 100.0, {"t": [(6, 95.0)]}, gone=frozenset({5})) is True  # kicked, done


def test_retry_stats_say_failures_per_hundred_done() -> None:
    m = Monitor()
    for i in range(4):
        m.done("t", i, i == 0, 0.0, 0.0)
    m.failed("t", 0, 0.0)
    assert m.retry_stats() == {"t": {"ok": 4, "retried_ok": 1, "failures": 1, "buried": 0,
                                     "deferred": 0, "retry_percentage": 25.0}}


def _refused() -> StorageError:
    return StorageError("cannot write the journal: no space left on device")


def test_an_outcome_refused_is_retried_with_a_bounded_backoff() -> None:
    job = JobView(7, "q", b"", 0, (), 0.0, 0.0)
    for ttr, expected in ((0.0, [0.1, 0.2, 1 / 3, 1 / 3, 1 / 3]),  # unknown: as 1 s
                          (30.0, [0.1, 0.2, 0.4, 0.8, 1.0])):
        rec = Recorder(job, Delete(), _refused())
        waits = []
        for _ in range(5):
            waits.append(rec.wait(ttr))
            rec.failed(_refused())
        assert waits == pytest.approx(expected)
        assert rec.recorded(9) == 9


def test_an_outcome_is_given_up_when_the_job_or_source_is_gone() -> None:
    job = JobView(7, "q", b"", 0, (), 0.0, 3.0)
    rec = Recorder(job, Delete(), _refused())
    for gone in (JobNotFoundError("gone"), ClosedError("closed"), ConnectionResetError(),
                 ValueError("a bug")):
        assert not may_retry_record(gone)
        with pytest.raises(type(gone)):
            Recorder(job, Delete(), gone)
        with pytest.raises(type(gone)):
            rec.failed(gone)
    assert may_retry_record(_refused())
