"""Job groups in the store (yoltq's ``job-group-progress``), on real directories: progress
by state, done counts that survive reopening, snapshots and journal trimming, forgetting."""

from __future__ import annotations

from pathlib import Path

import pytest

import k7core
from k7core.jobs import JobStore
from k7core.jobs._files import JOURNAL
from k7core.jobs._store import JOURNAL_SEGMENT
from tests.k7core.jobs._storehelp import churn, journal_end

ZERO = {"ready": 0, "delayed": 0, "reserved": 0, "buried": 0, "waiting": 0, "done": 0}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store"


def reopened(path: Path) -> JobStore:
    return JobStore(path, snapshot_bytes=1 << 40)  # explicit snapshots only


def campaign(store: JobStore) -> list[int]:
    """Six jobs of group "mail/42" of tube "mail", one in every state and two done."""
    ids = [store.put(b"%d" % i, tube="mail", group="mail/42", priority=i) for i in range(4)]
    ids.append(store.put(b"later", tube="mail", group="mail/42", delay=3600))
    ids.append(store.put(b"after", tube="mail", group="mail/42", depends_on=[ids[3]]))
    store.put(b"other", tube="mail", group="mail/7")
    store.put(b"none", tube="mail")
    with store.owner() as me:
        for _ in range(2):
            job = me.reserve(["mail"], timeout=0)
            assert job is not None
            me.delete(job.id)
        job = me.reserve(["mail"], timeout=0)
        assert job is not None and job.id == ids[2]
        me.bury(job.id, error="boom")
    return ids


def test_progress_counts_the_group_by_state_and_done(path: Path) -> None:
    with reopened(path) as store:
        ids = campaign(store)
        with store.owner() as me:
            job = me.reserve(["mail"], timeout=0)
            assert job is not None and job.id == ids[3]
            assert store.group_progress("mail", "mail/42") == ZERO | {
                "reserved": 1, "buried": 1, "delayed": 1, "waiting": 1, "done": 2}
        assert store.group_progress("mail", "mail/42") == ZERO | {
            "ready": 1, "buried": 1, "delayed": 1, "waiting": 1, "done": 2}
        assert store.group_progress("mail", "mail/7") == ZERO | {"ready": 1}
        assert store.group_progress("mail", "nobody") == ZERO
        assert store.group_progress("other", "mail/42") == ZERO
        assert store.groups("mail") == ["mail/42", "mail/7"] and store.groups("x") == []


def test_a_put_with_a_taken_key_joins_nothing(path: Path) -> None:
    with reopened(path) as store:
        first = store.put(b"a", key="k", group="g")
        assert store.put(b"b", key="k", group="h") == first
        assert store.group_progress("default", "g") == ZERO | {"ready": 1}
        assert store.group_progress("default", "h") == ZERO and store.groups("default") == ["g"]


def test_groups_survive_reopening_snapshots_and_trimming(path: Path) -> None:
    with reopened(path) as store:
        campaign(store)
        expected = store.group_progress("mail", "mail/42")
        grouped = journal_end(path)
    with reopened(path) as store:  # from the journal
        assert store.group_progress("mail", "mail/42") == expected
        store.snapshot()
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()
        churn(store, JOURNAL_SEGMENT + (1 << 20))
        store.snapshot()  # keeps the journal from the one before: past the groups' records
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        assert q.earliest() >= grouped, "the journal with the groups was trimmed"
    with reopened(path) as store:  # from a snapshot
        assert store.group_progress("mail", "mail/42") == expected
        waiting = store.put(b"more", tube="mail", group="mail/42")
        store.delete(waiting)
        assert store.group_progress("mail", "mail/42")["done"] == expected["done"] + 1


def test_forget_group_drops_the_count_and_keeps_the_jobs(path: Path) -> None:
    with reopened(path) as store:
        campaign(store)
        live = len(store)
        assert store.forget_group("mail", "mail/42") is True
        assert store.forget_group("mail", "mail/42") is False
        assert store.group_progress("mail", "mail/42") == ZERO
        assert store.groups("mail") == ["mail/7"] and len(store) == live
        kept = store.put(b"again", tube="mail", group="mail/42")
        store.snapshot()
    with reopened(path) as store:
        assert store.group_progress("mail", "mail/42") == ZERO | {"ready": 1}
        assert store.peek(kept) is not None and len(store) == live + 1
    with reopened(path) as store:  # the forget is journaled too
        store.forget_group("mail", "mail/42")
    with reopened(path) as store:
        assert store.group_progress("mail", "mail/42") == ZERO
