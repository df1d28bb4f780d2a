"""The relays (must 10): SqliteRelay and PostgresRelay, by ``relay_once`` and as threads
woken by commits; several at once; remembered keys and the done table; rows the store
refuses; a missing table; closing; a PostgreSQL connection terminated under the thread."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from k7core import K7Error
from k7core.jobs import JobStore
from k7core.outbox import Outbox, PostgresRelay, SqliteRelay
from tests.k7core.outbox._outboxhelp import (
    TUBE,
    App,
    counted,
    payloads,
    relay_all,
    setup,
    take_all,
    until,
    wait_payload,
)


def done_rows(dsn: str, table: str = "k7_outbox") -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT count(*) FROM {table}_done").fetchone()
        assert found is not None
        return int(found[0])


def put_many(app: App, box: Outbox, values: Iterable[Any], per_transaction: int = 1) -> None:
    for i, value in enumerate(values, 1):
        box.put(app.conn, TUBE, value)
        if i % per_transaction == 0:
            app.commit()
    app.commit()


# --- relay_once -------------------------------------------------------------------------


def test_relay_once_moves_rows_in_id_order_batch_by_batch(app: App, store: JobStore) -> None:
    box = setup(app)
    put_many(app, box, range(10), per_transaction=4)
    with closing(app.relay(store, batch=3)) as relay:
        assert [relay.relay_once() for _ in range(5)] == [3, 3, 3, 1, 0]
        assert (relay.relayed, relay.skipped) == (10, 0)
    jobs = take_all(store)
    assert [json.loads(j.body) for j in jobs] == list(range(10))
    assert [j.id for j in jobs] == sorted(j.id for j in jobs), "put in the rows' order"
    assert app.count() == 0
    assert store.remembered(TUBE) == []
    if app.kind == "pg":
        assert done_rows(app.where) == 0


def test_uncommitted_rows_wait_for_their_commit(app: App, store: JobStore) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, "open")
    with closing(app.relay(store)) as relay:
        assert relay.relay_once() == 0
        app.commit()
        assert relay.relay_once() == 1
    assert payloads(store) == ["open"]


def test_pg_forgets_the_keys_after_the_delete_committed(dsn: str, tmp_path: Path) -> None:
    """At the store's forget the relay's delete has committed (another connection sees the
    rows gone) and the keys were remembered until then."""
    seen: list[tuple[str, list[str], int]] = []

    class Watched(JobStore):
        def forget(self, tube: str, keys: Iterable[str]) -> int:
            keys = list(keys)
            with psycopg.connect(dsn) as other:
                found = other.execute("SELECT count(*) FROM k7_outbox").fetchone()
            assert found is not None
            seen.append((tube, self.remembered(tube), found[0]))
            return super().forget(tube, keys)

    app = App("pg", dsn)
    box = setup(app)
    box.put(app.conn, TUBE, "a")
    box.put(app.conn, TUBE, "b", key="mine")
    box.put(app.conn, "u", "c")
    app.commit()
    with Watched(tmp_path / "jobs") as store, closing(PostgresRelay(dsn, store)) as relay:
        assert relay.relay_once() == 3
        assert store.remembered(TUBE) == store.remembered("u") == []
        assert done_rows(dsn) == 3, "deleted at the next batch"
        assert relay.relay_once() == 0
        assert done_rows(dsn) == 0
        assert payloads(store) == ["a", "b"] and payloads(store, "u") == ["c"]
    app.close()
    assert sorted((t, len(r), n) for t, r, n in seen) == [(TUBE, 2, 0), ("u", 1, 0)]
    assert "mine" in next(r for t, r, _ in seen if t == TUBE)


def test_pg_a_relay_that_starts_forgets_what_a_dead_one_left(dsn: str, tmp_path: Path
                                                             ) -> None:
    class Dies(Exception):
        pass

    class DiesAtForget(JobStore):  # a relay that dies between its commit and its forget
        dying = True

        def forget(self, tube: str, keys: Iterable[str]) -> int:
            if self.dying:
                raise Dies
            return super().forget(tube, keys)

    app = App("pg", dsn)
    box = setup(app)
    put_many(app, box, ["a", "b", "c"])
    with DiesAtForget(tmp_path / "jobs") as store:
        with closing(PostgresRelay(dsn, store)) as relay, pytest.raises(Dies):
            relay.relay_once()
        assert len(store.remembered(TUBE)) == 3 and done_rows(dsn) == 3
        assert app.count() == 0
        store.dying = False
        with closing(PostgresRelay(dsn, store)) as other:
            assert other.relay_once() == 0
            assert store.remembered(TUBE) == [] and done_rows(dsn) == 0
        assert payloads(store) == ["a", "b", "c"]
    app.close()


# --- threads ----------------------------------------------------------------------------


def test_the_thread_wakes_at_each_commit(app: App, store: JobStore) -> None:
    box = setup(app)
    lags = []
    with app.relay(store) as relay:
        for i in range(20):
            box.put(app.conn, TUBE, i)
            app.commit()
            committed = time.monotonic()
            assert wait_payload(store) == i
            lags.append(time.monotonic() - committed)
        # woken by the commit, not by the look a relay takes every second
        assert sorted(lags)[len(lags) // 2] < 0.3, lags
        box.put(app.conn, TUBE, "rolled back")
        app.rollback()
        box.put(app.conn, TUBE, "last")
        app.commit()
        assert wait_payload(store) == "last"
        assert relay.relayed == 21 and relay.error is None
    assert take_all(store) == []
    assert store.remembered(TUBE) == []


def test_a_relay_started_late_finds_what_was_committed_before(app: App, store: JobStore
                                                             ) -> None:
    box = setup(app)
    put_many(app, box, range(50), per_transaction=7)
    with app.relay(store, batch=8):
        assert [wait_payload(store) for _ in range(50)] == list(range(50))


def test_pg_several_relay_threads_share_the_rows_each_once(dsn: str, store: JobStore) -> None:
    app = App("pg", dsn)
    box = setup(app)
    relays = [PostgresRelay(dsn, store, batch=7) for _ in range(4)]

    def write(values: range, per_transaction: int) -> None:
        writer = App("pg", dsn)
        put_many(writer, box, values, per_transaction)
        writer.close()

    n = 600
    try:
        for relay in relays:
            relay.start()
        writers = [threading.Thread(target=write, args=(range(w, n, 3), 1 + w * 4))
                   for w in range(3)]
        for t in writers:
            t.start()
        got: list[Any] = [wait_payload(store) for _ in range(n)]
        for t in writers:
            t.join()
        assert sorted(got) == list(range(n))
        assert sum(r.relayed for r in relays) == n
        assert sum(r.relayed > 0 for r in relays) >= 2, "the relays shared the work"
        until(lambda: done_rows(dsn) == 0)  # each relay's next look deletes its last ones
    finally:
        for relay in relays:
            relay.close()
    assert take_all(store) == [] and store.remembered(TUBE) == []
    assert app.count() == 0
    app.close()


def test_sqlite_two_relays_into_one_store_take_turns(db_path: Path, store: JobStore) -> None:
    app = App("sqlite", str(db_path))
    box = setup(app)
    app.execute("PRAGMA journal_mode = wal")
    first, second = SqliteRelay(db_path, store, batch=5), SqliteRelay(db_path, store, batch=3)
    n = 400
    with first, second:
        put_many(app, box, range(n), per_transaction=9)
        got = [wait_payload(store) for _ in range(n)]
        assert got == list(range(n)), "one store, in the rows' order"
        assert first.relayed + second.relayed == n
    # relay_once from two threads at once
    put_many(app, box, range(n, 2 * n), per_transaction=5)
    third, fourth = SqliteRelay(db_path, store, batch=2), SqliteRelay(db_path, store, batch=7)
    threads = [threading.Thread(target=relay_all, args=(r,)) for r in (third, fourth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    third.close()
    fourth.close()
    assert counted(payloads(store)) == counted(list(range(n, 2 * n)))
    assert app.count() == 0
    app.close()


def test_closing_is_prompt_and_idempotent(app: App, store: JobStore) -> None:
    setup(app)
    relay = app.relay(store).start()
    assert relay.start() is relay  # started once
    assert relay.relay_once() == 0
    begin = time.monotonic()
    relay.close()
    assert time.monotonic() - begin < 1.0
    assert relay.closed
    relay.close()
    with pytest.raises(K7Error, match="closed"):
        relay.start()


def test_the_thread_ends_with_the_store(app: App, tmp_path: Path) -> None:
    setup(app)
    store = JobStore(tmp_path / "short")
    relay = app.relay(store).start()
    store.close()
    begin = time.monotonic()
    relay.close()  # joins the thread, which saw the store closed
    assert time.monotonic() - begin < 2.0 and relay.relayed == 0


# --- failures ---------------------------------------------------------------------------


def test_a_missing_outbox_is_a_clear_error(app: App, store: JobStore, tmp_path: Path) -> None:
    app.execute("CREATE TABLE unrelated (x INTEGER)")
    app.commit()
    missing = r"(?s)no outbox 'k7_outbox'.*Outbox\.create"
    with closing(app.relay(store)) as relay, pytest.raises(FileNotFoundError, match=missing):
        relay.relay_once()
    with closing(SqliteRelay(tmp_path / "nosuch.db", store)) as relay, pytest.raises(
            FileNotFoundError, match="does not exist"):
        relay.relay_once()
    assert not (tmp_path / "nosuch.db").exists()
    with pytest.raises(TypeError, match="JobStore"):
        SqliteRelay(tmp_path / "x.db", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch"):
        PostgresRelay("postgresql:///x", store, batch=0)
    with pytest.raises(ValueError, match="outbox table name"):
        SqliteRelay(tmp_path / "x.db", store, table="no-such")


def raw_insert(app: App, tube: Any, body: Any, *, priority: Any = 1024, delay: Any = 0.0,
               ttr: Any = 60.0, key: Any = None, depends_on: Any = None, group: Any = None
               ) -> None:
    app.execute(f"INSERT INTO {app.table} (tube, body, priority, delay, ttr, key, depends_on, "
                "created_at, job_group) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (tube, body, priority, delay, ttr, key, depends_on, time.time(), group))


def test_rows_the_store_refuses_are_skipped_and_logged(app: App, store: JobStore,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, "first")
    bad: list[dict[str, Any]] = [
        {"tube": "bad tube"},
        {"priority": -1},
        {"priority": 2**40},
        {"ttr": -1.0},
        {"key": "k" * 2000},
        {"depends_on": "not json"},
        {"depends_on": "[1.5]"},
        {"depends_on": '[["", "k"]]'},
        {"depends_on": '{"a": 1}'},
        {"group": ""},
        {"group": "g" * 1025},
    ]
    if app.kind == "sqlite":  # SQLite keeps any type in any column
        bad += [{"body": "a str"}, {"priority": "high"}, {"delay": "soon"}, {"ttr": "long"}]
    for row in bad:
        raw_insert(app, **({"tube": TUBE, "body": b'"bad"'} | row))
    box.put(app.conn, TUBE, "last")
    app.commit()
    with caplog.at_level(logging.ERROR, logger="k7core.outbox"), closing(app.relay(store)) as relay:
        relay_all(relay)
        assert (relay.relayed, relay.skipped) == (2, len(bad))
    assert payloads(store) == ["first", "last"]
    assert len([r for r in caplog.records if "cannot be a job" in r.getMessage()]) == len(bad)
    assert app.count() == 0


def test_pg_the_thread_survives_its_connections_being_terminated(
        dsn: str, store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    app = App("pg", dsn)
    box = setup(app)
    pg_conn = app.conn
    assert isinstance(pg_conn, psycopg.Connection)
    with caplog.at_level(logging.ERROR, logger="k7core.outbox"), PostgresRelay(
            dsn, store) as relay:
        for i in range(3):
            box.put(app.conn, TUBE, i)
            app.commit()
            assert wait_payload(store) == i
            with psycopg.connect(dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND pid <> %s", (pg_conn.info.backend_pid,)).fetchall()
            assert len(killed) == 2, "the relay's connection and its listener"
        box.put(app.conn, TUBE, "after")
        app.commit()
        assert wait_payload(store) == "after"
        assert relay.error is not None
    app.close()


def test_sqlite_a_locked_database_is_retried(db_path: Path, store: JobStore,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A relay whose write (it records the rows it takes before putting them, and deletes
    the rows relayed) meets a long write transaction logs it and goes on once it ends."""
    app = App("sqlite", str(db_path))
    box = setup(app)
    with caplog.at_level(logging.WARNING, logger="k7core.outbox"), SqliteRelay(
            db_path, store, busy_timeout=0.05) as relay:
        box.put(app.conn, TUBE, "one")
        app.commit()
        assert wait_payload(store) == "one"
        box.put(app.conn, TUBE, "two")  # an open write transaction: the relay cannot write
        blocker = sqlite3.connect(db_path)
        app.commit()
        blocker.execute("BEGIN IMMEDIATE")
        until(lambda: "waiting for the write lock" in caplog.text)
        assert take_all(store) == [] and app.count() >= 1 and relay.error is None
        blocker.rollback()
        blocker.close()
        assert wait_payload(store) == "two"
        until(lambda: app.count() == 0)
    app.close()
