"""Which table a relay's position belongs to, and which store an outbox feeds (issue 30,
items 6 and 7): ids that went back (a restored database, a reset sequence, a table made
again by hand) are refused with the way out, a table made again by ``Outbox.create`` is
relayed from its first row, and an outbox feeds one store (or one beanstalkd server): a
second one is refused, also after a relay died between its puts and its commit."""

from __future__ import annotations

import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from k7core.jobs import JobStore
from k7core.outbox import Outbox, OutboxRewoundError, OutboxTargetError, SqliteRelay
from tests._childproc import Child
from tests._queuehelp import k7
from tests.k7core.outbox._outboxhelp import TUBE, App, payloads, relay_all, setup

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
