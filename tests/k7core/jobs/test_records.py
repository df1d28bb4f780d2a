"""The C records of the job store (``k7core._native._fast``): ``JobRecord``, a live job, and
``JobMaker``, which copies one into a :class:`k7core.jobs.Job`."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, fields

import pytest

from k7core._native._fast import JobMaker, JobRecord
from k7core.jobs import Job, JobState


class Tube:
    def __init__(self, name: str) -> None:
        self.name = name


def record(body: bytes = b"body", key: str | None = "k") -> JobRecord:
    return JobRecord(7, Tube("t"), 3, 1.5, 60, 2000.25, 1000.5, key, (1, 2), body,
                     JobState.READY)


def test_a_record_starts_with_its_arguments_and_zero_counters() -> None:
    r = record()
    assert (r.id, r.tube.name, r.priority, r.delay, r.ttr, r.ready_at, r.created_at) == (
        7, "t", 3, 1.5, 60.0, 2000.25, 1000.5)
    assert (r.key, r.depends_on, r.body, r.state) == ("k", (1, 2), b"body", JobState.READY)
    assert (r.seq, r.pending, r.reserves, r.timeouts, r.releases, r.buries, r.kicks) == (
        0, 0, 0, 0, 0, 0, 0)
    assert r.errors == () and r.owner is None
    assert isinstance(r.ttr, float)  # an int ttr is stored as seconds (a double)


def test_a_record_is_mutable_and_keeps_64_bit_numbers() -> None:
    r = record()
    r.seq = 2**62
    r.priority = 2**32 - 1
    r.ready_at = 0
    r.owner = ("someone", 1)
    r.errors = ("boom",)
    r.state = JobState.BURIED
    assert (r.seq, r.priority, r.ready_at, r.owner, r.errors, r.state) == (
        2**62, 2**32 - 1, 0.0, ("someone", 1), ("boom",), JobState.BURIED)
    with pytest.raises(TypeError):
        r.reserves = "many"  # type: ignore[assignment]
    with pytest.raises(OverflowError):
        r.id = 2**64
    with pytest.raises(AttributeError):
        r.color = "red"  # type: ignore[attr-defined]


def test_a_record_is_not_a_gc_object_and_frees_what_it_holds() -> None:
    body = bytes(range(200))  # a new object: its count is this test's
    before = sys.getrefcount(body)
    records = [record(body) for _ in range(1000)]
    assert not gc.is_tracked(records[0])
    assert sys.getrefcount(body) == before + 1000
    del records
    assert sys.getrefcount(body) == before


@pytest.mark.parametrize("args", [
    (),
    (7, Tube("t"), 3, 1.5, 60, 0.0, 1.0, None, (), b"b"),  # no state
    ("7", Tube("t"), 3, 1.5, 60, 0.0, 1.0, None, (), b"b", JobState.READY),
    (7, Tube("t"), 3, "soon", 60, 0.0, 1.0, None, (), b"b", JobState.READY),
])
def test_a_record_refuses_wrong_arguments(args: tuple[object, ...]) -> None:
    with pytest.raises(TypeError):
        JobRecord(*args)  # type: ignore[arg-type]


def test_jobmaker_copies_every_field_of_a_record_into_a_job() -> None:
    r = record()
    r.reserves, r.timeouts, r.releases, r.buries, r.kicks = 1, 2, 3, 4, 5
    r.errors = ("e1", "e2")
    job = JobMaker(Job)(r)
    assert type(job) is Job
    assert job == Job(id=7, tube="t", priority=3, body=b"body", state=JobState.READY, ttr=60.0,
                      reserves=1, timeouts=2, releases=3, buries=4, kicks=5, created_at=1000.5,
                      key="k", depends_on=(1, 2), errors=("e1", "e2"), delay=1.5,
                      ready_at=2000.25)
    r.reserves = 9  # a copy: later changes do not show
    assert job.reserves == 1
    assert gc.is_tracked(job)
    with pytest.raises(AttributeError):  # still the frozen dataclass
        job.reserves = 3  # type: ignore[misc]


def test_jobmaker_refuses_a_type_that_is_not_a_job_and_a_call_without_a_record() -> None:
    @dataclass(frozen=True, slots=True)
    class Short:
        id: int

    with pytest.raises(TypeError, match="slots"):
        JobMaker(Short)
    renamed = type("Renamed", (), {"__slots__": tuple(  # as many slots, one name different
        "identity" if f.name == "id" else f.name for f in fields(Job))})
    with pytest.raises(TypeError, match="id"):
        JobMaker(renamed)
    with pytest.raises(TypeError):
        JobMaker(Job)(object())  # type: ignore[arg-type]
    r = record()
    del r.key
    with pytest.raises(AttributeError, match="key"):
        JobMaker(Job)(r)
