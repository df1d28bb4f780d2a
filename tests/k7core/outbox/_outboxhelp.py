"""Helpers of the outbox tests (not a test module): the application's connection to SQLite
or PostgreSQL behind one face, and what the store holds."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from k7core.jobs import Job, JobStore
from k7core.outbox import DEFAULT_TABLE, Outbox, PostgresRelay, Relay, SqliteRelay

TUBE = "t"


class App:
    """An application's connection: ``kind`` "sqlite" (a file, Python's default
    transactions) or "pg" (psycopg, not autocommit), and a relay of its outbox."""

    def __init__(self, kind: str, where: str, table: str = DEFAULT_TABLE) -> None:
        self.kind, self.where, self.table = kind, where, table
        self.conn: sqlite3.Connection | psycopg.Connection[Any] = (
            sqlite3.connect(where) if kind == "sqlite" else psycopg.connect(where))

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``?`` placeholders) in the current transaction; the rows it gives."""
        if isinstance(self.conn, sqlite3.Connection):
            return self.conn.execute(sql, params).fetchall()
        cur = self.conn.execute(sql.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []

    def count(self, table: str | None = None) -> int:
        """Rows of ``table`` (default: the outbox), committed or not, as this connection
        sees them."""
        return int(self.execute(f"SELECT count(*) FROM {table or self.table}")[0][0])

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def relay(self, store: JobStore, **options: Any) -> Relay:
        if self.kind == "sqlite":
            return SqliteRelay(self.where, store, table=self.table, **options)
        return PostgresRelay(self.where, store, table=self.table, **options)

    def close(self) -> None:
        self.conn.close()


def connect(kind: str, db_path: Path, dsn: str, table: str = DEFAULT_TABLE) -> App:
    return App(kind, str(db_path) if kind == "sqlite" else dsn, table)


def setup(app: App, box: Outbox | None = None) -> Outbox:
    """The outbox of ``app``, its tables created and committed."""
    box = box or Outbox(app.table)
    box.create(app.conn)
    app.commit()
    return box


def relay_all(relay: Relay) -> int:
    """Run ``relay_once`` until it finds no row (then once more, so a PostgreSQL relay
    deletes its last done rows); how many rows it handled."""
    total = 0
    for _ in range(100_000):
        n = relay.relay_once()
        if not n:
            relay.relay_once()
            return total
        total += n
    raise AssertionError(f"{relay} found rows after {total}")


def take_all(store: JobStore, tube: str = TUBE) -> list[Job]:
    """Every ready job of ``tube``, most urgent first, reserved and deleted."""
    out = []
    with store.owner() as me:
        while (job := me.reserve([tube], timeout=0)) is not None:
            me.delete(job.id)
            out.append(job)
    return out


def payloads(store: JobStore, tube: str = TUBE) -> list[Any]:
    """The JSON payloads of :func:`take_all`."""
    return [json.loads(job.body) for job in take_all(store, tube)]


def wait_payload(store: JobStore, tube: str = TUBE, timeout: float = 10.0) -> Any:
    """The payload of the next job of ``tube`` (reserved and deleted), waiting for it."""
    with store.owner() as me:
        job = me.reserve([tube], timeout=timeout)
        assert job is not None, f"no job in tube {tube!r} within {timeout} s"
        me.delete(job.id)
        return json.loads(job.body)


def counted(values: list[Any]) -> Counter[str]:
    """``values`` counted by their JSON text (dicts are not hashable)."""
    return Counter(json.dumps(v, sort_keys=True) for v in values)


def until(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait for ``check()`` to hold: for a state nothing signals (a relay's next look)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{check} did not hold within {timeout} s"
        time.sleep(0.02)
