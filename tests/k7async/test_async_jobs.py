"""k7async's face of the job store (``open_jobs``): awaited writes through one owner thread,
batched (one msync wait per batch under ``"sync"``), and reserves that wait in a thread."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest

import k7async
from k7core import jobs

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_many_tasks_put_durably_and_every_put_is_there(tmp_path: Path) -> None:
    tasks, per_task = 50, 20
    ids: list[int] = []
    async with k7async.open_jobs(tmp_path / "s", fsync="sync") as store:

        async def producer(n: int) -> None:
            for i in range(per_task):
                ids.append(await store.put(f"{n}:{i}".encode(), tube=f"t{n % 3}"))

        async with anyio.create_task_group() as tg:
            for n in range(tasks):
                tg.start_soon(producer, n)
        assert len(set(ids)) == tasks * per_task
        assert len(store.store) == tasks * per_task
    with jobs.JobStore(tmp_path / "s") as reopened:
        bodies = {reopened.peek(i).body for i in ids}  # type: ignore[union-attr]
        assert bodies == {f"{n}:{i}".encode() for n in range(tasks) for i in range(per_task)}


async def test_owner_calls_and_a_waiting_reserve(tmp_path: Path) -> None:
    async with k7async.open_jobs(tmp_path / "s", fsync="flush") as store, store.owner() as me:
        got: list[jobs.Job | None] = []

        async def reserver() -> None:
            got.append(await me.reserve(("work",), timeout=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(reserver)
            await anyio.wait_all_tasks_blocked()
            jid = await store.put(b"job", tube="work")
        job = got[0]
        assert job is not None and job.id == jid and job.state is jobs.JobState.RESERVED
        await me.release(jid, error="first try failed")
        again = await me.reserve(("work",), timeout=0)
        assert again is not None and again.id == jid
        await me.bury(jid, error="second try failed")
        assert store.store.errors("work")[0].errors == ("first try failed",
                                                        "second try failed")
        assert await store.kick("work", 10) == 1
        third = await me.reserve(("work",), timeout=0)
        assert third is not None
        await me.touch(jid)
        await me.delete(jid)
        assert store.store.peek(jid) is None
        with pytest.raises(jobs.JobNotFoundError):
            await me.delete(jid)


async def test_a_cancelled_reserve_leaves_no_job_reserved(tmp_path: Path) -> None:
    async with k7async.open_jobs(tmp_path / "s") as store, store.owner() as me:
        with anyio.move_on_after(0.05):
            await me.reserve(("work",), timeout=30)  # waits in a thread, then cancelled
        jid = await store.put(b"job", tube="work")
        async with store.owner() as other:
            job = await other.reserve(("work",), timeout=5)
            # the abandoned thread may reserve it first; it then releases it at once
            assert job is not None and job.id == jid


async def test_a_failing_put_among_many_fails_only_its_own_task(tmp_path: Path) -> None:
    """Concurrent puts of one loop share commands; a put's own error (bad argument, missing
    dependency, key found) is its task's alone, the others are stored."""
    outcomes: dict[int, int | BaseException] = {}
    async with k7async.open_jobs(tmp_path / "s", fsync="sync") as store:
        first = await store.put(b"keyed", key="k")

        async def producer(n: int) -> None:
            try:
                if n == 7:
                    outcomes[n] = await store.put(b"bad", priority=-1)
                elif n == 13:
                    outcomes[n] = await store.put(b"orphan", depends_on=[10**15])
                elif n == 21:
                    outcomes[n] = await store.put(b"dup", key="k")
                else:
                    outcomes[n] = await store.put(str(n).encode())
            except jobs.InvalidJobError as exc:
                outcomes[n] = exc

        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(producer, n)
        assert isinstance(outcomes[7], jobs.InvalidJobError)
        assert isinstance(outcomes[13], jobs.DependencyError)
        assert outcomes[21] == first
        good = {n: v for n, v in outcomes.items() if n not in (7, 13, 21)}
        assert all(isinstance(v, int) for v in good.values()) and len(good) == 37
        assert {store.store.peek(v).body for v in good.values()} == {  # type: ignore[union-attr,arg-type]
            str(n).encode() for n in good}
        assert len(store.store) == 38


async def test_a_relay_puts_with_marks_and_remembered_keys(tmp_path: Path) -> None:
    """A relay task puts rows in order with a mark and remembered keys, among tasks that
    put plain jobs (one command can hold puts of both); a mark behind fails only its own
    put; done jobs' keys stay taken until forget."""
    rows: dict[int, int] = {}
    async with k7async.open_jobs(tmp_path / "s", fsync="sync") as store:

        async def relay() -> None:
            for position in range(1, 31):
                rows[position] = await store.put(b"row %d" % position, tube="out",
                                                 key=f"row-{position}", remember=True,
                                                 mark=("relay", position))

        async def other() -> None:
            for _ in range(30):
                await store.put(b"other")

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            for _ in range(3):
                tg.start_soon(other)
        assert store.store.mark("relay") == 30 and len(set(rows.values())) == 30
        with pytest.raises(jobs.InvalidJobError, match="behind"):
            await store.put(b"late", mark=("relay", 29))
        with pytest.raises(jobs.InvalidJobError, match="needs a key"):
            await store.put(b"keyless", remember=True)
        for job_id in rows.values():
            await store.delete(job_id)
        # a row whose key is remembered: nothing stored, the mark moves
        assert await store.put(b"again", tube="out", key="row-5", mark=("relay", 31)) == rows[5]
        assert await store.forget("out", ["row-5", "row-6", "row-6", "nope"]) == 2
        fresh = await store.put(b"again", tube="out", key="row-5")
        assert fresh > max(rows.values())
        assert len(store.store) == 91
    with jobs.JobStore(tmp_path / "s") as reopened:
        assert reopened.mark("relay") == 31
        assert reopened.remembered("out", "row-") == sorted(
            f"row-{p}" for p in range(1, 31) if p not in (5, 6))
        assert reopened.put(b"x", tube="out", key="row-7") == rows[7]


async def test_groups_through_the_async_store(tmp_path: Path) -> None:
    """Puts of many tasks into a group (gathered in commands with plain puts); progress and
    forget through the owner thread; a bad group fails only its own put."""
    async with k7async.open_jobs(tmp_path / "s") as store:

        async def campaign(n: int) -> None:
            for i in range(n):
                await store.put(b"mail %d" % i, tube="mail", group="campaign/1")

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(campaign, 10)
            tg.start_soon(functools.partial(store.put, b"plain", tube="mail", priority=2000))
        with pytest.raises(jobs.InvalidJobError, match="group"):
            await store.put(b"bad", tube="mail", group="")
        async with store.owner() as me:
            for _ in range(4):
                job = await me.reserve(["mail"], timeout=0)
                assert job is not None
                await me.delete(job.id)
        progress = await store.group_progress("mail", "campaign/1")
        assert progress == {"ready": 26, "delayed": 0, "reserved": 0, "buried": 0,
                            "waiting": 0, "done": 4}
        assert await store.forget_group("mail", "campaign/1") is True
        assert (await store.group_progress("mail", "campaign/1"))["ready"] == 0
