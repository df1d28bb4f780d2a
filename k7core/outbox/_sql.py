"""The outbox tables and every statement on them, for SQLite and PostgreSQL: the one place
that knows their columns.

An outbox named ``t`` is three tables:

- ``t``: one row per job put and not yet relayed (``id`` grows; SQLite's ``AUTOINCREMENT``
  never reuses one, so a relay's position stays meaningful after deletes);
- ``t_meta``: one row: the outbox's name in job stores (``outbox-`` and 16 random hex
  digits, made anew with the table ``t`` and by a reset): the relays' mark, the prefix of
  the PostgreSQL relay's keys; the store or server the outbox feeds (``target``, bound by
  the first relay, ``target_where`` saying where it is); ``upto``, the highest row id
  relays may take, recorded before they put them (0: none yet; -1: not known, the
  table was made by a version that did not record it);
- ``t_done`` (PostgreSQL): the keys of rows deleted by a relay that the store may still
  remember, until the relay has forgotten them.

PostgreSQL also gets a statement trigger that notifies channel ``t`` on every insert, so a
relay that listens wakes at the commit, whoever inserted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterable
from typing import Any, NamedTuple

from .._errors import InvalidNameError
from ..jobs._errors import InvalidJobError
from ..jobs._machine import check_key, check_tube

DEFAULT_TABLE = "k7_outbox"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,50}")

COLUMNS = "id, tube, body, priority, delay, ttr, key, depends_on, created_at, job_group"


class Row(NamedTuple):
    """One outbox row: a job to put."""

    id: int
    tube: str
    body: bytes
    priority: int
    delay: float
    ttr: float
    key: str | None
    depends_on: str | None  # JSON: [id or [tube, key], ...]
    created_at: float
    group: str | None


def row(values: tuple[Any, ...]) -> Row:
    """A fetched row (PostgreSQL gives memoryviews for bytea with some loaders; a body that
    is not bytes-like, as SQLite may hold, is left to the store to refuse)."""
    r = Row(*values)
    return r._replace(body=bytes(r.body)) if isinstance(r.body, memoryview | bytearray) else r


def check_table(name: str) -> str:
    """``name`` if it can name an outbox table (lower-case letters, digits, ``_``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"outbox table name {name!r} is not allowed",
            hint="use 1 to 51 lower-case letters, digits and underscores, not starting "
                 "with a digit",
        )
    return name


def deps_text(depends_on: Iterable[int | tuple[str, str]]) -> str | None:
    """The ``depends_on`` column for a put (None: no dependencies)."""
    if isinstance(depends_on, str | bytes):
        raise InvalidJobError("depends_on is a sequence of job ids or (tube, key) pairs",
                              hint=f"got a {type(depends_on).__name__}: wrap it in a list")
    deps: list[int | list[str]] = []
    for d in depends_on:
        if isinstance(d, int) and not isinstance(d, bool):
            deps.append(d)
        elif (isinstance(d, tuple) and len(d) == 2
              and all(isinstance(x, str) for x in d)):
            deps.append([check_tube(d[0]), check_key(d[1])])  # as the relay's put will
        else:
            raise InvalidJobError(f"depends_on takes job ids and (tube, key) pairs, not {d!r:.80}",
                                  hint="use ints and (str, str) tuples")
    return json.dumps(deps) if deps else None


def deps_of(text: str | None) -> list[int | tuple[str, str]]:
    """The ``depends_on`` column, as ``JobStore.put`` takes it."""
    if text is None:
        return []
    return [d if isinstance(d, int) else (d[0], d[1]) for d in json.loads(text)]


Steps = Generator[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]], None]
"""Statements to run in turn, each sent back the rows it gave (``[]`` for none): a
create or a reset written once, driven on sqlite3 and on psycopg's sync and async
connections."""


def run_steps(conn: Any, steps: Steps) -> None:
    """Run ``steps`` on a sqlite3 or a sync psycopg connection, in its current
    transaction."""
    rows: list[tuple[Any, ...]] | None = None
    while True:
        try:
            sql, params = steps.send(rows)  # type: ignore[arg-type]  # None: the first
        except StopIteration:
            return
        cur = conn.execute(sql, params) if params else conn.execute(sql)
        rows = cur.fetchall() if cur.description else []


async def arun_steps(conn: Any, steps: Steps) -> None:
    """:func:`run_steps` on a psycopg ``AsyncConnection``."""
    rows: list[tuple[Any, ...]] | None = None
    while True:
        try:
            sql, params = steps.send(rows)  # type: ignore[arg-type]
        except StopIteration:
            return
        cur = await (conn.execute(sql, params) if params else conn.execute(sql))
        rows = await cur.fetchall() if cur.description else []


class Tables:
    """What both databases' statements share: giving the outbox a new name."""

    table: str
    create: list[str]
    renew: str
    seq: str
    skip_upto: str
    exists: str
    clear_sent: str
    meta_columns: str
    add_columns: dict[str, str]

    def lock_steps(self) -> Steps:
        """Take the create's lock (PostgreSQL's advisory lock: concurrent creates would
        collide in the catalogue; SQLite's write transaction is one)."""
        yield from ()

    def create_steps(self) -> Steps:
        """Create the tables if missing, add the columns an older outbox's meta table lacks;
        a table ``t`` made anew (dropped before) gets a new name: a position in a store
        is one table's."""
        yield from self.lock_steps()
        existed = (yield self.exists, (self.table,))[0][0]
        for statement in self.create:
            yield statement, ()
        yield from self.migrate_steps()
        if not existed:
            yield from self._renew_steps(None)

    def reset_steps(self, skip_upto: int | None) -> Steps:
        """A new name, no target: the next relay binds its store and relays the rows
        there (those at or below ``skip_upto`` deleted first)."""
        yield from self.lock_steps()
        yield from self._renew_steps(skip_upto)

    def upgrade_steps(self) -> Steps:
        """What a relay runs at connect: the columns an older version's outbox lacks
        (under the create's lock, taken only when some are missing)."""
        have = {r[0] for r in (yield self.meta_columns, ())}
        if not have.issuperset(self.add_columns):
            yield from self.lock_steps()
            yield from self.migrate_steps()

    def migrate_steps(self) -> Steps:
        """Add the columns the meta table of an outbox made by an older version lacks
        (each ALTER only when needed: it locks the table)."""
        have = {r[0] for r in (yield self.meta_columns, ())}
        for column, statement in self.add_columns.items():
            if column not in have:
                yield statement, ()

    def _renew_steps(self, skip_upto: int | None) -> Steps:
        """A new name and no target; rows at or below ``skip_upto`` deleted; the beanstalkd
        relay's record of the old table's rows (``t_sent``) cleared."""
        yield self.renew, ()
        if skip_upto is not None:
            yield self.skip_upto, (skip_upto,)
        if (yield self.exists, (f"{self.table}_sent",))[0][0]:
            yield self.clear_sent, ()


class Sqlite(Tables):
    """The statements for an outbox in SQLite."""

    def __init__(self, table: str) -> None:
        t = self.table = check_table(table)
        self.new_name = "'outbox-' || lower(hex(randomblob(8)))"
        self.exists = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
        self.create = [
            f"CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "tube TEXT NOT NULL, body BLOB NOT NULL, priority INTEGER NOT NULL, "
            "delay REAL NOT NULL, ttr REAL NOT NULL, key TEXT, depends_on TEXT, "
            "created_at REAL NOT NULL, job_group TEXT)",
            f"CREATE TABLE IF NOT EXISTS {t}_meta (name TEXT NOT NULL, target TEXT, "
            "target_where TEXT, upto INTEGER NOT NULL DEFAULT 0)",
            f"INSERT INTO {t}_meta (name) SELECT {self.new_name} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t}_meta)",
        ]
        self.meta_columns = f"SELECT name FROM pragma_table_info('{t}_meta')"
        self.add_columns = {c: f"ALTER TABLE {t}_meta ADD COLUMN {c} {kind}"
                            for c, kind in [("target", "TEXT"), ("target_where", "TEXT"),
                                            ("upto", "INTEGER NOT NULL DEFAULT -1")]}
        self.insert = (f"INSERT INTO {t} (tube, body, priority, delay, ttr, key, depends_on, "
                       "created_at, job_group) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
        self.name = f"SELECT name FROM {t}_meta"
        self.meta = f"SELECT name, target, target_where, upto FROM {t}_meta"
        self.bind = f"UPDATE {t}_meta SET target = ?, target_where = ? WHERE target IS NULL"
        self.target = f"SELECT target, target_where FROM {t}_meta"
        self.seq = f"SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = '{t}'"
        self.take = f"UPDATE {t}_meta SET upto = ? WHERE name = ?"
        self.renew = (f"UPDATE {t}_meta SET name = {self.new_name}, target = NULL, "
                      "target_where = NULL, upto = 0")
        self.after = f"SELECT {COLUMNS} FROM {t} WHERE id > ? ORDER BY id LIMIT ?"
        self.delete_upto = (f"DELETE FROM {t} WHERE id <= ? AND "
                            f"EXISTS (SELECT 1 FROM {t}_meta WHERE name = ?)")
        self.skip_upto = f"DELETE FROM {t} WHERE id <= ?"
        self.clear_sent = f"DELETE FROM {t}_sent"
        self.count = f"SELECT count(*) FROM {t}"



class Postgres(Tables):
    """The statements for an outbox in PostgreSQL (psycopg placeholders)."""

    def __init__(self, table: str) -> None:
        t = self.table = check_table(table)
        self.channel = t
        self.new_name = "'outbox-' || substr(md5(random()::text), 1, 16)"
        self.lock = f"SELECT pg_advisory_xact_lock(hashtext('k7 outbox {t}'))"
        self.exists = "SELECT to_regclass(%s) IS NOT NULL"
        # the other sessions holding a lock on the relays' tables, relays first
        self.lock_holders = (
            "SELECT a.pid, a.application_name FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.granted "
            "AND l.pid <> pg_backend_pid() AND l.relation IN "
            f"(to_regclass('{t}_meta'), to_regclass('{t}_done'), to_regclass('{t}')) "
            "ORDER BY (a.application_name LIKE 'k7 relay%') DESC, a.pid")
        self.create = [
            f"CREATE TABLE IF NOT EXISTS {t} (id BIGSERIAL PRIMARY KEY, tube TEXT NOT NULL, "
            "body BYTEA NOT NULL, priority BIGINT NOT NULL, delay DOUBLE PRECISION NOT NULL, "
            "ttr DOUBLE PRECISION NOT NULL, key TEXT, depends_on TEXT, "
            "created_at DOUBLE PRECISION NOT NULL, job_group TEXT)",
            # One name row, even for a create in a REPEATABLE READ transaction whose
            # snapshot misses another's row: the unique column makes that a serialization
            # failure (retry it), not a second name (relays would disagree on keys).
            f"CREATE TABLE IF NOT EXISTS {t}_meta (name TEXT NOT NULL, "
            "one BOOLEAN NOT NULL DEFAULT TRUE UNIQUE CHECK (one), target TEXT, "
            "target_where TEXT, upto BIGINT NOT NULL DEFAULT 0)",
            f"INSERT INTO {t}_meta (name) SELECT {self.new_name} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t}_meta) ON CONFLICT DO NOTHING",
            f"CREATE TABLE IF NOT EXISTS {t}_done (tube TEXT NOT NULL, key TEXT NOT NULL)",
            f"CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$",
            f"CREATE OR REPLACE TRIGGER {t}_notify AFTER INSERT ON {t} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()",
        ]
        self.insert = (f"INSERT INTO {t} (tube, body, priority, delay, ttr, key, depends_on, "
                       "created_at, job_group) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                       "RETURNING id")
        self.meta_columns = (f"SELECT attname FROM pg_attribute WHERE attrelid = "
                             f"to_regclass('{t}_meta') AND attnum > 0 AND NOT attisdropped")
        self.add_columns = {c: f"ALTER TABLE {t}_meta ADD COLUMN {c} {kind}"
                            for c, kind in [("target", "TEXT"), ("target_where", "TEXT"),
                                            ("upto", "BIGINT NOT NULL DEFAULT -1")]}
        self.name = f"SELECT name FROM {t}_meta"
        self.meta = f"SELECT name, target, target_where, upto FROM {t}_meta"
        self.bind = f"UPDATE {t}_meta SET target = %s, target_where = %s WHERE target IS NULL"
        self.target = f"SELECT target, target_where FROM {t}_meta"
        # the highest id the sequence gave (nextval not yet called: none)
        self.seq = (f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END "
                    f"FROM {t}_id_seq")
        self.take = f"UPDATE {t}_meta SET upto = greatest(upto, ({self.seq}))"
        self.any_row = f"SELECT 1 FROM {t} LIMIT 1"
        self.renew = (f"UPDATE {t}_meta SET name = {self.new_name}, target = NULL, "
                      "target_where = NULL, upto = 0")
        self.skip_upto = f"DELETE FROM {t} WHERE id <= %s"
        self.clear_sent = f"DELETE FROM {t}_sent"
        self.claim = (f"SELECT {COLUMNS} FROM {t} WHERE id <= %s ORDER BY id LIMIT %s "
                      "FOR UPDATE SKIP LOCKED")
        self.delete = (f"WITH d AS (DELETE FROM {t} WHERE id = ANY(%s) RETURNING tube, "
                       f"coalesce(key, %s || id::text) AS key) "
                       f"INSERT INTO {t}_done (tube, key) SELECT tube, key FROM d")
        self.drop = f"DELETE FROM {t} WHERE id = ANY(%s)"
        self.done = f"SELECT DISTINCT tube, key FROM {t}_done"
        self.undone = f"DELETE FROM {t}_done WHERE tube = %s AND key = ANY(%s)"
        self.listen = f"LISTEN {t}"
        self.count = f"SELECT count(*) FROM {t}"
        self.count_done = f"SELECT count(*) FROM {t}_done"


    def lock_steps(self) -> Steps:
        yield self.lock, ()



def key_prefix(name: str) -> str:
    """What the job key of a PostgreSQL row without a key of its own starts with (the row
    id follows)."""
    return f"{name}:"


class Sent:
    """The statements of a relay into a beanstalkd server, for both databases
    (``mark``: the placeholder, ``?`` or ``%s``): ``<table>_sent`` holds the rows of the
    batch in flight, each with the id of its job once put (``job_id``) and the highest job
    id the relay had seen before putting it (``floor``)."""

    def __init__(self, table: str, mark: str, tables: Tables) -> None:
        t = self.table = check_table(table)
        self.tables = tables
        self.meta = f"SELECT name, target, target_where FROM {t}_meta"
        self.bind = (f"UPDATE {t}_meta SET target = {mark}, target_where = {mark} "
                     "WHERE target IS NULL")
        self.target = f"SELECT target, target_where FROM {t}_meta"
        self.seq = tables.seq
        self.highest_sent = f"SELECT coalesce(max(row_id), 0) FROM {t}_sent"
        self.create = (f"CREATE TABLE IF NOT EXISTS {t}_sent (row_id BIGINT PRIMARY KEY, "
                       "job_id BIGINT, floor BIGINT NOT NULL)")
        self.name = f"SELECT name FROM {t}_meta"
        self.first = f"SELECT {COLUMNS} FROM {t} ORDER BY id LIMIT {mark}"
        columns = ", ".join(f"r.{c}" for c in COLUMNS.split(", "))
        self.pending = (f"SELECT {columns}, s.job_id, s.floor FROM {t}_sent s "
                        f"JOIN {t} r ON r.id = s.row_id ORDER BY r.id")
        self.strays = f"DELETE FROM {t}_sent WHERE row_id NOT IN (SELECT id FROM {t})"
        self.intend = f"INSERT INTO {t}_sent (row_id, job_id, floor) VALUES ({mark}, NULL, {mark})"
        self.record = f"UPDATE {t}_sent SET job_id = {mark} WHERE row_id = {mark}"
        self.forget = f"DELETE FROM {t}_sent WHERE row_id = {mark}"
        self.drop = f"DELETE FROM {t} WHERE id = {mark}"
        self.count = f"SELECT count(*) FROM {t}_sent"
        self.listen = f"LISTEN {t}"
        # PostgreSQL: one relay of the outbox into a server at a time (a session lock)
        self.lock = f"SELECT pg_try_advisory_lock(hashtext('k7 outbox beanstalk {t}'))"
