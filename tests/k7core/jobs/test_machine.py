"""JobMachine rule by rule: checks, ordering, owners, time, kicks, keys, dependencies,
errors, stats. (test_model.py compares whole runs with the reference model.)"""

from __future__ import annotations

import math
import sys
from collections.abc import Hashable, Iterable
from typing import Any

import pytest

import k7core
from k7core.jobs import (
    DependencyError,
    InvalidJobError,
    Job,
    JobNotFoundError,
    JobState,
)
from k7core.jobs._machine import JobMachine, PutPlan

NOW = 1000.0


class Store:
    """The store's protocol, minus the journal: check, then apply with id = a counter."""

    def __init__(self) -> None:
        self.m = JobMachine()
        self.next_id = 1

    def put(self, body: bytes | bytearray | memoryview = b"x", tube: str = "default",
            priority: int = 1024, delay: float = 0, ttr: float = 60, key: str | None = None,
            depends_on: Iterable[int | tuple[str, str]] = (), now: float = NOW) -> int:
        plan = self.m.check_put(tube, body, priority, delay, ttr, key, depends_on, now)
        if isinstance(plan, int):
            return plan
        job_id = self.next_id
        self.next_id += 10
        self.m.apply_put(job_id, plan)
        return job_id

    def delete(self, job_id: int, owner: Hashable = None) -> int:
        self.m.check_delete(job_id, owner)
        return self.m.apply_delete(job_id)

    def release(self, job_id: int, owner: Hashable, priority: int = 1024, delay: float = 0,
                error: str | None = None, now: float = NOW) -> None:
        self.m.apply_release(*self.m.check_release(job_id, owner, priority, delay, error, now))

    def bury(self, job_id: int, owner: Hashable, priority: int = 1024,
             error: str | None = None) -> None:
        self.m.apply_bury(*self.m.check_bury(job_id, owner, priority, error))

    def kick(self, tube: str, bound: int) -> list[int]:
        ids = self.m.plan_kick(tube, bound)
        for job_id in ids:
            self.m.apply_kick(job_id)
        return ids

    def reserve(self, owner: Hashable = "w", tubes: Iterable[str] = ("default",),
                now: float = NOW) -> Job:
        job = self.m.reserve(owner, tubes, now)
        assert job is not None
        return job

    def state(self, job_id: int) -> JobState:
        job = self.m.peek(job_id)
        assert job is not None
        return job.state


@pytest.fixture
def s() -> Store:
    return Store()


# --- the public types ----------------------------------------------------------------------


def test_job_is_frozen_and_public(s: Store) -> None:
    s.put()
    job = s.reserve()
    assert type(job) is Job and Job.__module__ == "k7core.jobs"
    with pytest.raises(AttributeError):
        job.priority = 5  # type: ignore[misc]
    same = Job(**{name: getattr(job, name) for name in Job.__slots__})
    assert same == job and hash(same) == hash(job)
    assert JobState("reserved") is job.state is JobState.RESERVED
    assert f"{job.state}" == "reserved" and isinstance(job.state, str)


def test_errors_are_in_the_k7_tree() -> None:
    assert issubclass(JobNotFoundError, k7core.K7Error)
    assert issubclass(InvalidJobError, k7core.K7Error) and issubclass(InvalidJobError, ValueError)
    assert issubclass(DependencyError, InvalidJobError)
    assert issubclass(k7core.jobs.CorruptJobDataError, k7core.IntegrityError)


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("tube", ["x" * 200, "a-b", "(x)$;+/._", "A9"])
def test_valid_tube_names(s: Store, tube: str) -> None:
    assert s.m.peek(s.put(tube=tube)) is not None


@pytest.mark.parametrize("tube", ["", "x" * 201, "-a", "a b", "é", "a\n", b"a", None, 5])
def test_invalid_tube_names(s: Store, tube: Any) -> None:
    with pytest.raises(InvalidJobError, match="tube name"):
        s.put(tube=tube)
    with pytest.raises(InvalidJobError):
        s.m.reserve("w", [tube], NOW)
    assert len(s.m) == 0


@pytest.mark.parametrize(("arg", "value"), [
    ("priority", -1), ("priority", 2**32), ("priority", 1.0), ("priority", True),
    ("priority", "1"), ("delay", -0.5), ("delay", 2**32), ("delay", math.nan),
    ("delay", math.inf), ("delay", False), ("delay", "1"), ("ttr", -1), ("ttr", 2**32),
    ("key", 5), ("key", "é" * 513), ("key", "\ud800"), ("body", "text"), ("body", 5),
    ("depends_on", "12"), ("depends_on", 12), ("depends_on", [1.5]), ("depends_on", [("a",)]),
])
def test_bad_put_changes_nothing(s: Store, arg: str, value: Any) -> None:
    kept = s.put(key="k")
    with pytest.raises(InvalidJobError) as info:
        s.put(**{arg: value})
    assert info.value.hint
    assert len(s.m) == 1 and s.m.tube_stats("default", NOW)["total-jobs"] == 1
    assert s.m.peek(kept) is not None


def test_limits_are_inclusive(s: Store) -> None:
    job_id = s.put(priority=2**32 - 1, delay=2**32 - 1, ttr=2**32 - 1, key="é" * 512)
    job = s.m.peek(job_id)
    assert job is not None and job.priority == 2**32 - 1 and job.key == "é" * 512


def test_bodies_are_copied_to_bytes(s: Store) -> None:
    buf = bytearray(b"abc")
    job_id = s.put(body=buf)
    buf[0] = ord("z")
    job = s.m.peek(job_id)
    assert job is not None and job.body == b"abc" and type(job.body) is bytes
    job_id = s.put(body=memoryview(b"xyz")[1:])
    assert s.m.peek(job_id).body == b"yz"  # type: ignore[union-attr]


def test_ttr_below_one_becomes_one(s: Store) -> None:
    assert s.m.peek(s.put(ttr=0)).ttr == 1  # type: ignore[union-attr]
    assert s.m.peek(s.put(ttr=0.5)).ttr == 1  # type: ignore[union-attr]
    assert s.m.peek(s.put(ttr=1.5)).ttr == 1.5  # type: ignore[union-attr]


def test_bad_release_and_bury_change_nothing(s: Store) -> None:
    s.put()
    job = s.reserve()
    bads: list[dict[str, Any]] = [{"priority": -1}, {"delay": -1}, {"error": "x" * 4097},
                                  {"error": b"x"}]
    for bad in bads:
        with pytest.raises(InvalidJobError):
            s.release(job.id, "w", **bad)
    with pytest.raises(InvalidJobError):
        s.bury(job.id, "w", error="é" * 2049)
    assert s.m.peek(job.id) == job
    s.release(job.id, "w", error="é" * 2048)  # 4096 bytes: the limit


# --- order, owners, time -------------------------------------------------------------------


def test_reserve_takes_smallest_priority_then_oldest(s: Store) -> None:
    ids = [s.put(priority=p) for p in (5, 1, 5, 1, 0)]
    order = [s.reserve().id for _ in ids]
    assert order == [ids[4], ids[1], ids[3], ids[0], ids[2]]
    assert s.m.reserve("w", ("default",), NOW) is None


def test_reserve_looks_at_every_named_tube(s: Store) -> None:
    a = s.put(tube="a", priority=9)
    b = s.put(tube="b", priority=3)
    s.put(tube="c", priority=0)
    assert s.reserve(tubes=["a", "b"]).id == b
    assert s.reserve(tubes=["a", "b", "nope"]).id == a
    with pytest.raises(InvalidJobError, match="one name"):
        s.m.reserve("w", "a", NOW)


def test_only_the_owner_touches_a_reservation(s: Store) -> None:
    job_id = s.put()
    s.reserve(owner="alice")
    for call in (lambda: s.delete(job_id, "bob"), lambda: s.delete(job_id),
                 lambda: s.release(job_id, "bob"), lambda: s.bury(job_id, "bob"),
                 lambda: s.m.touch(job_id, "bob", NOW), lambda: s.m.check_kick_job(job_id)):
        with pytest.raises(JobNotFoundError) as info:
            call()
        assert info.value.job_id == job_id
    assert s.state(job_id) is JobState.RESERVED
    s.delete(job_id, "alice")
    assert s.m.peek(job_id) is None


def test_release_and_bury_need_a_reservation(s: Store) -> None:
    job_id = s.put()
    with pytest.raises(JobNotFoundError):
        s.release(job_id, "w")
    with pytest.raises(JobNotFoundError):
        s.bury(job_id, "w")
    with pytest.raises(JobNotFoundError):
        s.delete(12345)


def test_release_with_delay_and_counters(s: Store) -> None:
    job_id = s.put()
    s.reserve()
    s.release(job_id, "w", priority=7, delay=5, error="e1")
    job = s.m.peek(job_id)
    assert job is not None
    assert (job.state, job.priority, job.delay, job.ready_at, job.releases, job.reserves,
            job.errors) == (JobState.DELAYED, 7, 5, NOW + 5, 1, 1, ("e1",))
    assert s.m.next_deadline() == NOW + 5
    assert s.m.advance(NOW + 4.9) == 0
    assert s.m.advance(NOW + 5) == 1
    assert s.state(job_id) is JobState.READY and s.m.next_deadline() is None


def test_ttr_expiry_counts_a_timeout(s: Store) -> None:
    job_id = s.put(ttr=2)
    assert s.reserve().ready_at == NOW + 2
    assert s.m.next_deadline() == NOW + 2
    assert not s.m.deadline_soon("w", NOW + 0.9)
    assert s.m.deadline_soon("w", NOW + 1) and not s.m.deadline_soon("other", NOW + 1)
    s.m.touch(job_id, "w", NOW + 1.5)
    assert s.m.next_deadline() == NOW + 3.5
    assert s.m.advance(NOW + 3) == 0
    assert s.m.advance(NOW + 3.5) == 1
    job = s.m.peek(job_id)
    assert job is not None and (job.state, job.timeouts) == (JobState.READY, 1)
    assert s.m.stats(NOW)["job-timeouts"] == 1
    assert s.m.reserved_by("w") == []


def test_release_owner_returns_every_reservation_at_once(s: Store) -> None:
    ids = [s.put() for _ in range(3)]
    s.reserve(owner="a")
    s.reserve(owner="a")
    s.reserve(owner="b")
    assert s.m.reserved_by("a") == ids[:2]
    assert s.m.release_owner("a") == 2 and s.m.release_owner("a") == 0
    assert [s.state(i) for i in ids] == [JobState.READY, JobState.READY, JobState.RESERVED]
    assert s.m.peek(ids[0]).reserves == 1  # type: ignore[union-attr]
    assert s.m.peek(ids[0]).timeouts == 0  # type: ignore[union-attr]


def test_pause_stops_reserves_not_peeks(s: Store) -> None:
    job_id = s.put()
    s.m.pause_tube("default", 0, NOW)  # 0 counts as 1 s
    assert s.m.reserve("w", ["default"], NOW + 0.5) is None
    assert s.m.peek_ready("default").id == job_id  # type: ignore[union-attr]
    stats = s.m.tube_stats("default", NOW + 0.5)
    assert (stats["pause"], stats["pause-time-left"], stats["cmd-pause-tube"]) == (1, 0, 1)
    assert s.m.next_deadline() == NOW + 1
    assert s.m.advance(NOW + 1) == 1  # the tube's ready job is reservable again
    assert s.m.tube_stats("default", NOW + 1)["pause"] == 0
    assert s.reserve(now=NOW + 1).id == job_id


def test_a_pause_alone_keeps_a_tube(s: Store) -> None:
    s.m.pause_tube("quiet", 10, NOW)
    assert s.m.tubes() == ["quiet"] and s.m.has_tube("quiet")
    s.m.advance(NOW + 10)
    assert s.m.tubes() == [] and s.m.tube_stats("quiet", NOW)["cmd-pause-tube"] == 0


# --- bury, kick, errors --------------------------------------------------------------------


def test_kick_takes_buried_oldest_first_then_delayed_soonest_first(s: Store) -> None:
    ids = [s.put(priority=p) for p in (3, 2, 1)]
    for _ in ids:
        job = s.reserve()
        s.bury(job.id, "w", priority=job.priority)
    late = s.put(delay=20)
    soon = s.put(delay=10)
    assert s.m.peek_buried("default").id == ids[2]  # type: ignore[union-attr]
    assert s.kick("default", 2) == [ids[2], ids[1]]
    assert s.kick("default", 10) == [ids[0]]
    assert s.m.peek_delayed("default").id == soon  # type: ignore[union-attr]
    assert s.kick("default", 1) == [soon]
    assert s.kick("default", 1) == [late]
    assert s.kick("default", 1) == [] and s.kick("nope", 1) == []
    assert s.m.peek(late).kicks == 1  # type: ignore[union-attr]
    with pytest.raises(InvalidJobError):
        s.m.plan_kick("default", -1)


def test_kick_job_only_from_buried_or_delayed(s: Store) -> None:
    ready = s.put()
    delayed = s.put(delay=5)
    with pytest.raises(JobNotFoundError):
        s.m.check_kick_job(ready)
    s.m.check_kick_job(delayed)
    s.m.apply_kick(delayed)
    assert s.state(delayed) is JobState.READY


def test_errors_keep_the_last_sixteen(s: Store) -> None:
    job_id = s.put()
    for i in range(20):
        s.reserve()
        s.release(job_id, "w", error=f"e{i}")
    s.reserve()
    s.release(job_id, "w")  # no error: nothing added
    s.reserve()
    s.bury(job_id, "w", error="last")
    job = s.m.errors("default")[0]
    assert job.errors == (*(f"e{i}" for i in range(5, 20)), "last")
    assert (job.releases, job.buries) == (21, 1)


# --- keys and dependencies -----------------------------------------------------------------


def test_key_dedupes_per_tube_until_deleted(s: Store) -> None:
    first = s.put(key="k")
    assert s.put(key="k", body=b"other") == first
    other_tube = s.put(key="k", tube="t2")
    assert other_tube != first
    assert s.m.tube_stats("default", NOW)["total-jobs"] == 1
    s.delete(first)
    assert s.put(key="k") not in (first, other_tube)


def test_dependencies_wait_until_every_one_is_deleted(s: Store) -> None:
    a = s.put(key="a", tube="t1")
    b = s.put()
    child = s.put(depends_on=[("t1", "a"), b, b], delay=5)
    grandchild = s.put(depends_on=[child])
    job = s.m.peek(child)
    assert job is not None and (job.state, job.depends_on) == (JobState.WAITING, (a, b))
    assert s.m.counts("default")[JobState.WAITING] == 2
    assert s.m.tube_stats("default", NOW)["current-jobs-ready"] == 1  # b; waiting: no count
    assert s.m.job_stats(child, NOW)["state"] == "waiting"
    s.reserve(tubes=["default"])
    assert s.delete(a) == 0 and s.state(child) is JobState.WAITING
    assert s.delete(b, "w") == 0  # its delay makes it delayed, not ready
    assert s.state(child) is JobState.DELAYED and s.m.next_deadline() == NOW + 5
    s.m.advance(NOW + 5)
    s.reserve(now=NOW + 5)
    assert s.delete(child, "w") == 1 and s.state(grandchild) is JobState.READY


def test_missing_dependencies_are_errors(s: Store) -> None:
    gone = s.put()
    s.delete(gone)
    s.put(key="k")
    for deps in ([gone], [("default", "nope")], [("other", "k")]):
        with pytest.raises(DependencyError, match="depends_on"):
            s.put(depends_on=deps)
    assert len(s.m) == 1


def test_a_taken_key_wins_over_a_missing_dependency(s: Store) -> None:
    kept = s.put(key="k")
    assert s.put(key="k", depends_on=[999]) == kept


# --- reserve-job, stats, tubes -------------------------------------------------------------


def test_reserve_job_moves_delayed_and_buried_through_ready(s: Store) -> None:
    ready = s.put()
    delayed = s.put(delay=9)
    assert s.m.check_reserve_job(ready) is False
    assert s.m.check_reserve_job(delayed) is True
    with pytest.raises(JobNotFoundError):
        s.m.reserve_job(delayed, "w", NOW)  # not ready yet: apply_ready first
    s.m.apply_ready(delayed)
    job = s.m.reserve_job(delayed, "w", NOW)
    assert (job.state, job.reserves, job.kicks) == (JobState.RESERVED, 1, 0)
    with pytest.raises(JobNotFoundError):
        s.m.check_reserve_job(delayed)


def test_stats_fields_in_beanstalkd_order(s: Store) -> None:
    job_id = s.put(priority=5, delay=3, ttr=10, now=NOW - 7.5)
    assert list(s.m.job_stats(job_id, NOW).items()) == [
        ("id", job_id), ("tube", "default"), ("state", "delayed"), ("pri", 5), ("age", 7),
        ("delay", 3), ("ttr", 10), ("time-left", -4), ("file", 0), ("reserves", 0),
        ("timeouts", 0), ("releases", 0), ("buries", 0), ("kicks", 0)]
    assert list(s.m.tube_stats("default", NOW)) == [
        "name", "current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
        "current-jobs-delayed", "current-jobs-buried", "total-jobs", "current-using",
        "current-watching", "current-waiting", "cmd-delete", "cmd-pause-tube", "pause",
        "pause-time-left"]
    assert list(s.m.stats(NOW)) == [
        "current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
        "current-jobs-delayed", "current-jobs-buried", "job-timeouts", "total-jobs",
        "current-tubes"]
    with pytest.raises(JobNotFoundError):
        s.m.job_stats(424242, NOW)


def test_urgent_counts_ready_jobs_below_1024(s: Store) -> None:
    s.put(priority=1023)
    s.put(priority=1024)
    s.put(priority=0, delay=5)
    assert s.m.tube_stats("default", NOW)["current-jobs-urgent"] == 1
    s.reserve()
    assert s.m.stats(NOW)["current-jobs-urgent"] == 0


def test_a_tube_lives_while_it_has_jobs_or_refs(s: Store) -> None:
    s.m.ref_tube("used")
    job_id = s.put(tube="used")
    s.delete(job_id)
    stats = s.m.tube_stats("used", NOW)
    assert s.m.tubes() == ["used"] and (stats["total-jobs"], stats["cmd-delete"]) == (1, 1)
    s.m.unref_tube("used")
    assert s.m.tubes() == [] and not s.m.has_tube("used")
    assert s.m.tube_stats("used", NOW)["total-jobs"] == 0  # freed: counters start again
    with pytest.raises(InvalidJobError):
        s.m.unref_tube("used")
    for i in range(1100):  # idle records beyond the cache are dropped
        s.delete(s.put(tube=f"t{i}"))
    assert s.m.tubes() == [] and s.m.stats(NOW)["current-tubes"] == 0
    assert s.m.peek(s.put(tube="t5")) is not None


def test_oldest_ready_and_counts(s: Store) -> None:
    assert s.m.oldest_ready_created_at("default") is None
    s.put(now=NOW - 5)
    s.put(now=NOW - 9, priority=5000)
    assert s.m.oldest_ready_created_at("default") == NOW - 9
    assert s.m.counts("default")[JobState.READY] == 2
    assert s.m.counts("nope") == dict.fromkeys(JobState, 0)


def test_stale_heap_entries_are_dropped(s: Store) -> None:
    """Deleted ready jobs and ended reservations leave heap entries behind; a heap is
    rebuilt before its stale entries outnumber its valid ones (plus a margin)."""
    s.put(tube="keep")
    for _ in range(3000):
        s.delete(s.put(tube="keep"))
    assert len(s.m._tubes["keep"].ready) <= 2 * 2 + 64 + 1
    for _ in range(3000):
        s.put(tube="other", ttr=5)
        s.delete(s.reserve(tubes=["other"]).id, "w")
    assert len(s.m._reserved) <= 2 * 1 + 1024 + 1
    assert s.reserve(tubes=["keep"]).id == 1


def test_check_put_returns_a_plan_in_apply_order(s: Store) -> None:
    plan = s.m.check_put("t", b"b", 3, 2, 0.5, "k", (), NOW)
    expected: PutPlan = ("t", 3, 2, 1.0, NOW + 2, NOW, "k", (), b"b")
    assert plan == expected
    assert len(s.m) == 0


def test_dismantle_frees_every_job_and_its_heap_entries(s: Store) -> None:
    body = bytes(range(100))  # a new object: its count is this test's
    before = sys.getrefcount(body)
    for i in range(300):
        s.put(body, tube=f"t{i % 3}", delay=i % 2)
    owner = object()
    assert s.m.reserve(owner, ["t0"], NOW) is not None
    assert sys.getrefcount(body) == before + 300
    s.m.dismantle()
    assert len(s.m) == 0
    assert sys.getrefcount(body) == before


def test_remembered_keys_outlive_their_tube_record(s: Store) -> None:
    """An empty tube's record is dropped past 1024 idle tubes; its remembered keys stay."""
    plan = s.m.check_put("t0", b"x", 1, 0, 1, "k", (), NOW)
    assert not isinstance(plan, int) and s.m.check_extras("k", ("relay", 1), True) == (
        "relay", 1)
    s.m.apply_put_with(7, plan, ("relay", 1), True)
    s.delete(7)
    for i in range(1, 1100):
        s.delete(s.put(tube=f"t{i}"))
    assert "t0" not in s.m._tubes
    assert s.put(tube="t0", key="k") == 7
    assert (s.m.remembered("t0"), s.m.mark("relay")) == (["k"], 1)
    s.m.apply_forget("t0", ["k"])
    assert s.put(tube="t0", key="k") != 7


def test_dismantle_frees_remembered_keys(s: Store) -> None:
    key = "".join(["remembered", "-key"])  # a new object: its count is this test's
    before = sys.getrefcount(key)
    for job_id in range(1, 4):
        plan = s.m.check_put(f"t{job_id}", b"x", 1, 0, 1, key, (), NOW)
        assert not isinstance(plan, int)
        s.m.apply_put_with(job_id, plan, None, True)
        s.m.apply_delete(job_id)
    del plan
    assert sys.getrefcount(key) == before + 3
    s.m.dismantle()
    assert sys.getrefcount(key) == before
