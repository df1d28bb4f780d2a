"""Which table a relay's position belongs to, and which store an outbox feeds (issue 30,
items 6 and 7): ids that went back (a restored database, a reset sequence, a table made
again by hand) are refused with the way out, a table made again by ``Outbox.create`` is
relayed from its first row, and an outbox feeds one store (or one beanstalkd server): a
second one is refused, also after a relay died between its puts and its commit."""

from __future__ import annotations

import logging
import signal
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from k7core.jobs import JobStore
from k7core.outbox import Outbox, OutboxRewoundError, OutboxTargetError, Relay, SqliteRelay
from tests._childproc import Child
from tests._queuehelp import k7
from tests.k7core.outbox._outboxhelp import (
    TUBE,
    App,
    payloads,
    relay_all,
    setup,
    until,
    wait_payload,
)

CHILD = "tests.k7core.outbox._outboxchild"


def put_range(app: App, box: Outbox, values: range) -> None:
    for n in values:
        box.put(app.conn, TUBE, n)
    app.commit()


# --- ids that go back (item 6) ----------------------------------------------------------


def test_sqlite_a_database_restored_from_a_backup_is_refused(db_path: Path, store: JobStore,
                                                             tmp_path: Path) -> None:
    """Rows 1-50, a backup, rows 51-100 relayed; the backup restored and 100 new rows
    committed (ids 51-150, past the store's mark): the relay refuses instead of skipping
    ids 51-100, deletes nothing, and relays every new row once after the reset."""
    app = App("sqlite", str(db_path))
    assert isinstance(app.conn, sqlite3.Connection)
    box = setup(app)
    put_range(app, box, range(50))
    with closing(sqlite3.connect(tmp_path / "backup.db")) as backup:
        app.conn.backup(backup)
        put_range(app, box, range(50, 100))
        with closing(SqliteRelay(db_path, store)) as relay:
            assert relay_all(relay) == 100
        assert payloads(store) == list(range(100))
        backup.backup(app.conn)  # the restore
    put_range(app, box, range(1000, 1100))
    assert app.count() == 150
    with closing(SqliteRelay(db_path, store)) as relay:
        with pytest.raises(OutboxRewoundError) as caught:
            relay.relay_once()
        text = str(caught.value)
        assert "k7_outbox" in text and "100" in text and "k7 outbox reset" in text, text
        assert app.count() == 150 and payloads(store) == [], "nothing deleted or relayed"
    # the way out: the rows of the backup (ids up to 50) were relayed before
    box.reset(app.conn, skip_upto=50)
    with closing(SqliteRelay(db_path, store)) as relay:
        relay_all(relay)
    assert payloads(store) == list(range(1000, 1100))
    assert app.count() == 0
    app.close()


def test_pg_a_database_restored_from_a_backup_is_refused(dsn: str, pg_server: Any,
                                                        store: JobStore) -> None:
    """As the SQLite test: the backup is a copy of the database (CREATE DATABASE ...
    TEMPLATE), restored by dropping the database and copying the backup back."""
    name = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    admin_dsn = str(pg_server.get_uri())

    def copy(source: str, target: str, drop: bool) -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            if drop:
                admin.execute(f"DROP DATABASE {target} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {target} TEMPLATE {source}")

    app = App("pg", dsn)
    box = setup(app)
    put_range(app, box, range(50))
    app.close()
    copy(name, f"{name}_backup", drop=False)
    app = App("pg", dsn)
    put_range(app, box, range(50, 100))
    with closing(app.relay(store)) as relay:
        assert relay_all(relay) == 100
    assert payloads(store) == list(range(100))
    app.close()
    try:
        copy(f"{name}_backup", name, drop=True)  # the restore
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name}_backup WITH (FORCE)")
    app = App("pg", dsn)
    put_range(app, box, range(1000, 1100))
    assert app.count() == 150
    with closing(app.relay(store)) as relay:
        with pytest.raises(OutboxRewoundError, match=r"(?s)up to id 100.*k7 outbox reset"):
            relay.relay_once()
        assert app.count() == 150 and payloads(store) == []
    box.reset(app.conn, skip_upto=50)
    app.commit()
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == list(range(1000, 1100))
    app.close()


def test_a_table_made_again_by_create_is_relayed_from_its_first_row(app: App,
                                                                    store: JobStore) -> None:
    box = setup(app)
    put_range(app, box, range(100))
    with closing(app.relay(store)) as relay:
        relay_all(relay)
        assert len(payloads(store)) == 100
        app.execute(f"DROP TABLE {app.table}")
        app.commit()
        setup(app)
        put_range(app, box, range(200, 240))
        relay_all(relay)  # the same relay, running on
    assert payloads(store) == list(range(200, 240))
    assert app.count() == 0


def rewind_ids(app: App) -> None:
    """Make the outbox's next ids start again at 1, as a table made again by hand (or a
    sequence reset) does."""
    if app.kind == "sqlite":
        app.execute("DELETE FROM sqlite_sequence WHERE name = ?", (app.table,))
    else:
        app.execute(f"ALTER SEQUENCE {app.table}_id_seq RESTART")
    app.commit()


def test_ids_that_went_back_are_refused(app: App, store: JobStore) -> None:
    box = setup(app)
    put_range(app, box, range(100))
    with closing(app.relay(store)) as relay:
        relay_all(relay)
        assert len(payloads(store)) == 100
        rewind_ids(app)
        put_range(app, box, range(200, 240))
        with pytest.raises(OutboxRewoundError, match=r"(?s)went back.*k7 outbox reset"):
            relay.relay_once()
    assert app.count() == 40 and payloads(store) == []
    box.reset(app.conn)
    app.commit()
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == list(range(200, 240))


# --- one outbox, one store (item 7) -----------------------------------------------------


def test_sqlite_a_second_store_is_refused(db_path: Path, store: JobStore,
                                          tmp_path: Path) -> None:
    app = App("sqlite", str(db_path))
    box = setup(app)
    put_range(app, box, range(10))
    with closing(SqliteRelay(db_path, store, batch=4)) as relay:
        assert relay.relay_once() == 4
    put_range(app, box, range(10, 20))
    with JobStore(tmp_path / "other") as other, closing(SqliteRelay(db_path, other)) as relay:
        with pytest.raises(OutboxTargetError) as caught:
            relay.relay_once()
        text = str(caught.value)
        assert str(store.path.resolve()) in text and "k7 outbox reset" in text, text
        assert len(other) == 0
    with closing(SqliteRelay(db_path, store)) as relay:
        relay_all(relay)
    assert payloads(store) == list(range(20))
    put_range(app, box, range(20, 22))
    (store.path / "k7-store.id").unlink()  # the same directory, a store made anew
    with closing(SqliteRelay(db_path, store)) as relay, pytest.raises(
            OutboxTargetError, match="the same place, another identity"):
        relay.relay_once()
    app.close()


def test_pg_a_relay_killed_between_its_puts_and_its_commit_leaves_no_row_in_a_second_store(
        dsn: str, tmp_path: Path) -> None:
    """Relay A (a child) SIGKILLed right after its third put of a batch of five, before the
    batch's commit: relay B into another store is refused; A's store, relayed again, holds
    each row once."""
    app = App("pg", dsn)
    box = setup(app)
    put_range(app, box, range(5))
    first = tmp_path / "first"
    with Child("relay", "pg", dsn, str(first), "5", "1", "put-after:3",
               program=CHILD) as child:
        assert child.line() == b"ready"
        lines = child.lines_until_exit(total=60)
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
    assert len(lines) == 3 and app.count() == 5, "killed before its commit"
    with JobStore(tmp_path / "second") as other, closing(app.relay(other)) as relay:
        with pytest.raises(OutboxTargetError, match=r"(?s)first.*k7 outbox reset"):
            relay.relay_once()
        assert len(other) == 0
    with JobStore(first) as store, closing(app.relay(store)) as relay:
        relay_all(relay)
        assert payloads(store) == list(range(5))
    assert app.count() == 0
    app.close()


def test_the_command_line_refuses_a_second_store_and_resets(db_path: Path,
                                                           tmp_path: Path) -> None:
    app = App("sqlite", str(db_path))
    box = setup(app)
    put_range(app, box, range(3))
    with JobStore(tmp_path / "first") as store, closing(SqliteRelay(db_path, store)) as relay:
        relay_all(relay)
    put_range(app, box, range(3, 5))
    status = k7("outbox", "status", db_path)
    assert status.returncode == 0, status.stderr
    assert str((tmp_path / "first").resolve()) in status.stdout.decode()
    refused = k7("outbox", "relay", db_path, tmp_path / "second")
    err = refused.stderr.decode()
    assert refused.returncode == 3 and "OutboxTargetError" in err, err
    assert "Traceback" not in err and "k7 outbox reset" in err, err
    reset = k7("outbox", "reset", db_path)
    assert reset.returncode == 0, reset.stderr
    with JobStore(tmp_path / "second") as store, closing(SqliteRelay(db_path, store)) as relay:
        relay_all(relay)
        assert payloads(store) == [3, 4]
    app.close()


def test_two_relays_into_two_stores_at_once_bind_one(app: App, tmp_path: Path) -> None:
    """Two relays into two stores start at the same moment: one binds the outbox and
    relays every row, the other is refused; no row is in both stores."""
    box = setup(app)
    put_range(app, box, range(300))
    with JobStore(tmp_path / "a") as a, JobStore(tmp_path / "b") as b:
        relays = [app.relay(a, batch=7), app.relay(b, batch=7)]
        start = threading.Barrier(2)
        refused: list[BaseException] = []

        def run(relay: Relay) -> None:
            start.wait()
            try:
                relay_all(relay)
            except OutboxTargetError as exc:
                refused.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in relays]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in relays:
            r.close()
        assert len(refused) == 1, refused
        got = [payloads(a), payloads(b)]
    assert sorted(got, key=len) == [[], list(range(300))]
    assert app.count() == 0


OLD_SQLITE = [  # the tables as the version before the binding made them
    "CREATE TABLE k7_outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, tube TEXT NOT NULL, "
    "body BLOB NOT NULL, priority INTEGER NOT NULL, delay REAL NOT NULL, ttr REAL NOT NULL, "
    "key TEXT, depends_on TEXT, created_at REAL NOT NULL, job_group TEXT)",
    "CREATE TABLE k7_outbox_meta (name TEXT NOT NULL)",
    "INSERT INTO k7_outbox_meta VALUES ('outbox-0123456789abcdef')",
]
OLD_PG = [
    "CREATE TABLE k7_outbox (id BIGSERIAL PRIMARY KEY, tube TEXT NOT NULL, "
    "body BYTEA NOT NULL, priority BIGINT NOT NULL, delay DOUBLE PRECISION NOT NULL, "
    "ttr DOUBLE PRECISION NOT NULL, key TEXT, depends_on TEXT, "
    "created_at DOUBLE PRECISION NOT NULL, job_group TEXT)",
    "CREATE TABLE k7_outbox_meta (name TEXT NOT NULL, "
    "one BOOLEAN NOT NULL DEFAULT TRUE UNIQUE CHECK (one))",
    "INSERT INTO k7_outbox_meta (name) VALUES ('outbox-0123456789abcdef')",
    "CREATE TABLE k7_outbox_done (tube TEXT NOT NULL, key TEXT NOT NULL)",
]


def test_an_outbox_made_by_an_older_version_is_upgraded(app: App, store: JobStore) -> None:
    """A relay of an outbox whose meta table has only its name adds the columns, keeps the
    name (the store's mark of it still applies), binds and relays; create keeps it too."""
    for statement in OLD_SQLITE if app.kind == "sqlite" else OLD_PG:
        app.execute(statement)
    app.commit()
    box = Outbox()
    put_range(app, box, range(5))
    with closing(app.relay(store, batch=2)) as relay:
        assert relay.relay_once() == 2
    assert app.execute("SELECT name FROM k7_outbox_meta") == [("outbox-0123456789abcdef",)]
    assert store.mark("outbox-0123456789abcdef") == 2
    setup(app)  # the new version's create on the old tables
    put_range(app, box, range(5, 8))
    with closing(app.relay(store)) as relay:
        relay_all(relay)
    assert payloads(store) == list(range(8))
    assert app.execute("SELECT name, target FROM k7_outbox_meta")[0][0] == (
        "outbox-0123456789abcdef")


def test_pg_the_command_line_status_and_reset(dsn: str, tmp_path: Path) -> None:
    missing = k7("outbox", "status", dsn)
    err = missing.stderr.decode()
    assert missing.returncode == 1 and "no outbox 'k7_outbox'" in err, err
    assert "Traceback" not in err and "Traceback" not in k7("outbox", "reset", dsn).stderr.decode()
    app = App("pg", dsn)
    box = setup(app)
    put_range(app, box, range(3))
    assert "not bound to a store yet" in k7("outbox", "status", dsn).stdout.decode()
    with JobStore(tmp_path / "first") as store, closing(app.relay(store)) as relay:
        relay_all(relay)
    put_range(app, box, range(3, 6))
    status = k7("outbox", "status", dsn).stdout.decode()
    assert f"feeds the job store {(tmp_path / 'first').resolve()}" in status, status
    reset = k7("outbox", "reset", dsn, "--skip-upto", "4")
    assert reset.returncode == 0 and b"relays the 2 rows" in reset.stdout, reset
    with JobStore(tmp_path / "second") as store, closing(app.relay(store)) as relay:
        relay_all(relay)
        assert payloads(store) == [4, 5]
    app.close()


def test_a_refused_thread_logs_without_a_traceback_and_resumes_after_a_reset(
        app: App, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    box = setup(app)
    put_range(app, box, range(2))
    with JobStore(tmp_path / "first") as first, closing(app.relay(first)) as relay:
        relay_all(relay)
    put_range(app, box, range(2, 4))
    with caplog.at_level(logging.ERROR, logger="k7core.outbox"), \
            JobStore(tmp_path / "second") as second, app.relay(second) as relay:
        until(lambda: isinstance(relay.error, OutboxTargetError))
        assert "Traceback" not in caplog.text and "k7 outbox reset" in caplog.text
        box.reset(app.conn)
        app.commit()
        assert [wait_payload(second), wait_payload(second)] == [2, 3]
