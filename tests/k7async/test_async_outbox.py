"""k7async.run_relay under asyncio and trio: an outbox relay as a task, feeding an
AsyncWorker over the same store; cancelling the task closes the relay."""

from __future__ import annotations

import contextvars
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

import k7async
from k7core import outbox

pytestmark = pytest.mark.anyio

tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")


async def test_a_relay_task_feeds_a_worker_with_the_put_context(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "app.db")
    box = outbox.Outbox(context=[tenant])
    box.create(db)
    seen: list[tuple[Any, str]] = []
    done = anyio.Event()
    async with k7async.open_jobs(tmp_path / "jobs") as store, \
            k7async.AsyncWorker(store) as worker, anyio.create_task_group() as tg:

        @worker.consumer("orders", context=[tenant])
        async def handle(payload: Any) -> None:
            seen.append((payload, tenant.get("-")))
            if len(seen) == 3:
                done.set()

        relay = outbox.SqliteRelay(tmp_path / "app.db", store.store)
        await tg.start(k7async.run_relay, relay)
        token = tenant.set("acme")
        with db:  # committed: relayed once
            box.put(db, "orders", {"n": 1})
            box.put(db, "orders", {"n": 2})
        with pytest.raises(ZeroDivisionError), db:  # rolled back: nothing
            box.put(db, "orders", {"n": -1})
            raise ZeroDivisionError
        with db:
            box.put(db, "orders", {"n": 3})
        tenant.reset(token)
        with anyio.fail_after(10):
            await done.wait()
        tg.cancel_scope.cancel()
    assert relay.closed
    assert seen == [({"n": i}, "acme") for i in (1, 2, 3)]
    assert relay.relayed == 3
    assert db.execute("SELECT count(*) FROM k7_outbox").fetchone() == (0,)


async def test_a_missing_outbox_fails_the_start(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    async with k7async.open_jobs(tmp_path / "jobs") as store:
        relay = outbox.SqliteRelay(tmp_path / "empty.db", store.store)
        with pytest.raises(ExceptionGroup) as info:
            async with anyio.create_task_group() as tg:
                await tg.start(k7async.run_relay, relay)
        assert info.group_contains(FileNotFoundError, match="Outbox.create")
        assert relay.closed
