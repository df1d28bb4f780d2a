"""A real JobStore against the plain reference model (_model.py), step by step.

The store lives in a real directory (``fsync="flush"``), with a tiny ``snapshot_bytes`` so
that its background snapshotter runs every few dozen mutations, and an explicit clock
(``clock=lambda: now[0]``): time moves only when the ``tick`` rule moves it, then a read
(``stats()``) applies what fell due. Every public call is a rule: put (delays, keys,
dependencies, several tubes and priorities), reserve (``timeout=0``) and reserve-job by a
few owners, delete (by its owner or by the store), release (priority, delay, error text),
bury (error text), touch, kick, kick-job, pause, an owner closed, an explicit
``snapshot()``, and *reopen*: close the store and open the directory again, after which
reserved jobs are ready, each job's reservation counters and the counters since start are
0, and everything else is as before. After every step every job (``peek``, ``job_stats``),
every peek per tube, ``errors``, ``tube_stats``, ``stats``, ``overview``, ``tubes``, each
owner's reservations and the store's length are compared with the model's, and no
background snapshot may have failed.

``K7_STORE_MODEL_EXAMPLES`` sets the number of examples (default 300: ~20 s on the 2-core
dev machine).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from k7core.jobs import DependencyError, JobNotFoundError, JobOwner, JobState, JobStore
from tests.k7core.jobs._model import Model

TUBES = ("a", "b", "c")
OWNERS = 3
tubes = st.sampled_from(TUBES)
slots = st.integers(0, OWNERS - 1)
priorities = st.sampled_from([0, 1, 1023, 1024, 2**32 - 1])
delays = st.sampled_from([0, 0, 0, 0.5, 1, 2.5, 4])
ttrs = st.sampled_from([0, 1, 2, 3.5])
keys = st.sampled_from([None, None, "k1", "k2"])
errors = st.sampled_from([None, "boom", "é" * 3])
EXAMPLES = int(os.environ.get("K7_STORE_MODEL_EXAMPLES", "300"))
SNAPSHOT_BYTES = 1024  # a background snapshot every ~10-20 journaled mutations
START = 1_000_000.0


class StoreAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="k7-store-model-"))
        self.now = [START]
        self.store = self.open()
        self.model = Model()
        self.owners = [self.store.owner() for _ in range(OWNERS)]
        self.ids: list[int] = []
        self.reopens = 0

    def open(self) -> JobStore:
        return JobStore(self.tmp / "store", fsync="flush", snapshot_bytes=SNAPSHOT_BYTES,
                        clock=lambda: self.now[0])

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def pick_id(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from([*self.ids, 999_999]) if self.ids else st.just(7))

    def settle(self) -> None:
        """The store applies what is due after each mutation (a delete that frees a waiting
        job whose delay has passed makes it ready at once); the model does it here."""
        self.model.advance(self.now[0])

    def owned_priority(self, job_id: int, owner: JobOwner) -> int:
        """The priority a release or bury without ``priority=`` keeps (any value when
        ``owner`` has not reserved the job: both sides then refuse the call)."""
        j = self.model.owned(job_id, owner)
        return 0 if j is None else j.priority

    # --- journaled -------------------------------------------------------------------------

    @rule(tube=tubes, body=st.binary(max_size=6), priority=priorities, delay=delays, ttr=ttrs,
          key=keys, data=st.data())
    def put(self, tube: str, body: bytes, priority: int, delay: float, ttr: float,
            key: str | None, data: st.DataObject) -> None:
        deps: list[int | tuple[str, str]] = []
        for _ in range(data.draw(st.sampled_from([0, 0, 0, 1, 2]))):
            kind = data.draw(st.sampled_from(["live", "live", "any", "pair"]))
            live = list(self.model.jobs)
            if kind == "live" and live:
                deps.append(data.draw(st.sampled_from(live)))
            elif kind == "any" and self.ids:
                deps.append(data.draw(st.sampled_from(self.ids)))
            else:
                deps.append((data.draw(tubes), data.draw(st.sampled_from(["k1", "k2"]))))
        now = self.now[0]
        try:
            job_id = self.store.put(body, tube=tube, priority=priority, delay=delay, ttr=ttr,
                                    key=key, depends_on=deps)
        except DependencyError:
            try:
                self.model.put(-1, tube, body, priority, delay, ttr, key, deps, now)
            except DependencyError:
                return
            raise AssertionError("the model stores what the store refuses") from None
        if job_id in self.model.jobs:  # the key of a live job: nothing stored
            assert self.model.put(-1, tube, body, priority, delay, ttr, key, deps,
                                  now) == job_id
            return
        assert job_id > max(self.ids, default=0), "a job id was reused or went back"
        assert self.model.put(job_id, tube, body, priority, delay, ttr, key, deps,
                              now) == job_id
        self.ids.append(job_id)

    @rule(puts=st.lists(st.tuples(tubes, priorities, st.sampled_from([0, 0, 1])), min_size=1,
                        max_size=5), ttr=ttrs)
    def put_several(self, puts: list[tuple[str, int, float]], ttr: float) -> None:
        """Several plain puts: enough jobs for the orders to matter."""
        for tube, priority, delay in puts:
            job_id = self.store.put(b"", tube=tube, priority=priority, delay=delay, ttr=ttr)
            self.model.put(job_id, tube, b"", priority, delay, ttr, None, (), self.now[0])
            self.ids.append(job_id)

    @rule(slot=st.sampled_from([*range(OWNERS), None]), data=st.data())
    def delete(self, slot: int | None, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        owner = None if slot is None else self.owners[slot]
        try:
            if owner is None:
                self.store.delete(job_id)
            else:
                owner.delete(job_id)
        except JobNotFoundError:
            assert not self.model.delete(job_id, owner)
            return
        assert self.model.delete(job_id, owner)
        self.settle()

    @rule(slot=slots, priority=st.one_of(st.none(), priorities), delay=delays, error=errors,
          data=st.data())
    def release(self, slot: int, priority: int | None, delay: float, error: str | None,
                data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        owner = self.owners[slot]
        kept = self.owned_priority(job_id, owner) if priority is None else priority
        try:
            owner.release(job_id, priority=priority, delay=delay, error=error)
        except JobNotFoundError:
            assert not self.model.release(job_id, owner, kept, delay, error, self.now[0])
            return
        assert self.model.release(job_id, owner, kept, delay, error, self.now[0])

    @rule(slot=slots, priority=st.one_of(st.none(), priorities), error=errors,
          data=st.data())
    def bury(self, slot: int, priority: int | None, error: str | None,
             data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        owner = self.owners[slot]
        kept = self.owned_priority(job_id, owner) if priority is None else priority
        try:
            owner.bury(job_id, priority=priority, error=error)
        except JobNotFoundError:
            assert not self.model.bury(job_id, owner, kept, error)
            return
        assert self.model.bury(job_id, owner, kept, error)

    @rule(slot=slots, names=st.lists(tubes, min_size=1, max_size=3), error=errors)
    def reserve_and_bury(self, slot: int, names: list[str], error: str | None) -> None:
        """What a failing worker does (buried lists long enough for their order to matter)."""
        owner = self.owners[slot]
        job = owner.reserve(names, timeout=0)
        assert (job and job.id) == self.model.reserve(owner, names, self.now[0])
        if job is not None:
            owner.bury(job.id, error=error)
            assert self.model.bury(job.id, owner, job.priority, error)

    @rule(tube=tubes, bound=st.sampled_from([0, 1, 2, 10]))
    def kick(self, tube: str, bound: int) -> None:
        assert self.store.kick(tube, bound) == len(self.model.kick(tube, bound))

    @rule(data=st.data())
    def kick_job(self, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            self.store.kick_job(job_id)
        except JobNotFoundError:
            assert not self.model.kick_job(job_id)
            return
        assert self.model.kick_job(job_id)

    # --- not journaled ---------------------------------------------------------------------

    @rule(slot=slots, names=st.lists(tubes, min_size=1, max_size=3))
    def reserve(self, slot: int, names: list[str]) -> None:
        owner = self.owners[slot]
        job = owner.reserve(names, timeout=0)
        assert (job and job.id) == self.model.reserve(owner, names, self.now[0])
        if job is not None:
            assert job == self.model.peek(job.id)

    @rule(slot=slots, data=st.data())
    def reserve_job(self, slot: int, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        owner = self.owners[slot]
        try:
            job = owner.reserve_job(job_id)
        except JobNotFoundError:
            assert not self.model.reserve_job(job_id, owner, self.now[0])
            return
        assert self.model.reserve_job(job_id, owner, self.now[0])
        assert job == self.model.peek(job_id)

    @rule(slot=slots, data=st.data())
    def touch(self, slot: int, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        owner = self.owners[slot]
        try:
            owner.touch(job_id)
        except JobNotFoundError:
            assert not self.model.touch(job_id, owner, self.now[0])
            return
        assert self.model.touch(job_id, owner, self.now[0])

    @rule(slot=slots)
    def close_owner(self, slot: int) -> None:
        """Closing an owner makes its reservations ready at once; a new one takes its slot."""
        owner = self.owners[slot]
        owner.close()
        self.model.release_owner(owner)
        self.owners[slot] = self.store.owner()

    @rule(tube=tubes, seconds=st.sampled_from([0, 1, 2.5]))
    def pause(self, tube: str, seconds: float) -> None:
        self.store.pause_tube(tube, seconds)
        self.model.pause(tube, seconds, self.now[0])

    @rule(step=st.sampled_from([0.25, 0.5, 1, 2, 3, 5]))
    def tick(self, step: float) -> None:
        """Move the clock; a read applies what fell due (the timer thread may get there
        first: it applies the same deadlines)."""
        self.now[0] += step
        self.store.stats()
        self.model.advance(self.now[0])

    # --- snapshots and restarts ------------------------------------------------------------

    @rule()
    def snapshot(self) -> None:
        covered = self.store.snapshot()
        assert (self.tmp / "store" / f"snapshot-{covered:020d}.k7jobs").exists() or covered == 0

    @precondition(lambda self: self.ids)
    @rule()
    def reopen(self) -> None:
        """Close and open again: reserved jobs are ready, the rest as it was."""
        self.store.close()
        self.store = self.open()
        assert self.store.skipped_snapshots == []
        self.model.restart(keep_reservation_counters=False)
        self.model.advance(self.now[0])
        self.owners = [self.store.owner() for _ in range(OWNERS)]
        self.reopens += 1

    # --- comparisons -----------------------------------------------------------------------

    @invariant()
    def same_as_the_model(self) -> None:
        store, model, now = self.store, self.model, self.now[0]
        assert store.snapshot_error is None, store.snapshot_error
        assert len(store) == len(model.jobs)
        for job_id in self.ids:
            assert store.peek(job_id) == model.peek(job_id), job_id
            if job_id in model.jobs:
                assert store.job_stats(job_id) == model.job_stats(job_id, now)
            else:
                try:
                    store.job_stats(job_id)
                except JobNotFoundError:
                    pass
                else:
                    raise AssertionError(f"job_stats of deleted job {job_id}")
        assert sorted(store.tubes()) == model.tubes()
        overview = store.overview()
        assert sorted(overview) == model.tubes()
        for tube in TUBES:
            assert store.peek_ready(tube) == model.peek_ready(tube)
            assert store.peek_delayed(tube) == model.peek_delayed(tube)
            assert store.peek_buried(tube) == model.peek_buried(tube)
            assert store.errors(tube) == model.errors(tube)
            assert store.tube_stats(tube) == model.tube_stats(tube, now)
            if tube in overview:
                o, n = overview[tube], model.counts(tube)
                assert (o.ready, o.delayed, o.reserved, o.buried, o.waiting) == (
                    n[JobState.READY], n[JobState.DELAYED], n[JobState.RESERVED],
                    n[JobState.BURIED], n[JobState.WAITING])
                oldest = [j.created_at for j in model.jobs.values()
                          if j.tube == tube and j.state is JobState.READY]
                assert o.oldest_ready_age == (now - min(oldest) if oldest else None)
        assert store.stats() == model.stats()
        for owner in self.owners:
            assert sorted(owner.reserved()) == sorted(
                j.id for j in model.jobs.values()
                if j.state is JobState.RESERVED and j.owner is owner)


StoreAgainstModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreAgainstModel = StoreAgainstModel.TestCase
