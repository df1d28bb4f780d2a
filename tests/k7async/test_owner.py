"""The owner thread (``k7async._owner.Owner``): one thread owns a resource; tasks of several
event loops, in several threads, hand it commands and get each outcome in their own loop."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import k7core
from k7async._owner import Call, Command, Gather, Owner


class Resource:
    """A single-threaded object: records who touched it, and can hold the owner thread."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.ran: Counter[int] = Counter()  # command number -> times run
        self.batches: list[list[int]] = []  # command numbers per batch
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()  # the owner thread waits at the gate
        self.finished = False

    def hold(self) -> None:
        self.gate.clear()
        self.held.clear()

    def touch(self) -> None:
        self.threads.add(threading.get_ident())
        if not self.gate.is_set():
            self.held.set()
            assert self.gate.wait(30), "gate never opened"


class Job(Command[Resource, tuple[int, int]]):
    """Command number ``n``: returns (n, the thread that ran it); fails if ``fail``."""

    __slots__ = ("fail", "n")

    def __init__(self, n: int, fail: bool = False) -> None:
        super().__init__()
        self.n = n
        self.fail = fail

    def execute(self, resource: Resource) -> tuple[int, int]:
        resource.touch()
        resource.ran[self.n] += 1
        if self.fail:
            raise ValueError(f"job {self.n} failed")
        return self.n, threading.get_ident()


def record_batches(resource: Resource, commands: list[Command[Resource, Any]]) -> list[Any]:
    resource.batches.append([c.n for c in commands if isinstance(c, Job)])
    for command in commands:
        command.run(resource)
    return []


def new_owner(resource: Resource, **kwargs: Any) -> Owner[Resource]:
    def finish(r: Resource) -> None:
        r.finished = True

    return Owner(lambda: resource, name="k7async-test-owner", batch=record_batches,
                 finish=finish, **kwargs)


def run_in_threads(*targets: Callable[[], None]) -> None:
    """Run each target in its own thread; re-raise the first failure."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    if errors:
        raise errors[0]


def run_two_loops_held(
    resource: Resource,
    owner: Owner[Resource],
    loop: Callable[[str, int], Awaitable[None]],
    submitted: threading.Barrier,
) -> None:
    """Hold the owner thread (busy with command -1), run ``loop("asyncio", 0)`` and
    ``loop("trio", 1000)`` each in a thread of its own, and let the owner thread go on once
    both loops and this thread have passed ``submitted``."""
    resource.hold()
    owner.submit(Job(-1), answer=False)
    assert resource.held.wait(30)  # the owner thread waits at the gate, with that one alone

    def release() -> None:
        submitted.wait()
        resource.gate.set()

    run_in_threads(
        lambda: anyio.run(loop, "asyncio", 0, backend="asyncio"),
        lambda: anyio.run(loop, "trio", 1000, backend="trio"),
        release,
    )


def test_tasks_of_two_loops_in_two_threads_share_batches() -> None:
    """100 tasks in an asyncio loop and 100 in a trio loop, each loop in its own thread,
    submit while the owner thread is held: the next batch holds all 200, every task gets
    its own result (or its own error) in its own loop, and only the owner thread touched
    the resource."""
    resource = Resource()
    owner = new_owner(resource)
    tasks = 100
    submitted = threading.Barrier(3)  # both loops have submitted, and the main thread
    outcomes: dict[int, object] = {}
    loop_threads: dict[str, int] = {}

    async def loop(backend: str, base: int) -> None:
        loop_threads[backend] = threading.get_ident()

        async def task(n: int) -> None:
            try:
                result = await owner.call(Job(n, fail=n % 10 == 3))
                outcomes[n] = result
            except ValueError as exc:
                outcomes[n] = exc
            assert threading.get_ident() == loop_threads[backend]  # answered in its loop

        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(task, base + i)
            await anyio.wait_all_tasks_blocked()  # every task waits for its command
            await anyio.to_thread.run_sync(submitted.wait)

    run_two_loops_held(resource, owner, loop, submitted)
    owner.close()
    numbers = [*range(tasks), *range(1000, 1000 + tasks)]
    assert sorted(resource.batches[1]) == numbers  # one batch for both loops
    assert resource.threads == {owner_thread_ident(resource)}
    for n in numbers:
        if n % 10 == 3:
            assert isinstance(outcomes[n], ValueError) and str(outcomes[n]) == f"job {n} failed"
        else:
            assert outcomes[n] == (n, owner_thread_ident(resource))
    assert resource.ran == Counter({n: 1 for n in [-1, *numbers]})


class Collect(Gather[Resource, tuple[int, int]]):
    """Gathers numbers; each gets back (number, how many items its command held)."""

    __slots__ = ()
    limit = 30

    def execute(self, resource: Resource) -> list[tuple[int, int]]:
        resource.touch()
        for n in self.items:
            resource.ran[n] += 1
        return [(n, len(self.items)) for n in self.items]


def test_gather_shares_a_command_per_loop_while_the_thread_is_busy() -> None:
    """While the owner thread is held, 70 tasks of an asyncio loop and 70 of a trio loop
    gather their items: each loop fills commands of its own, 30 items at most (the limit);
    every task gets its own result by index, in its own loop. Once the thread is free again
    and has taken them, a new item starts a new command."""
    resource = Resource()
    owner = new_owner(resource)
    tasks = 70
    submitted = threading.Barrier(3)
    got: dict[int, tuple[int, int]] = {}
    commands: dict[str, set[int]] = {"asyncio": set(), "trio": set()}
    kinds: set[type] = set()

    async def loop(backend: str, base: int) -> None:
        async def task(n: int) -> None:
            command, index = owner.gather(Collect, n)
            commands[backend].add(id(command))
            kinds.add(type(command))
            await command.wait()
            got[n] = command.result()[index]

        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(task, base + i)
            await anyio.wait_all_tasks_blocked()
            await anyio.to_thread.run_sync(submitted.wait)

    run_two_loops_held(resource, owner, loop, submitted)
    numbers = [*range(tasks), *range(1000, 1000 + tasks)]
    assert kinds == {Collect}
    assert len(commands["asyncio"]) == len(commands["trio"]) == 3  # 30 + 30 + 10 each
    assert not commands["asyncio"] & commands["trio"]
    assert sorted(got) == numbers
    assert all(got[n][0] == n for n in numbers)
    assert sorted(got[n][1] for n in range(tasks)) == [10] * 10 + [30] * 60
    assert resource.ran == Counter({n: 1 for n in [-1, *numbers]})

    async def later() -> tuple[int, int]:  # the thread took the others: a new command
        command, index = owner.gather(Collect, 5000)
        assert index == 0
        await command.wait()
        return command.result()[index]

    assert anyio.run(later) == (5000, 1)
    owner.close()


def owner_thread_ident(resource: Resource) -> int:
    (ident,) = resource.threads
    assert ident != threading.get_ident()
    return ident


@pytest.mark.anyio
async def test_close_runs_what_was_accepted_then_joins() -> None:
    resource = Resource()
    owner = new_owner(resource)
    assert owner.running
    resource.hold()
    owner.submit(Job(0), answer=False)
    accepted = [owner.submit(Job(n)) for n in range(1, 4)]
    await anyio.to_thread.run_sync(resource.held.wait)
    async with anyio.create_task_group() as tg:
        tg.start_soon(owner.aclose)
        await anyio.wait_all_tasks_blocked()
        assert owner.closing and owner.running  # the thread is held: close waits
        with pytest.raises(k7core.ClosedError):  # closing: nothing more is accepted
            owner.submit(Job(9))
        resource.gate.set()
    assert not owner.running
    assert owner.name not in [t.name for t in threading.enumerate()]
    assert resource.finished
    assert [c.result()[0] for c in accepted] == [1, 2, 3]  # accepted ones ran
    await owner.aclose()  # idempotent
    owner.close()
    with pytest.raises(k7core.ClosedError):
        await owner.call(Job(10))
    with pytest.raises(k7core.ClosedError):  # from a plain thread too
        await anyio.to_thread.run_sync(lambda: owner.submit(Job(11), answer=False))
    assert set(resource.ran) == {0, 1, 2, 3}


@pytest.mark.anyio
async def test_cancelled_waiters_lose_nothing_accepted_and_duplicate_nothing() -> None:
    """Tasks cancelled while they wait: their commands, accepted, each run once (the
    results are lost, not the work). A task cancelled before it calls submits nothing."""
    resource = Resource()
    owner = new_owner(resource)
    try:
        resource.hold()
        owner.submit(Job(-1), answer=False)
        await anyio.to_thread.run_sync(resource.held.wait)
        returned: list[int] = []

        async def task(n: int) -> None:
            returned.append((await owner.call(Job(n)))[0])

        async with anyio.create_task_group() as tg:
            for n in range(50):
                tg.start_soon(task, n)
            await anyio.wait_all_tasks_blocked()  # all 50 accepted, waiting
            tg.cancel_scope.cancel()
        assert returned == []
        with anyio.CancelScope() as scope:
            scope.cancel()
            await owner.call(Job(99))  # cancelled already: not submitted
        assert scope.cancelled_caught
        resource.gate.set()
        with anyio.CancelScope() as scope:  # shield: the waiter gets its result anyway
            call = owner.call(Job(100), shield=True)
            scope.cancel()
            assert (await call)[0] == 100
        assert (await owner.call(Job(101)))[0] == 101  # the thread is FIFO: all before ran
        assert resource.ran == Counter({n: 1 for n in [-1, *range(50), 100, 101]})
        assert sorted(n for n in resource.batches[1] if n < 50) == list(range(50))  # together
    finally:
        await owner.aclose()


@pytest.mark.anyio
async def test_a_failed_open_fails_every_command_and_ends_the_thread() -> None:
    def open_() -> Resource:
        raise k7core.GroupBusyError("busy")

    owner: Owner[Resource] = Owner(open_, name="k7async-test-owner")
    with pytest.raises(k7core.GroupBusyError):
        await owner.call(Job(0))
    with pytest.raises(k7core.GroupBusyError):  # later commands too, at submission
        owner.submit(Job(1))
    await owner.aclose()
    assert not owner.running


@pytest.mark.anyio
async def test_finish_error_goes_to_the_first_closer() -> None:
    def finish(resource: Resource) -> None:
        raise k7core.StorageError("final msync failed")

    owner: Owner[Resource] = Owner(Resource, name="k7async-test-owner", finish=finish)
    await owner.call(Job(0))
    with pytest.raises(k7core.StorageError, match="final msync"):
        await owner.aclose()
    await owner.aclose()  # told once
    assert not owner.running


@pytest.mark.anyio
async def test_a_hook_parks_a_command_until_it_can_be_done() -> None:
    """A parked command is handed back to the hook with every later batch (here: until a
    posted command says so); the thread does not sleep meanwhile, and a hook error fails
    the commands it did not settle."""
    seen: list[int] = []

    class Wait(Command[Resource, str]):
        __slots__ = ()

    def hook(resource: Resource, commands: list[Command[Resource, Any]]) -> list[Any]:
        parked: list[Any] = []
        for command in commands:
            if isinstance(command, Wait):
                if resource.ran[7]:
                    command.set_result("go")
                else:
                    parked.append(command)
            elif isinstance(command, Job) and command.n == 8:
                raise RuntimeError("hook failed")
            else:
                command.run(resource)
                seen.append(command.n if isinstance(command, Job) else -1)
        return parked

    resource = Resource()
    owner: Owner[Resource] = Owner(lambda: resource, name="k7async-test-owner", batch=hook)
    try:
        resource.hold()
        owner.submit(Job(0), answer=False)
        await anyio.to_thread.run_sync(resource.held.wait)
        wait = owner.submit(Wait())
        one = owner.submit(Job(1))  # in the same round as Wait: answered without it
        resource.gate.set()
        with anyio.fail_after(10):
            await one.wait()
        assert one.result()[0] == 1
        assert not wait.done
        owner.submit(Job(7), answer=False)
        with anyio.fail_after(10):
            await wait.wait()
        assert wait.result() == "go"
        with pytest.raises(RuntimeError, match="hook failed"):
            await owner.call(Job(8))
        assert (await owner.call(Call(lambda r: r.ran[7])))
    finally:
        await owner.aclose()
    assert seen[:3] == [0, 1, 7]


def test_close_from_sync_code_joins() -> None:
    resource = Resource()
    owner = new_owner(resource)
    owner.submit(Job(0), answer=False)
    owner.close()
    assert not owner.running and resource.finished and resource.ran[0] == 1
    owner.close()  # idempotent
