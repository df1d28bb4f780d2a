"""JobMachine against the plain reference model (_model.py), step by step: every operation,
time moved explicitly, and after every step every job, peek, count and stats compared. One
rule round-trips the machine through a snapshot and through a replay of its journal."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from k7core.jobs import DependencyError, JobNotFoundError, JobState
from k7core.jobs._codec import (
    dump_snapshot,
    encode_bury,
    encode_delete,
    encode_kick,
    encode_put,
    encode_ready,
    encode_release,
    load_snapshot,
    replay,
)
from k7core.jobs._machine import JobMachine
from tests.k7core.jobs._model import Model

TUBES = ("a", "b", "c")
OWNERS = (1, 2)
tubes = st.sampled_from(TUBES)
owners = st.sampled_from(OWNERS)
priorities = st.sampled_from([0, 1, 1023, 1024, 2**32 - 1])
delays = st.sampled_from([0, 0, 0.5, 1, 2.5, 4])
ttrs = st.sampled_from([0, 1, 2, 3.5])
keys = st.sampled_from([None, None, "k1", "k2"])
errors = st.sampled_from([None, "boom", "é" * 3])


def _without_reservation_counters(job: Any) -> Any:
    """A job view as a replayed journal gives it: reservations are not journaled."""
    if job is None:
        return None
    return (job.id, job.tube, job.priority, job.body, job.state, job.ttr, job.releases,
            job.buries, job.kicks, job.created_at, job.key, job.depends_on, job.errors,
            job.delay, job.ready_at)


class MachineAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = JobMachine()
        self.model = Model()
        self.now = 1000.0
        self.offset = 0
        self.journal: list[tuple[int, bytes]] = []
        self.ids: list[int] = []

    def journal_append(self, record: bytes) -> int:
        """Append ``record`` as the store would; returns its offset (ids are offset + 1)."""
        offset = self.offset
        self.journal.append((offset, record))
        self.offset += 16 + len(record)
        return offset

    def pick_id(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from([*self.ids, 999_999]) if self.ids else st.just(7))

    # --- journaled -------------------------------------------------------------------------

    @rule(tube=tubes, body=st.binary(max_size=6), priority=priorities, delay=delays, ttr=ttrs,
          key=keys, data=st.data())
    def put(self, tube: str, body: bytes, priority: int, delay: float, ttr: float,
            key: str | None, data: st.DataObject) -> None:
        deps: list[int | tuple[str, str]] = []
        for _ in range(data.draw(st.sampled_from([0, 0, 1, 2, 3]))):
            live = list(self.model.jobs)
            kind = data.draw(st.sampled_from(["live", "live", "any", "pair"]))
            if kind == "live" and live:
                deps.append(data.draw(st.sampled_from(live)))
            elif kind == "any" and self.ids:
                deps.append(data.draw(st.sampled_from(self.ids)))
            else:
                deps.append((data.draw(tubes), data.draw(st.sampled_from(["k1", "k2"]))))
        try:
            plan = self.machine.check_put(tube, body, priority, delay, ttr, key, deps, self.now)
        except DependencyError:
            try:
                self.model.put(-1, tube, body, priority, delay, ttr, key, deps, self.now)
            except DependencyError:
                return
            raise AssertionError("the model stores what the machine refuses") from None
        if isinstance(plan, int):
            found = self.model.put(-1, tube, body, priority, delay, ttr, key, deps, self.now)
            assert found == plan
            return
        job_id = self.journal_append(encode_put(*plan)) + 1
        self.machine.apply_put(job_id, plan)
        assert self.model.put(job_id, tube, body, priority, delay, ttr, key, deps,
                              self.now) == job_id
        self.ids.append(job_id)

    @rule(puts=st.lists(st.tuples(tubes, priorities, st.sampled_from([0, 0, 1])), min_size=1,
                        max_size=5), ttr=ttrs)
    def put_several(self, puts: list[tuple[str, int, float]], ttr: float) -> None:
        """Several plain puts: enough jobs for the orders to matter."""
        for tube, priority, delay in puts:
            plan = self.machine.check_put(tube, b"", priority, delay, ttr, None, (), self.now)
            assert not isinstance(plan, int)
            job_id = self.journal_append(encode_put(*plan)) + 1
            self.machine.apply_put(job_id, plan)
            self.model.put(job_id, tube, b"", priority, delay, ttr, None, (), self.now)
            self.ids.append(job_id)

    @rule(owner=owners, names=st.lists(tubes, min_size=1, max_size=3), priority=priorities,
          error=errors)
    def reserve_and_bury(self, owner: Hashable, names: list[str], priority: int,
                         error: str | None) -> None:
        """What a failing worker does (buried lists long enough for their order to matter)."""
        job = self.machine.reserve(owner, names, self.now)
        assert (job and job.id) == self.model.reserve(owner, names, self.now)
        if job is not None:
            plan = self.machine.check_bury(job.id, owner, priority, error)
            self.journal_append(encode_bury(*plan))
            self.machine.apply_bury(*plan)
            assert self.model.bury(job.id, owner, priority, error)

    @rule(owner=st.sampled_from([*OWNERS, None]), data=st.data())
    def delete(self, owner: Hashable, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            self.machine.check_delete(job_id, owner)
        except JobNotFoundError:
            assert not self.model.delete(job_id, owner)
            return
        self.journal_append(encode_delete(job_id))
        self.machine.apply_delete(job_id)
        assert self.model.delete(job_id, owner)

    @rule(owner=owners, priority=priorities, delay=delays, error=errors, data=st.data())
    def release(self, owner: Hashable, priority: int, delay: float, error: str | None,
                data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            plan = self.machine.check_release(job_id, owner, priority, delay, error, self.now)
        except JobNotFoundError:
            assert not self.model.release(job_id, owner, priority, delay, error, self.now)
            return
        self.journal_append(encode_release(*plan))
        self.machine.apply_release(*plan)
        assert self.model.release(job_id, owner, priority, delay, error, self.now)

    @rule(owner=owners, priority=priorities, error=errors, data=st.data())
    def bury(self, owner: Hashable, priority: int, error: str | None,
             data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            plan = self.machine.check_bury(job_id, owner, priority, error)
        except JobNotFoundError:
            assert not self.model.bury(job_id, owner, priority, error)
            return
        self.journal_append(encode_bury(*plan))
        self.machine.apply_bury(*plan)
        assert self.model.bury(job_id, owner, priority, error)

    @rule(tube=tubes, bound=st.sampled_from([0, 1, 2, 10]))
    def kick(self, tube: str, bound: int) -> None:
        ids = self.machine.plan_kick(tube, bound)
        for job_id in ids:
            self.journal_append(encode_kick(job_id))
            self.machine.apply_kick(job_id)
        assert ids == self.model.kick(tube, bound)

    @rule(data=st.data())
    def kick_job(self, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            self.machine.check_kick_job(job_id)
        except JobNotFoundError:
            assert not self.model.kick_job(job_id)
            return
        self.journal_append(encode_kick(job_id))
        self.machine.apply_kick(job_id)
        assert self.model.kick_job(job_id)

    # --- not journaled ---------------------------------------------------------------------

    @rule(owner=owners, names=st.lists(tubes, min_size=1, max_size=3))
    def reserve(self, owner: Hashable, names: list[str]) -> None:
        job = self.machine.reserve(owner, names, self.now)
        expected = self.model.reserve(owner, names, self.now)
        assert (job and job.id) == expected
        if job is not None:
            assert job == self.model.peek(job.id)

    @rule(owner=owners, data=st.data())
    def reserve_job(self, owner: Hashable, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            if self.machine.check_reserve_job(job_id):
                self.journal_append(encode_ready(job_id))
                self.machine.apply_ready(job_id)
        except JobNotFoundError:
            assert not self.model.reserve_job(job_id, owner, self.now)
            return
        job = self.machine.reserve_job(job_id, owner, self.now)
        assert self.model.reserve_job(job_id, owner, self.now)
        assert job == self.model.peek(job_id)

    @rule(owner=owners, data=st.data())
    def touch(self, owner: Hashable, data: st.DataObject) -> None:
        job_id = self.pick_id(data)
        try:
            self.machine.touch(job_id, owner, self.now)
        except JobNotFoundError:
            assert not self.model.touch(job_id, owner, self.now)
            return
        assert self.model.touch(job_id, owner, self.now)

    @rule(owner=owners)
    def release_owner(self, owner: Hashable) -> None:
        assert self.machine.release_owner(owner) == self.model.release_owner(owner)

    @rule(tube=tubes, seconds=st.sampled_from([0, 1, 2.5]))
    def pause(self, tube: str, seconds: float) -> None:
        self.machine.pause_tube(tube, seconds, self.now)
        self.model.pause(tube, seconds, self.now)

    @rule(step=st.sampled_from([0, 0.25, 0.5, 1, 2, 3]))
    def tick(self, step: float) -> None:
        self.now += step
        assert self.machine.advance(self.now) == self.model.advance(self.now)

    # --- restarts --------------------------------------------------------------------------

    @precondition(lambda self: self.journal)
    @rule()
    def reopen(self) -> None:
        """Reopen from a snapshot and, separately, from the whole journal: both must give
        the model's state after a restart (reserved jobs ready)."""
        self.tick(0)  # due jobs made ready (a resolved dependency leaves one due, not ready)
        chunks = list(dump_snapshot(self.machine, self.offset))
        from_snapshot = load_snapshot(chunks)
        from_journal = JobMachine()
        for offset, record in self.journal:
            replay(from_journal, record, offset)
        assert from_snapshot.advance(self.now) == 0
        from_journal.advance(self.now)
        from_journal.reset_counters()
        self.model.restart()
        self.machine = from_snapshot
        self.check_everything()
        for job_id in self.model.jobs:
            assert (_without_reservation_counters(from_journal.peek(job_id))
                    == _without_reservation_counters(self.model.peek(job_id)))
        assert len(from_journal) == len(self.model.jobs)
        for tube in TUBES:
            assert from_journal.tube_stats(tube, self.now) == self.model.tube_stats(
                tube, self.now)
            assert [j.id for j in from_journal.errors(tube)] == [
                j.id for j in self.model.errors(tube)]
            assert (_without_reservation_counters(from_journal.peek_ready(tube))
                    == _without_reservation_counters(self.model.peek_ready(tube)))
        stats = from_journal.stats(self.now)
        assert {k: v for k, v in stats.items() if k != "job-timeouts"} == {
            k: v for k, v in self.model.stats().items() if k != "job-timeouts"}
        assert from_journal.next_deadline() == self.model.next_deadline()

    # --- comparisons -----------------------------------------------------------------------

    @invariant()
    def check_everything(self) -> None:
        m, model, now = self.machine, self.model, self.now
        assert len(m) == len(model.jobs)
        for job_id in self.ids:
            assert m.peek(job_id) == model.peek(job_id)
            if job_id in model.jobs:
                assert m.job_stats(job_id, now) == model.job_stats(job_id, now)
        assert sorted(m.tubes()) == model.tubes()
        for tube in TUBES:
            assert m.peek_ready(tube) == model.peek_ready(tube)
            assert m.peek_delayed(tube) == model.peek_delayed(tube)
            assert m.peek_buried(tube) == model.peek_buried(tube)
            assert m.errors(tube) == model.errors(tube)
            assert m.counts(tube) == model.counts(tube)
            assert m.has_tube(tube) == model.exists(tube)
            assert m.tube_stats(tube, now) == model.tube_stats(tube, now)
            oldest = [j.created_at for j in model.jobs.values()
                      if j.tube == tube and j.state is JobState.READY]
            assert m.oldest_ready_created_at(tube) == min(oldest, default=None)
        assert m.stats(now) == model.stats()
        assert m.next_deadline() == model.next_deadline()
        for owner in OWNERS:
            assert m.deadline_soon(owner, now) == model.deadline_soon(owner, now)
            assert sorted(m.reserved_by(owner)) == sorted(
                j.id for j in model.jobs.values()
                if j.state is JobState.RESERVED and j.owner == owner)


MachineAgainstModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMachineAgainstModel = MachineAgainstModel.TestCase
