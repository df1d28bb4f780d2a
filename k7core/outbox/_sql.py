"""The outbox tables and every statement on them, for SQLite and PostgreSQL: the one place
that knows their columns.

An outbox named ``t`` is three tables:

- ``t``: one row per job put and not yet relayed (``id`` grows; SQLite's ``AUTOINCREMENT``
  never reuses one, so a relay's position stays meaningful after deletes);
- ``t_meta``: one row, the outbox's name in job stores (``outbox-`` and 16 random hex
  digits, made once): the SQLite relay's mark, the prefix of the PostgreSQL relay's keys;
- ``t_done`` (PostgreSQL): the keys of rows deleted by a relay that the store may still
  remember, until the relay has forgotten them.

PostgreSQL also gets a statement trigger that notifies channel ``t`` on every insert, so a
relay that listens wakes at the commit, whoever inserted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
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


class Sqlite:
    """The statements for an outbox in SQLite."""

    def __init__(self, table: str) -> None:
        t = self.table = check_table(table)
        self.create = [
            f"CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "tube TEXT NOT NULL, body BLOB NOT NULL, priority INTEGER NOT NULL, "
            "delay REAL NOT NULL, ttr REAL NOT NULL, key TEXT, depends_on TEXT, "
            "created_at REAL NOT NULL, job_group TEXT)",
            f"CREATE TABLE IF NOT EXISTS {t}_meta (name TEXT NOT NULL)",
            f"INSERT INTO {t}_meta SELECT 'outbox-' || lower(hex(randomblob(8))) "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t}_meta)",
        ]
        self.insert = (f"INSERT INTO {t} (tube, body, priority, delay, ttr, key, depends_on, "
                       "created_at, job_group) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
        self.name = f"SELECT name FROM {t}_meta"
        self.after = f"SELECT {COLUMNS} FROM {t} WHERE id > ? ORDER BY id LIMIT ?"
        self.delete_upto = f"DELETE FROM {t} WHERE id <= ?"
        self.count = f"SELECT count(*) FROM {t}"


class Postgres:
    """The statements for an outbox in PostgreSQL (psycopg placeholders)."""

    def __init__(self, table: str) -> None:
        t = self.table = check_table(table)
        self.channel = t
        self.create = [
            # concurrent creates would collide in the catalogue: one at a time
            f"SELECT pg_advisory_xact_lock(hashtext('k7 outbox {t}'))",
            f"CREATE TABLE IF NOT EXISTS {t} (id BIGSERIAL PRIMARY KEY, tube TEXT NOT NULL, "
            "body BYTEA NOT NULL, priority BIGINT NOT NULL, delay DOUBLE PRECISION NOT NULL, "
            "ttr DOUBLE PRECISION NOT NULL, key TEXT, depends_on TEXT, "
            "created_at DOUBLE PRECISION NOT NULL, job_group TEXT)",
            # One name row, even for a create in a REPEATABLE READ transaction whose
            # snapshot misses another's row: the unique column makes that a serialization
            # failure (retry it), not a second name (relays would disagree on keys).
            f"CREATE TABLE IF NOT EXISTS {t}_meta (name TEXT NOT NULL, "
            "one BOOLEAN NOT NULL DEFAULT TRUE UNIQUE CHECK (one))",
            f"INSERT INTO {t}_meta (name) SELECT 'outbox-' || substr(md5(random()::text), 1, "
            f"16) WHERE NOT EXISTS (SELECT 1 FROM {t}_meta) ON CONFLICT DO NOTHING",
            f"CREATE TABLE IF NOT EXISTS {t}_done (tube TEXT NOT NULL, key TEXT NOT NULL)",
            f"CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$",
            f"CREATE OR REPLACE TRIGGER {t}_notify AFTER INSERT ON {t} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()",
        ]
        self.insert = (f"INSERT INTO {t} (tube, body, priority, delay, ttr, key, depends_on, "
                       "created_at, job_group) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                       "RETURNING id")
        self.name = f"SELECT name FROM {t}_meta"
        self.claim = (f"SELECT {COLUMNS} FROM {t} ORDER BY id LIMIT %s "
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


def key_prefix(name: str) -> str:
    """What the job key of a PostgreSQL row without a key of its own starts with (the row
    id follows)."""
    return f"{name}:"


class Sent:
    """The statements of a relay into a beanstalkd server, for both databases
    (``mark``: the placeholder, ``?`` or ``%s``): ``<table>_sent`` holds the rows of the
    batch in flight, each with the id of its job once put (``job_id``) and the highest job
    id the relay had seen before putting it (``floor``)."""

    def __init__(self, table: str, mark: str) -> None:
        t = self.table = check_table(table)
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
