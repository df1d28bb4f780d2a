"""Outbox.create and Outbox.put on the caller's own connection and in its own transaction
(must 9): SQLite files and a real PostgreSQL (sync and async); what a committed
transaction relays, what a rolled-back one does not; bad input refused at the put."""

from __future__ import annotations

import contextvars
import json
import math
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from k7core import K7Error
from k7core.jobs import MAX_BODY, JobState, JobStore
from k7core.outbox import Outbox, PostgresRelay, SqliteRelay
from k7core.workers import Worker
from tests._childproc import Child
from tests.k7core.outbox._outboxhelp import (
    TUBE,
    App,
    connect,
    payloads,
    relay_all,
    setup,
    take_all,
)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
tenant: contextvars.ContextVar[object] = contextvars.ContextVar("tenant")


# --- commit and rollback ----------------------------------------------------------------


def test_a_committed_put_relays_and_a_rolled_back_one_does_not(app: App, store: JobStore
                                                               ) -> None:
    box = setup(app)
    app.execute("CREATE TABLE orders (id TEXT)")
    app.commit()
    app.execute("INSERT INTO orders VALUES ('o-1')")
    first = box.put(app.conn, TUBE, {"order": "o-1"})
    app.commit()
    app.execute("INSERT INTO orders VALUES ('o-2')")
    second = box.put(app.conn, TUBE, {"order": "o-2"})
    assert second > first
    app.rollback()
    third = box.put(app.conn, TUBE, {"order": "o-3"}, priority=5)
    app.commit()
    with closing(app.relay(store)) as relay:
        assert relay_all(relay) == 2
        assert (relay.relayed, relay.skipped) == (2, 0)
    assert payloads(store) == [{"order": "o-3"}, {"order": "o-1"}]  # by priority
    assert app.execute("SELECT id FROM orders") == [("o-1",)]
    assert app.count() == 0, "relayed rows are deleted"
    assert third != second or app.kind == "sqlite"  # SQLite may give a rolled-back id again


def test_a_rollback_to_a_savepoint_relays_nothing_of_it(app: App, store: JobStore) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, "before")
    app.execute("SAVEPOINT s")
    box.put(app.conn, TUBE, "inside")
    app.execute("ROLLBACK TO SAVEPOINT s")
    box.put(app.conn, TUBE, "after")
    app.commit()
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == ["before", "after"]


def test_psycopg_nested_transaction_blocks(dsn: str, store: JobStore) -> None:
    box = Outbox()
    with psycopg.connect(dsn, autocommit=True) as conn:
        box.create(conn)
        box.put(conn, TUBE, "autocommitted")
        with conn.transaction():
            box.put(conn, TUBE, "outer")
            with pytest.raises(ZeroDivisionError), conn.transaction():
                box.put(conn, TUBE, "inner")
                1 / 0  # noqa: B018
        with pytest.raises(ZeroDivisionError), conn.transaction():
            box.put(conn, TUBE, "whole")
            1 / 0  # noqa: B018
    with closing(PostgresRelay(dsn, store)) as relay:
        relay_all(relay)
    assert payloads(store) == ["autocommitted", "outer"]


def test_sqlite_autocommit_and_explicit_begin(db_path: Path, store: JobStore) -> None:
    box = Outbox()
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        box.create(conn)
        box.put(conn, TUBE, "autocommitted")
        conn.execute("BEGIN")
        box.put(conn, TUBE, "rolled back")
        conn.execute("ROLLBACK")
        conn.execute("BEGIN IMMEDIATE")
        box.put(conn, TUBE, "committed")
        assert conn.in_transaction
        conn.execute("COMMIT")
        with sqlite3.connect(db_path) as other:
            assert other.execute("SELECT count(*) FROM k7_outbox").fetchone() == (2,)
    finally:
        conn.close()
    with closing(SqliteRelay(db_path, store)) as relay:
        relay_all(relay)
    assert payloads(store) == ["autocommitted", "committed"]


# --- create -----------------------------------------------------------------------------


def name_rows(app: App) -> list[tuple[Any, ...]]:
    return app.execute(f"SELECT name FROM {app.table}_meta")


def test_create_is_idempotent_and_keeps_the_outbox_name(app: App, store: JobStore) -> None:
    box = setup(app)
    before = name_rows(app)
    box.put(app.conn, TUBE, 1)
    app.commit()
    setup(app)
    setup(app, Outbox(codec="pickle"))
    assert name_rows(app) == before and len(before) == 1
    assert before[0][0].startswith("outbox-") and len(before[0][0]) == len("outbox-") + 16
    assert app.count() == 1, "create again keeps the rows"
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == [1]


def test_create_inside_the_callers_transaction_is_part_of_it(app: App) -> None:
    box = Outbox()
    app.execute("CREATE TABLE orders (id TEXT)")
    app.commit()
    app.execute("INSERT INTO orders VALUES ('o-1')")
    box.create(app.conn)
    box.put(app.conn, TUBE, "x")
    app.rollback()
    assert app.count("orders") == 0, "create did not commit the caller's transaction"
    missing = sqlite3.OperationalError if app.kind == "sqlite" else psycopg.errors.UndefinedTable
    with pytest.raises(missing):
        app.count()
    app.rollback()
    app.execute("INSERT INTO orders VALUES ('o-2')")
    box.create(app.conn)
    box.put(app.conn, TUBE, "y")
    app.commit()
    assert (app.count("orders"), app.count()) == (1, 1)


def test_create_outside_a_transaction_commits(app: App) -> None:
    Outbox().create(app.conn)
    other = connect(app.kind, Path(app.where), app.where)
    try:
        assert other.count() == 0 and len(name_rows(other)) == 1
    finally:
        other.close()


CREATE_CHILD = "tests.k7core.outbox._outboxchild"


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_concurrent_creates_from_several_processes(kind: str, db_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    """Four processes create the same outbox at the same moment, then put a row: every one
    succeeds, there is one outbox name, four rows."""
    where = str(db_path) if kind == "sqlite" else request.getfixturevalue("dsn")
    children = [Child("create", kind, where, program=CREATE_CHILD) for _ in range(4)]
    try:
        for child in children:
            assert child.line() == b"ready"
        for child in children:
            child.send("go")
        results = [child.line() for child in children]
        assert results == [b"created"] * 4, [c.stderr() for c in children]
        assert [child.wait() for child in children] == [0] * 4
    finally:
        for child in children:
            child.__exit__()
    app = App(kind, where)
    try:
        assert (len(name_rows(app)), app.count()) == (1, 4)
    finally:
        app.close()


def test_pg_a_repeatable_read_create_racing_another_makes_no_second_name(dsn: str) -> None:
    """A create in a REPEATABLE READ transaction whose snapshot predates another create's
    commit fails as a serialization failure (the caller retries), instead of adding a
    second outbox name: relays reading different names would put a row twice."""
    with psycopg.connect(dsn) as late, psycopg.connect(dsn) as other:
        late.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        late.execute("SELECT 1")  # the snapshot
        Outbox().create(other)
        other.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            Outbox().create(late)
        late.rollback()
        Outbox().create(late)  # the retry
        late.commit()
        assert len(late.execute("SELECT name FROM k7_outbox_meta").fetchall()) == 1


# --- bad input --------------------------------------------------------------------------


def no_json(x: object) -> None:  # a payload the JSON codec cannot encode
    pass


BAD_PUTS: dict[str, dict[str, Any]] = {
    "empty tube": {"tube": ""},
    "tube with a space": {"tube": "a b"},
    "tube starting with -": {"tube": "-t"},
    "tube not a str": {"tube": 5},
    "tube too long": {"tube": "t" * 201},
    "negative priority": {"priority": -1},
    "priority over u32": {"priority": 2**32},
    "priority a str": {"priority": "1"},
    "priority a bool": {"priority": True},
    "negative delay": {"delay": -1},
    "delay nan": {"delay": math.nan},
    "delay a str": {"delay": "1"},
    "negative ttr": {"ttr": -0.5},
    "key not a str": {"key": 5},
    "key too long": {"key": "k" * 1025},
    "key with a lone surrogate": {"key": "\ud800"},
    "depends_on a str": {"depends_on": "abc"},
    "depends_on a float": {"depends_on": [1.5]},
    "depends_on a bool": {"depends_on": [True]},
    "depends_on a 1-tuple": {"depends_on": [("t",)]},
    "depends_on a pair of ints": {"depends_on": [(1, 2)]},
    "depends_on a bad tube": {"depends_on": [("", "k")]},
    "depends_on a bad key": {"depends_on": [("t", "k" * 1025)]},
    "payload not JSON": {"payload": object()},
    "payload a function": {"payload": no_json},
    "payload too large": {"payload": "x" * MAX_BODY},
    "group ''": {"group": ""},
    "group not a str": {"group": 7},
    "group too long": {"group": "g" * 1025},
}


@pytest.mark.parametrize("bad", list(BAD_PUTS), ids=list(BAD_PUTS))
def test_bad_input_is_refused_at_the_put_and_writes_nothing(app: App, store: JobStore,
                                                            bad: str) -> None:
    box = setup(app)
    args: dict[str, Any] = {"tube": TUBE, "payload": {"ok": 1}} | BAD_PUTS[bad]
    tube, payload = args.pop("tube"), args.pop("payload")
    with pytest.raises(ValueError) as info:
        box.put(app.conn, tube, payload, **args)
    assert isinstance(info.value, K7Error), info.value
    app.commit()
    assert app.count() == 0
    with closing(app.relay(store)) as relay:
        assert relay_all(relay) == 0


def test_a_context_value_the_envelope_cannot_hold_is_refused(app: App) -> None:
    box = setup(app, Outbox(context=[tenant]))
    token = tenant.set(object())
    try:
        with pytest.raises(ValueError, match="context"):
            box.put(app.conn, TUBE, 1)
    finally:
        tenant.reset(token)
    app.commit()
    assert app.count() == 0


def test_bad_outbox_options() -> None:
    for name in ["", "Upper", "1st", "a-b", "a b", "t" * 52, "x;drop"]:
        with pytest.raises(ValueError, match="outbox table name"):
            Outbox(name)
    with pytest.raises(K7Error, match="codec"):
        Outbox(codec="yaml")
    with pytest.raises(TypeError):
        Outbox(context=["request_id"])  # type: ignore[list-item]


# --- what the job carries ---------------------------------------------------------------


def test_context_and_codec_reach_the_worker(app: App, store: JobStore) -> None:
    box = setup(app, Outbox(codec="msgpack", context=[request_id, tenant]))
    ctx = contextvars.copy_context()
    ctx.run(request_id.set, "req-42")
    ctx.run(box.put, app.conn, TUBE, {"blob": b"\x00\xff"})  # bytes: msgpack, not JSON
    box.put(app.conn, TUBE, {"blob": b""})  # no context set here
    app.commit()
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    seen: list[tuple[Any, str | None]] = []
    with Worker(store, codec="msgpack", context=[request_id, tenant]) as w:
        w.consumer(TUBE, lambda p: seen.append((p, request_id.get(None))))
        w.consume(TUBE)
        w.consume(TUBE)
    assert seen == [({"blob": b"\x00\xff"}, "req-42"), ({"blob": b""}, None)]
    assert len(store) == 0


def test_keys_dedupe_and_are_free_again_once_the_job_is_done(app: App, store: JobStore
                                                             ) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, "first", key="k")
    box.put(app.conn, TUBE, "same key, same transaction", key="k")
    box.put(app.conn, "other", "same key, other tube", key="k")
    app.commit()
    box.put(app.conn, TUBE, "same key, later transaction", key="k")
    app.commit()
    relay = app.relay(store)
    with closing(relay):
        relay_all(relay)
        assert store.remembered(TUBE) == []
        assert payloads(store) == ["first"]
        assert payloads(store, "other") == ["same key, other tube"]
        box.put(app.conn, TUBE, "the job is done: the key is free", key="k")
        app.commit()
        relay_all(relay)
    assert payloads(store) == ["the job is done: the key is free"]


def test_depends_on_ids_and_keys(app: App, store: JobStore) -> None:
    box = setup(app)
    direct = store.put(b"direct", tube="d")
    finished = store.put(b"finished", tube="d", key="fin")
    store.delete(finished)
    box.put(app.conn, TUBE, "a", key="a")
    box.put(app.conn, TUBE, "b", key="b", depends_on=[(TUBE, "a"), direct])
    box.put(app.conn, TUBE, "c", key="c", depends_on=[finished, ("d", "fin"),
                                                       ("nosuchtube", "x")])
    app.commit()
    with closing(app.relay(store)) as relay:
        assert relay_all(relay) == 3
    b, c, a = (store.peek(store.find(TUBE, k) or 0) for k in "bca")
    assert a is not None and b is not None and c is not None
    assert (a.state, b.state, c.state) == (JobState.READY, JobState.WAITING, JobState.READY)
    assert set(b.depends_on) == {a.id, direct} and c.depends_on == ()
    assert [j.body for j in take_all(store)] == [b'"a"', b'"c"']
    b = store.peek(b.id)
    assert b is not None and b.state is JobState.WAITING, "it still waits for the direct job"
    store.delete(direct)
    assert payloads(store) == ["b"]


def test_groups_reach_the_store(app: App, store: JobStore) -> None:
    """yoltq's example: a campaign's mails put in the transaction, its progress in the
    store once relayed."""
    box = setup(app)
    for to in range(5):
        box.put(app.conn, TUBE, {"to": to}, group="campaign/42")
    box.put(app.conn, TUBE, {"to": "other"}, group="campaign/7")
    box.put(app.conn, TUBE, {"to": "none"})
    app.commit()
    with closing(app.relay(store)) as relay:
        assert relay_all(relay) == 7
    assert store.groups(TUBE) == ["campaign/42", "campaign/7"]
    assert store.group_progress(TUBE, "campaign/42")["ready"] == 5
    job = store.peek_ready(TUBE)
    assert job is not None
    store.delete(job.id)
    progress = store.group_progress(TUBE, "campaign/42")
    assert (progress["ready"], progress["done"]) == (4, 1)


def test_delay_counts_from_the_put(app: App, store: JobStore) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, "waited an hour of 2", delay=7200)
    box.put(app.conn, TUBE, "waited 2 hours of 1", delay=3600)
    box.put(app.conn, TUBE, "now")
    app.execute(f"UPDATE {app.table} SET created_at = created_at - 3600")  # an hour old
    app.commit()
    start = time.time()
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == ["waited 2 hours of 1", "now"]
    job = store.peek_delayed(TUBE)
    assert job is not None and json.loads(job.body) == "waited an hour of 2"
    assert 3500 < job.ready_at - start < 3601


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # psycopg async runs on asyncio
@pytest.mark.anyio
async def test_async_connection(dsn: str, tmp_path: Path, anyio_backend: str) -> None:
    box = Outbox(context=[request_id])
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await box.acreate(conn)
        await box.acreate(conn)  # idempotent
        await conn.commit()
        request_id.set("async")
        first = await box.aput(conn, TUBE, {"n": 1}, key="one", priority=1)
        await conn.commit()
        await box.aput(conn, TUBE, {"n": 2})
        await conn.rollback()
        async with conn.transaction():
            await box.aput(conn, TUBE, {"n": 3}, depends_on=[(TUBE, "one")])
            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():
                    await box.aput(conn, TUBE, {"n": 4})
                    1 / 0  # noqa: B018
        with pytest.raises(ValueError, match="tube"):
            await box.aput(conn, "", {"n": 5})
        with pytest.raises(ValueError, match="priority"):
            await box.aput(conn, TUBE, {"n": 5}, priority=-1)
        await conn.commit()
        cur = await conn.execute("SELECT count(*) FROM k7_outbox")
        assert await cur.fetchone() == (2,) and first > 0
    with JobStore(tmp_path / "jobs") as store, closing(PostgresRelay(dsn, store)) as relay:
        assert relay_all(relay) == 2
        seen: list[tuple[Any, str | None]] = []
        with Worker(store, context=[request_id]) as w:
            w.consumer(TUBE, lambda p: seen.append((p, request_id.get(None))))
            w.consume(TUBE)
            w.consume(TUBE)
        assert seen == [({"n": 1}, "async"), ({"n": 3}, "async")]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:  # a reset, async
        six = await box.aput(conn, TUBE, {"n": 6})
        seven = await box.aput(conn, TUBE, {"n": 7})
        await conn.commit()
        with pytest.raises(ValueError, match="skip_upto"):
            await box.areset(conn, skip_upto=-1)
        await box.areset(conn, skip_upto=six)
        cur = await conn.execute("SELECT count(*), min(id) FROM k7_outbox")
        assert await cur.fetchone() == (1, seven)
