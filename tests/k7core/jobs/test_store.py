"""JobStore unit tests, on real directories: snapshots and their fallback, the directory
lock, use after close, bad input, blocking reserves and what wakes them, the timer, threads,
disk use under churn, reopening a million jobs.

A reserve blocked in another thread is known to be asleep from the store's count of
sleeping reservers (``_waiters``, read in a loop: nothing signals it to the test); it is
then woken by the event under test, and its return time (``time.monotonic()``) proves it
woke because of the event: well before its own timeout, and for a deadline not before it.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import k7core
from k7core.jobs import (
    DependencyError,
    InvalidJobError,
    Job,
    JobNotFoundError,
    JobOwner,
    JobState,
    JobStore,
)
from k7core.jobs._files import JOURNAL, list_snapshots
from k7core.jobs._store import JOURNAL_SEGMENT
from tests._queuehelp import (
    check_listed,
    close_cases,
    expect_known,
    public_names,
    run_python,
    wait_until,
)
from tests.k7core.jobs._storehelp import churn, everything, journal_end

DEADLINE = 30.0
"""A blocked reserve's own timeout: a wake-up must come well before it."""
PROMPT = 3.0
"""How soon after its cause a wake-up must come (generous: a loaded 2-core machine)."""


def disk_bytes(path: Path) -> int:
    """Blocks in use under ``path`` (preallocated segments count whole); a file the
    snapshotter deletes meanwhile counts nothing."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


# ---------------------------------------------------------------------- snapshots


def _store_with_two_snapshots(path: Path) -> tuple[int, int, list[int]]:
    """A store whose journal was trimmed once, with two snapshots (the older one in the
    second journal segment) and records after the newest. Returns (older, newer, the ids
    to look at: every live job and some deleted ones)."""
    with JobStore(path, snapshot_bytes=1 << 40) as store:  # explicit snapshots only
        keep = [store.put(b"keep-%d" % i, tube="t", priority=i % 3) for i in range(40)]
        gone = store.put(b"deleted before the older snapshot")
        store.delete(gone)
        with store.owner() as me:
            for k in range(3):
                job = me.reserve(("t",), timeout=0)
                assert job is not None
                me.bury(job.id, error=f"failed {k}")
            job = me.reserve(("t",), timeout=0)
            assert job is not None
            me.release(job.id, delay=3600, error="later")
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        older = store.snapshot()  # trims the first segment
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.delete(keep[20])
        late = store.put(b"late", tube="u", key="k", depends_on=[keep[21]])
        newer = store.snapshot()  # keeps the journal from `older`
        store.kick("t", 1)
        store.delete(keep[22])
        last = store.put(b"after the newest snapshot", tube="u")
    assert JOURNAL_SEGMENT < older < JOURNAL_SEGMENT * 2 < newer
    return older, newer, [*keep, gone, late, last]


def test_corrupt_newest_snapshot_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "store"
    older, newer, ids = _store_with_two_snapshots(path)
    assert [o for o, _ in list_snapshots(path)] == [newer, older]
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        earliest = q.earliest()
    assert 0 < earliest <= older, "the journal is trimmed, but not past the older snapshot"
    with JobStore(path) as store:
        assert store.skipped_snapshots == []
        expected = everything(store, ids)
    assert expected["len"] == 40  # 40 kept, two deleted, late and last added
    assert [i for i, job in expected["jobs"].items() if job is None] == [ids[20], ids[22],
                                                                          ids[40]]
    newest = path / f"snapshot-{newer:020d}.k7jobs"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40
    newest.write_bytes(bytes(data))
    with JobStore(path) as store:
        assert [(p, "CRC32C" in why) for p, why in store.skipped_snapshots] == [(newest, True)]
        assert everything(store, ids) == expected
        # the kick after the newest snapshot took the first buried job
        assert [j.errors for j in store.errors("t")] == [("failed 1",), ("failed 2",)]
        # the next snapshot keeps the readable older one as its backup, not the damaged one
        third = store.snapshot()
    assert [o for o, _ in list_snapshots(path)] == [third, older]
    with JobStore(path) as store:
        assert store.skipped_snapshots == []
        assert everything(store, ids) == expected


def test_both_snapshots_corrupt_is_data_loss_not_silence(tmp_path: Path) -> None:
    """With the journal trimmed, no readable snapshot means mutations are missing: open
    says so instead of rebuilding a partial state."""
    path = tmp_path / "store"
    _store_with_two_snapshots(path)
    for _, file in list_snapshots(path):
        data = bytearray(file.read_bytes())
        data[9] ^= 0xFF  # the version field
        file.write_bytes(bytes(data))
    with pytest.raises(k7core.DataLossError):
        JobStore(path)
    assert not [t for t in threading.enumerate() if t.name.startswith("k7-jobs-")]


def test_snapshot_and_the_snapshotter_run_one_at_a_time(tmp_path: Path) -> None:
    """snapshot() from several threads while the background snapshotter runs often: no
    call fails, no background snapshot fails, and the store reopens from a whole one."""
    path = tmp_path / "store"
    failures: list[BaseException] = []
    stop = threading.Event()
    with JobStore(path, snapshot_bytes=512) as store:

        def snapshots() -> None:
            while not stop.is_set():
                try:
                    store.snapshot()
                except BaseException as exc:
                    failures.append(exc)
                    return

        threads = [threading.Thread(target=snapshots) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(6000):
                job_id = store.put(b"x" * 50)
                if i % 3:
                    store.delete(job_id)
                if store.snapshot_error is not None:
                    failures.append(store.snapshot_error)
                    break
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert failures == []
        n = len(store)
    with JobStore(path) as store:
        assert store.skipped_snapshots == []
        assert len(store) == n == 2000


# ---------------------------------------------------------------------- the lock

_TRY_OPEN = """
import sys
import k7core
from k7core.jobs import JobStore
try:
    JobStore(sys.argv[1]).close()
    print("opened")
except k7core.K7Error as exc:
    print(type(exc).__name__)
"""


def test_second_store_on_the_directory_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with JobStore(path) as store:
        job_id = store.put(b"mine")
        with pytest.raises(k7core.QueueLockedError):
            JobStore(path)
        assert run_python(_TRY_OPEN, str(path)).split() == ["QueueLockedError"]
        # the refused opens left the first store working, with its own two threads only
        assert store.peek(job_id) is not None
        store.put(b"more")
        mine = [t for t in threading.enumerate() if t.name.startswith("k7-jobs-")]
        assert len(mine) == 2, mine
    assert run_python(_TRY_OPEN, str(path)).split() == ["opened"]


# ---------------------------------------------------------------------- use after close


@dataclass
class Scene:
    """A store with one job in each state; ``me`` has reserved ``reserved``."""

    store: JobStore
    me: JobOwner
    ready: int
    reserved: int
    buried: int
    delayed: int


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    with JobStore(tmp_path / "store", fsync="flush") as store:
        me = store.owner()
        buried = store.put(b"buried", priority=0)
        job = me.reserve(timeout=0)
        assert job is not None and job.id == buried
        me.bury(buried, error="boom")
        reserved = store.put(b"reserved", priority=1)
        job = me.reserve(timeout=0)
        assert job is not None and job.id == reserved
        ready = store.put(b"ready", priority=2)
        delayed = store.put(b"delayed", delay=3600)
        yield Scene(store, me, ready, reserved, buried, delayed)
        me.close()


Call = Callable[[Scene], object]

CALLS: dict[str, dict[str, Call]] = {
    "JobStore": {
        "put": lambda s: s.store.put(b"x"),
        "mark": lambda s: s.store.mark("relay"),
        "forget": lambda s: s.store.forget("default", ["k"]),
        "remembered": lambda s: s.store.remembered("default"),
        "group_progress": lambda s: s.store.group_progress("default", "g"),
        "groups": lambda s: s.store.groups("default"),
        "forget_group": lambda s: s.store.forget_group("default", "g"),
        "delete": lambda s: s.store.delete(s.ready),
        "kick": lambda s: s.store.kick("default", 1),
        "kick_job": lambda s: s.store.kick_job(s.buried),
        "pause_tube": lambda s: s.store.pause_tube("default", 1),
        "owner": lambda s: s.store.owner().close(),
        "peek": lambda s: s.store.peek(s.ready),
        "peek_ready": lambda s: s.store.peek_ready(),
        "find": lambda s: s.store.find("default", "k"),
        "peek_delayed": lambda s: s.store.peek_delayed(),
        "peek_buried": lambda s: s.store.peek_buried(),
        "errors": lambda s: s.store.errors(),
        "tubes": lambda s: s.store.tubes(),
        "job_stats": lambda s: s.store.job_stats(s.ready),
        "tube_stats": lambda s: s.store.tube_stats(),
        "stats": lambda s: s.store.stats(),
        "overview": lambda s: s.store.overview(),
        "snapshot": lambda s: s.store.snapshot(),
        "counters": lambda s: s.store.counters(),
        "batch": lambda s: s.store.batch().__enter__(),
        "add_ready_listener": lambda s: s.store.add_ready_listener(lambda: None),
        "ref_tube": lambda s: s.store.ref_tube("default"),
        "has_tube": lambda s: s.store.has_tube("default"),
        "__len__": lambda s: len(s.store),
    },
    "JobOwner": {
        "reserve": lambda s: s.me.reserve(timeout=0),
        "reserve_job": lambda s: s.me.reserve_job(s.ready),
        "delete": lambda s: s.me.delete(s.reserved),
        "release": lambda s: s.me.release(s.reserved, delay=1, error="again"),
        "bury": lambda s: s.me.bury(s.reserved, error="no"),
        "touch": lambda s: s.me.touch(s.reserved),
        "reserved": lambda s: s.me.reserved(),
        "time_left": lambda s: s.me.time_left(),
    },
}

STAY_READABLE: dict[str, dict[str, str]] = {
    "JobStore": {
        "close": "idempotent (test_close_is_idempotent)",
        "closed": "tells whether the store is closed",
        "path": "the directory given to the constructor: plain data",
        "fsync": "an option the store was opened with: plain data",
        "snapshot_error": "the last background snapshot's failure: plain data",
        "skipped_snapshots": "what open found: plain data",
        "recovery_events": "what open did: plain data",
        "remove_ready_listener": "undoing a registration: a server stopping after the store",
        "unref_tube": "a no-op once closed: a server's connections end after the store",
    },
    "JobOwner": {
        "close": "idempotent (test_close_is_idempotent)",
        "closed": "tells whether the owner is closed",
    },
}

#: (kind, member, closer) -> (raised instead, why): strict xfails, see test_closed.py.
KNOWN: dict[tuple[str, str, str], tuple[type[BaseException] | None, str]] = {}

CLASSES: dict[str, tuple[type, list[str]]] = {
    "JobStore": (JobStore, ["close"]),
    "JobOwner": (JobOwner, ["close", "store.close"]),
}


def _target(s: Scene, kind: str) -> JobStore | JobOwner:
    return s.store if kind == "JobStore" else s.me


def test_the_tables_name_every_member(scene: Scene) -> None:
    for kind, (cls, _) in CLASSES.items():
        names = set(public_names(cls)) | {"__len__"} & set(dir(cls))
        names |= {n for n in vars(_target(scene, kind)) if not n.startswith("_")}
        assert set(CALLS[kind]) | set(STAY_READABLE[kind]) == names, names ^ (
            set(CALLS[kind]) | set(STAY_READABLE[kind]))
        assert not set(CALLS[kind]) & set(STAY_READABLE[kind])


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in CALLS for n in CALLS[k]])
def test_calls_work_while_open(scene: Scene, kind: str, name: str) -> None:
    CALLS[kind][name](scene)


@pytest.mark.parametrize(
    ("kind", "name", "closer"),
    [*close_cases(CLASSES), pytest.param("JobStore", "__len__", "close", id="JobStore.len")])
def test_use_after_close(
    scene: Scene, kind: str, name: str, closer: str, request: pytest.FixtureRequest
) -> None:
    obj = _target(scene, kind)
    readable = STAY_READABLE[kind].get(name)
    call = CALLS[kind].get(name)
    check_listed(kind, name, readable, call)
    expect_known(request, KNOWN.get((kind, name, closer)))
    if closer == "store.close":
        scene.store.close()
    else:
        obj.close()
    if readable:
        getattr(obj, name)
        assert obj.closed is True
        return
    assert call is not None
    with pytest.raises(k7core.ClosedError):
        call(scene)


def test_close_is_idempotent(scene: Scene) -> None:
    scene.me.close()
    scene.me.close()
    other = scene.store.owner()
    scene.store.close()
    scene.store.close()
    other.close()  # after its store: nothing to do, no error
    assert scene.store.closed and scene.me.closed and other.closed
    assert not [t for t in threading.enumerate() if t.name.startswith("k7-jobs-")]


# ---------------------------------------------------------------------- bad input

BAD: dict[str, Call] = {
    "tube ''": lambda s: s.store.put(b"x", tube=""),
    "tube '-x'": lambda s: s.store.put(b"x", tube="-x"),
    "tube with a space": lambda s: s.store.put(b"x", tube="a b"),
    "tube not ASCII": lambda s: s.store.put(b"x", tube="é"),
    "tube of 201": lambda s: s.store.put(b"x", tube="t" * 201),
    "tube not a str": lambda s: s.store.put(b"x", tube=5),  # type: ignore[arg-type]
    "priority -1": lambda s: s.store.put(b"x", priority=-1),
    "priority 2**32": lambda s: s.store.put(b"x", priority=2**32),
    "priority 1.5": lambda s: s.store.put(b"x", priority=1.5),  # type: ignore[arg-type]
    "priority True": lambda s: s.store.put(b"x", priority=True),
    "priority '1'": lambda s: s.store.put(b"x", priority="1"),  # type: ignore[arg-type]
    "delay -1": lambda s: s.store.put(b"x", delay=-1),
    "delay nan": lambda s: s.store.put(b"x", delay=math.nan),
    "delay inf": lambda s: s.store.put(b"x", delay=math.inf),
    "delay 2**32": lambda s: s.store.put(b"x", delay=2**32),
    "delay '1'": lambda s: s.store.put(b"x", delay="1"),  # type: ignore[arg-type]
    "ttr -1": lambda s: s.store.put(b"x", ttr=-1),
    "ttr nan": lambda s: s.store.put(b"x", ttr=math.nan),
    "body str": lambda s: s.store.put("text"),  # type: ignore[arg-type]
    "body None": lambda s: s.store.put(None),  # type: ignore[arg-type]
    "body int": lambda s: s.store.put(5),  # type: ignore[arg-type]
    "body past a journal segment": lambda s: s.store.put(bytes(JOURNAL_SEGMENT)),
    "key of 1025 bytes": lambda s: s.store.put(b"x", key="k" * 1025),
    "key not a str": lambda s: s.store.put(b"x", key=5),  # type: ignore[arg-type]
    "key not UTF-8": lambda s: s.store.put(b"x", key="\ud800"),
    "depends_on a str": lambda s: s.store.put(b"x", depends_on="12"),  # type: ignore[arg-type]
    "depends_on None item": lambda s: s.store.put(b"x", depends_on=[None]),  # type: ignore[list-item]
    "depends_on 1-tuple": lambda s: s.store.put(b"x", depends_on=[(1,)]),  # type: ignore[list-item]
    "depends_on float": lambda s: s.store.put(b"x", depends_on=[1.0]),  # type: ignore[list-item]
    "depends_on bad tube": lambda s: s.store.put(b"x", depends_on=[("a b", "k")]),
    "depends_on missing id": lambda s: s.store.put(b"x", depends_on=[s.ready, 10**9]),
    "depends_on missing key": lambda s: s.store.put(b"x", depends_on=[("default", "nokey")]),
    "remember without a key": lambda s: s.store.put(b"x", remember=True),
    "remember not a bool": lambda s: s.store.put(b"x", key="k", remember=1),  # type: ignore[arg-type]
    "mark not a pair": lambda s: s.store.put(b"x", mark="relay"),  # type: ignore[arg-type]
    "mark of 3": lambda s: s.store.put(b"x", mark=("relay", 1, 2)),  # type: ignore[arg-type]
    "mark name ''": lambda s: s.store.put(b"x", mark=("", 1)),
    "mark name not a str": lambda s: s.store.put(b"x", mark=(5, 1)),  # type: ignore[arg-type]
    "mark position -1": lambda s: s.store.put(b"x", mark=("relay", -1)),
    "mark position 2**64": lambda s: s.store.put(b"x", mark=("relay", 2**64)),
    "mark position 1.0": lambda s: s.store.put(b"x", mark=("relay", 1.0)),  # type: ignore[arg-type]
    "mark position True": lambda s: s.store.put(b"x", mark=("relay", True)),
    "mark on a bad put": lambda s: s.store.put("x", mark=("relay", 1)),  # type: ignore[arg-type]
    "mark read bad name": lambda s: s.store.mark(""),
    "forget bad tube": lambda s: s.store.forget("a b", ["k"]),
    "forget a str": lambda s: s.store.forget("default", "k"),
    "forget bad key": lambda s: s.store.forget("default", ["k", 5]),  # type: ignore[list-item]
    "remembered bad tube": lambda s: s.store.remembered(""),
    "remembered bad prefix": lambda s: s.store.remembered("default", 5),  # type: ignore[arg-type]
    "group ''": lambda s: s.store.put(b"x", group=""),
    "group not a str": lambda s: s.store.put(b"x", group=5),  # type: ignore[arg-type]
    "group of 1025 bytes": lambda s: s.store.put(b"x", group="g" * 1025),
    "group_progress bad tube": lambda s: s.store.group_progress("a b", "g"),
    "group_progress bad group": lambda s: s.store.group_progress("default", ""),
    "forget_group bad group": lambda s: s.store.forget_group("default", "\ud800"),
    "release priority -1": lambda s: s.me.release(s.reserved, priority=-1),
    "release delay -1": lambda s: s.me.release(s.reserved, delay=-1),
    "release error of 4097": lambda s: s.me.release(s.reserved, error="e" * 4097),
    "release error not a str": lambda s: s.me.release(s.reserved, error=5),  # type: ignore[arg-type]
    "bury priority 2**32": lambda s: s.me.bury(s.reserved, priority=2**32),
    "bury error not UTF-8": lambda s: s.me.bury(s.reserved, error="\ud800"),
    "kick bound -1": lambda s: s.store.kick("default", -1),
    "kick bound '1'": lambda s: s.store.kick("default", "1"),  # type: ignore[arg-type]
    "kick tube ''": lambda s: s.store.kick("", 1),
    "pause -1": lambda s: s.store.pause_tube("default", -1),
    "pause bad tube": lambda s: s.store.pause_tube("a b", 1),
    "reserve bad tube": lambda s: s.me.reserve(("default", "a b"), timeout=0),
    "peek_ready bad tube": lambda s: s.store.peek_ready("a b"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_refused_and_stores_nothing(scene: Scene, name: str) -> None:
    path = scene.store.path
    ids = [scene.ready, scene.reserved, scene.buried, scene.delayed]
    before = everything(scene.store, ids), journal_end(path), scene.me.reserved()
    with pytest.raises(InvalidJobError) as info:
        BAD[name](scene)
    assert isinstance(info.value, k7core.K7Error)
    assert (name.startswith("depends_on missing")) == isinstance(info.value, DependencyError)
    assert (everything(scene.store, ids), journal_end(path), scene.me.reserved()) == before
    assert scene.store.stats()["total-jobs"] == 4


# ---------------------------------------------------------------------- blocking reserves


class Reserver:
    """``owner.reserve(tubes, timeout)`` in a thread of its own; records what it returned
    (or raised) and when (``time.monotonic()``)."""

    def __init__(self, store: JobStore, owner: JobOwner, tubes: tuple[str, ...] = ("default",),
                 timeout: float | None = DEADLINE) -> None:
        self.store = store
        self.result: Job | BaseException | None = None
        self.returned_at = math.inf
        self.done = threading.Event()
        self.started_at = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(owner, tubes, timeout))
        self.thread.start()

    def _run(self, owner: JobOwner, tubes: tuple[str, ...], timeout: float | None) -> None:
        try:
            self.result = owner.reserve(tubes, timeout=timeout)
        except BaseException as exc:
            self.result = exc
        finally:
            self.returned_at = time.monotonic()
            self.done.set()

    def wait_asleep(self) -> None:
        """Return once the reserve sleeps in the store (it found nothing to take)."""
        wait_until(lambda: self.store._waiters == 1 or self.done.is_set(), DEADLINE,
                   "the reserve to sleep")
        assert not self.done.is_set(), f"the reserve returned at once: {self.result!r}"

    def job(self) -> Job:
        assert self.done.wait(DEADLINE + 10)
        self.thread.join()
        assert isinstance(self.result, Job), self.result
        return self.result


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "store", fsync="flush") as s:
        yield s


def _woken_by(store: JobStore, cause: Callable[[], int], *,
              setup: Callable[[], None] = lambda: None, tubes: tuple[str, ...] = ("default",)
              ) -> Job:
    """A reserve asleep on ``tubes`` (after ``setup``), then ``cause()`` (which returns the
    id the reserve must get): the reserve returns that job within PROMPT seconds."""
    with store.owner() as waiter:
        setup()
        r = Reserver(store, waiter, tubes)
        r.wait_asleep()
        t0 = time.monotonic()
        expected = cause()
        job = r.job()
        assert job.id == expected
        assert r.returned_at - t0 < PROMPT, (r.returned_at - t0, "woke late: not by the event")
        assert job.state is JobState.RESERVED and waiter.reserved() == [job.id]
        waiter.delete(job.id)
    return job


def then(call: Callable[[], object], job_id: int) -> Callable[[], int]:
    """A cause for :func:`_woken_by`: ``call()``, after which ``job_id`` is expected."""
    return lambda: (call(), job_id)[1]


def test_reserve_wakes_on_put(store: JobStore) -> None:
    _woken_by(store, lambda: store.put(b"now", tube="b"), tubes=("a", "b"))


def test_reserve_wakes_on_release(store: JobStore) -> None:
    with store.owner() as first:
        job_id = store.put(b"j")
        assert first.reserve(timeout=0) is not None
        _woken_by(store, then(lambda: first.release(job_id), job_id))


def test_reserve_wakes_on_kick_and_kick_job(store: JobStore) -> None:
    with store.owner() as first:
        a, b = store.put(b"a"), store.put(b"b")
        for _ in range(2):
            job = first.reserve(timeout=0)
            assert job is not None
            first.bury(job.id)
        _woken_by(store, then(lambda: store.kick("default", 1), a))
        _woken_by(store, then(lambda: store.kick_job(b), b))


def test_reserve_wakes_when_a_dependency_is_deleted(store: JobStore) -> None:
    dep = store.put(b"dep", tube="other")
    job_id = store.put(b"after dep", depends_on=[dep])
    assert store.peek(job_id).state is JobState.WAITING  # type: ignore[union-attr]
    _woken_by(store, then(lambda: store.delete(dep), job_id))


def test_reserve_wakes_when_another_owner_closes(store: JobStore) -> None:
    first = store.owner()
    job_id = store.put(b"j")
    assert first.reserve(timeout=0) is not None
    _woken_by(store, then(first.close, job_id))


def test_reserve_wakes_when_a_delay_comes_due(store: JobStore) -> None:
    """Nobody calls in: the store's timer makes the job ready at its deadline."""
    delay = 0.5
    t0 = time.monotonic()
    job_id = store.put(b"later", delay=delay)
    with store.owner() as waiter:
        r = Reserver(store, waiter)
        r.wait_asleep()
        assert r.job().id == job_id
    assert delay - 0.05 <= r.returned_at - t0 < delay + PROMPT


def test_reserve_wakes_when_a_reservation_times_out(store: JobStore) -> None:
    with store.owner() as first, store.owner() as waiter:
        job_id = store.put(b"slow worker", ttr=1)
        job = first.reserve(timeout=0)
        assert job is not None
        t0 = time.monotonic()
        r = Reserver(store, waiter)
        r.wait_asleep()
        got = r.job()
        assert got.id == job_id and got.timeouts == 1 and got.reserves == 2
        assert 1.0 - 0.05 <= r.returned_at - t0 < 1.0 + PROMPT
        assert first.reserved() == []
        with pytest.raises(JobNotFoundError):
            first.delete(job_id)  # no longer its job


def test_reserve_wakes_when_a_pause_ends(store: JobStore) -> None:
    job_id = store.put(b"paused")
    store.pause_tube("default", 0.5)
    t0 = time.monotonic()
    with store.owner() as waiter:
        r = Reserver(store, waiter)
        r.wait_asleep()
        assert r.job().id == job_id
    assert 0.5 - 0.05 <= r.returned_at - t0 < 0.5 + PROMPT


def test_reserve_times_out_with_none(store: JobStore) -> None:
    with store.owner() as waiter:
        r = Reserver(store, waiter, timeout=0.3)
        assert r.done.wait(DEADLINE)
        assert r.result is None and r.returned_at - r.started_at >= 0.3


@pytest.mark.parametrize("closing", ["owner", "store"])
def test_a_sleeping_reserve_ends_when_closed(store: JobStore, closing: str) -> None:
    waiter = store.owner()
    r = Reserver(store, waiter)
    r.wait_asleep()
    t0 = time.monotonic()
    (waiter if closing == "owner" else store).close()
    assert r.done.wait(DEADLINE)
    assert isinstance(r.result, k7core.ClosedError), r.result
    assert r.returned_at - t0 < PROMPT


def test_the_timer_applies_deadlines_with_nobody_calling_in(store: JobStore) -> None:
    """``peek`` applies no deadline: only the timer can change what it shows."""
    delayed = store.put(b"d", delay=0.3)
    reserved = store.put(b"r", ttr=1)
    with store.owner() as me:
        assert me.reserve(timeout=0) is not None

        def state(job_id: int) -> JobState:
            job = store.peek(job_id)
            assert job is not None
            return job.state

        assert state(delayed) is JobState.DELAYED and state(reserved) is JobState.RESERVED
        wait_until(lambda: state(delayed) is JobState.READY, 10, "the delay to run out")
        wait_until(lambda: state(reserved) is JobState.READY, 10, "the ttr to run out")
        assert store.peek(reserved).timeouts == 1  # type: ignore[union-attr]
        assert me.reserved() == []


class JumpClock:
    """A wall clock a test moves by hand (a clock step: NTP, a suspended machine);
    counts the reads of the store's timer thread."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.timer_reads = 0

    def __call__(self) -> float:
        if threading.current_thread().name.startswith("k7-jobs-timer-"):
            self.timer_reads += 1
        return self.now


def test_a_clock_jump_wakes_a_reserve_waiting_for_a_delay(tmp_path: Path) -> None:
    """The timer sleeps for a distance read on the clock; when the clock then jumps past a
    delayed job's deadline, the waiting reserve gets the job without waiting out that
    distance (an hour here), and with no timeout of its own to fall back on."""
    clock = JumpClock()
    with JobStore(tmp_path / "store", clock=clock) as store, store.owner() as waiter:
        wait_until(lambda: clock.timer_reads >= 1, DEADLINE, "the timer to start")
        store.peek(0)  # the lock: the timer sleeps (no deadline yet)
        reads = clock.timer_reads
        job_id = store.put(b"in an hour", delay=3600)
        r = Reserver(store, waiter, timeout=None)
        r.wait_asleep()
        # the timer woke for the put, read the clock (advance, then the wait) and sleeps
        wait_until(lambda: clock.timer_reads >= reads + 2, DEADLINE, "the timer to rearm")
        store.peek(0)
        clock.now += 3601
        assert r.job().id == job_id


# ---------------------------------------------------------------------- threads


@pytest.mark.parametrize(("fsync", "per_thread"), [("flush", 3000), ("sync", 300)])
def test_threads_put_reserve_delete(tmp_path: Path, fsync: str, per_thread: int) -> None:
    """4 producers put, 4 consumers reserve and delete, concurrently; each consumer stops
    at a stop job (least urgent, put after every real one). Every job is taken and deleted
    once, ids are distinct, and nothing is left (nor after reopening)."""
    path = tmp_path / "store"
    producers = consumers = 4
    put_ids: list[list[int]] = [[] for _ in range(producers)]
    taken: list[list[int]] = [[] for _ in range(consumers)]
    errors: list[BaseException] = []
    start = threading.Barrier(producers + consumers)
    with JobStore(path, fsync=fsync, snapshot_bytes=64 << 10) as store:

        def produce(k: int) -> None:
            try:
                start.wait()
                for i in range(per_thread):
                    put_ids[k].append(store.put(b"%d-%d" % (k, i), tube="work",
                                                priority=i % 7))
            except BaseException as exc:
                errors.append(exc)

        def consume(k: int) -> None:
            try:
                with store.owner() as me:
                    start.wait()
                    while True:
                        job = me.reserve(("work",), timeout=DEADLINE)
                        assert job is not None
                        me.delete(job.id)
                        if job.body == b"stop":
                            return
                        taken[k].append(job.id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
        threads += [threading.Thread(target=consume, args=(k,)) for k in range(consumers)]
        for t in threads:
            t.start()
        for t in threads[:producers]:
            t.join()
        for _ in range(consumers):
            store.put(b"stop", tube="work", priority=2**32 - 1)
        for t in threads:
            t.join()
        assert errors == []
        puts = [i for ids in put_ids for i in ids]
        deletes = [i for ids in taken for i in ids]
        assert len(set(puts)) == len(puts) == producers * per_thread
        assert sorted(deletes) == sorted(puts)
        assert len(store) == 0 and store.snapshot_error is None
        stats = store.stats()
        assert stats["total-jobs"] == producers * per_thread + consumers
        assert stats["current-jobs-ready"] == stats["current-jobs-reserved"] == 0
    with JobStore(path) as store:
        assert len(store) == 0 and store.skipped_snapshots == []
        assert store.put(b"next") > max(puts)


# ---------------------------------------------------------------------- disk and size


def test_disk_use_follows_live_jobs_not_history(tmp_path: Path) -> None:
    """200,000 put + delete cycles of 2 KiB bodies (about 430 MB of journal history) over
    100 live jobs, ``snapshot_bytes`` 1 MiB. The background snapshots trim the journal as
    they go, so the directory stays within a number of journal segments (sampled every
    10,000 cycles), well below the history; two explicit snapshots then leave the segment
    being written and its spare.

    The background snapshots lag behind a writer at full speed by how much the machine lets
    them run (each one replays the journal since the previous one, sharing the GIL with the
    writer; a busy machine starves them), so each sample first waits for the snapshot due
    then to be written: the bound is on what they trim, not on a race. 16 segments stays
    loose: a store that never trimmed would hold the whole history."""
    path = tmp_path / "store"
    cycles, live, body = 200_000, 100, b"b" * 2048
    samples = []
    with JobStore(path, snapshot_bytes=1 << 20) as store:
        kept = [store.put(body, tube="live") for _ in range(live)]
        for i in range(cycles):
            store.delete(store.put(body))
            if i % 10_000 == 0:
                wait_until(lambda: not store._snapshot_due, 300,
                           "the background snapshot due to be written")
                samples.append(disk_bytes(path))
        history = journal_end(path)
        assert store.snapshot_error is None
        store.snapshot()
        kept.append(store.put(body, tube="live"))
        store.snapshot()  # trims the journal below the first of the two
        final = disk_bytes(path)
    snapshots = 2 * (live + 1) * (len(body) + 200)
    bound = 16 * JOURNAL_SEGMENT + snapshots
    print(f"\ndisk: history {history / 1e6:.0f} MB, peak {max(samples) / 1e6:.1f} MB (segments "
          f"of {JOURNAL_SEGMENT / 1e6:.1f} MB), after two snapshots {final / 1e6:.1f} MB; "
          f"samples (MB): {[round(n / 1e6) for n in samples]}")
    assert history > 1.5 * bound  # the bound is well below the history
    assert max(samples) <= bound
    assert final <= 3 * JOURNAL_SEGMENT + snapshots
    with JobStore(path) as store:
        assert len(store) == live + 1 and store.peek(kept[-1]) is not None


MILLION = 1_000_000


@pytest.mark.slow
def test_reopen_a_million_jobs(tmp_path: Path) -> None:
    """Put a million jobs (the snapshotter writes one snapshot meanwhile, at 64 MiB of
    journal), close, reopen: from that snapshot and the journal after it; then reopen again
    after an explicit snapshot (the snapshot alone)."""
    path = tmp_path / "store"
    t0 = time.perf_counter()
    with JobStore(path) as store:
        put = store.put
        for i in range(MILLION):
            last_id = put(b"%d" % i)
    wrote = time.perf_counter() - t0
    t1 = time.perf_counter()
    with JobStore(path) as store:
        reopen = time.perf_counter() - t1
        assert len(store) == MILLION and store.skipped_snapshots == []
        first = store.peek(1)
        assert first is not None and first.body == b"0" and store.peek_ready() == first
        t2 = time.perf_counter()
        store.snapshot()
        snapshot = time.perf_counter() - t2
    t3 = time.perf_counter()
    with JobStore(path) as store:
        reopen_snapshot = time.perf_counter() - t3
        assert len(store) == MILLION
        last = store.peek(last_id)
    print(f"\n1M jobs: puts + close {wrote:.1f} s, reopen (snapshot + journal) {reopen:.2f} s, "
          f"explicit snapshot {snapshot:.1f} s, reopen (snapshot only) {reopen_snapshot:.2f} s")
    assert last is not None and last.body == b"%d" % (MILLION - 1)


def test_a_bad_timeout_is_an_invalid_job_error(tmp_path: Path) -> None:
    with JobStore(tmp_path / "s") as store, store.owner() as me:
        for bad in (-1, "1", float("nan")):
            with pytest.raises(InvalidJobError):
                me.reserve(timeout=bad)  # type: ignore[arg-type]


def test_records_stay_out_of_the_cycle_collector(tmp_path: Path) -> None:
    """A store of many jobs does not make the collector's walks longer: its records are
    untracked (the pauses of a full collection grew with the live jobs before)."""
    with JobStore(tmp_path / "s") as store:
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(20_000):
            store.put(b"x")
        gc.collect()
        assert len(gc.get_objects()) - before < 2_000


def test_a_closed_store_is_freed_even_with_reservations_held(tmp_path: Path) -> None:
    """Untracked records refer to their owner while reserved; close() drops the records, so
    an owner left open cannot keep a closed store (and all its jobs) alive in a cycle."""
    store = JobStore(tmp_path / "s")
    store.put(b"x")
    me = store.owner()
    assert me.reserve(timeout=0) is not None
    store.close()
    gone = weakref.ref(store)
    del store, me
    gc.collect()
    assert gone() is None
