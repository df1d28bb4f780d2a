"""``Outbox``: create the outbox table and put jobs as rows, on the caller's own connection and
in the caller's own transaction (sqlite3, psycopg 3 sync and async)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..jobs._errors import InvalidJobError
from ..jobs._machine import (
    check_body,
    check_group,
    check_key,
    check_priority,
    check_seconds,
    check_tube,
)
from ..jobs._store import MAX_BODY
from ..workers._codec import Codec, encode_body
from ..workers._codec import codec as _codec_of
from ._sql import DEFAULT_TABLE, Postgres, Sqlite, Steps, arun_steps, deps_text, run_steps

if TYPE_CHECKING:
    import psycopg

Deps = Iterable[int | tuple[str, str]]


class Outbox:
    """Jobs put as rows of table ``table`` in the application's database, in its
    transactions; a relay (:class:`SqliteRelay`, :class:`PostgresRelay`) moves committed rows
    into a job store. A rolled-back transaction puts nothing.

    ``codec`` and ``context`` are the workers' (``k7core.workers``): the payload is encoded
    and the context variables' values captured as ``Worker.put`` does, so a worker with the
    same codec reads the job as its own.
    """

    def __init__(self, table: str = DEFAULT_TABLE, *, codec: str | Codec = "json",
                 context: Iterable[ContextVar[Any]] = ()) -> None:
        self._sqlite = Sqlite(table)
        self._postgres = Postgres(table)
        self.table = table
        self.codec = _codec_of(codec)
        self.context = tuple(context)
        if not all(isinstance(v, ContextVar) for v in self.context):
            raise TypeError("context takes contextvars.ContextVar objects")

    # --- the table ---------------------------------------------------------------------

    def create(self, conn: sqlite3.Connection | psycopg.Connection[Any]) -> None:
        """Create the outbox's tables if they do not exist (idempotent, safe to run from
        several processes at once), and add what an older version's lack. A table made
        anew (after a ``DROP TABLE``) gets a new outbox name, so a relay takes its rows
        from the first. In a transaction of the caller's, it becomes part of it (a
        savepoint); otherwise it commits."""
        self._run(conn, "create", lambda sql: sql.create_steps())

    async def acreate(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """:meth:`create` on a psycopg ``AsyncConnection``."""
        async with conn.transaction():
            await arun_steps(conn, self._postgres.create_steps())

    def reset(self, conn: sqlite3.Connection | psycopg.Connection[Any], *,
              skip_upto: int | None = None) -> None:
        """Start the outbox afresh, once a relay refused it (``OutboxError``) and you know
        why: a new outbox name (a store's position and keys of the old one no longer
        apply) and no bound store, so the next relay binds its own and relays every row in
        the table; those with ids at or below ``skip_upto`` are deleted first (relayed
        before, say, by a restored backup's rows). ``k7 outbox reset`` runs it. A
        transaction as :meth:`create`'s."""
        _check_skip(skip_upto)
        self._run(conn, "reset", lambda sql: sql.reset_steps(skip_upto))

    async def areset(self, conn: psycopg.AsyncConnection[Any], *,
                     skip_upto: int | None = None) -> None:
        """:meth:`reset` on a psycopg ``AsyncConnection``."""
        _check_skip(skip_upto)
        async with conn.transaction():
            await arun_steps(conn, self._postgres.reset_steps(skip_upto))

    def _run(self, conn: sqlite3.Connection | psycopg.Connection[Any], what: str,
             steps: Callable[[Sqlite | Postgres], Steps]) -> None:
        if isinstance(conn, sqlite3.Connection):
            # Outside a transaction, take the write lock first: a SAVEPOINT begins a
            # deferred transaction that reads the schema, and SQLite fails its upgrade to
            # writing at once ("database is locked", no busy wait) while another process
            # creates the outbox too.
            ours = not conn.in_transaction
            point = f"k7_outbox_{what}"
            conn.execute("BEGIN IMMEDIATE" if ours else f"SAVEPOINT {point}")
            try:
                run_steps(conn, steps(self._sqlite))
            except BaseException:
                conn.execute("ROLLBACK" if ours else f"ROLLBACK TO {point}")
                if not ours:
                    conn.execute(f"RELEASE {point}")
                raise
            conn.execute("COMMIT" if ours else f"RELEASE {point}")
            return
        with conn.transaction():
            run_steps(conn, steps(self._postgres))

    # --- puts --------------------------------------------------------------------------

    def put(self, conn: sqlite3.Connection | psycopg.Connection[Any], tube: str, payload: Any,
            *, priority: int = 1024, delay: float = 0.0, ttr: float = 60.0,
            key: str | None = None, depends_on: Deps = (), group: str | None = None) -> int:
        """Put a job as a row on ``conn``, in its current transaction (it is relayed once
        that commits; a rollback puts nothing); return the row's id. The arguments are
        ``JobStore.put``'s and are checked here, so a row the relay cannot store is refused
        at once. ``delay`` counts from now, not from the relay."""
        values = self._values(tube, payload, priority, delay, ttr, key, depends_on, group)
        if isinstance(conn, sqlite3.Connection):
            row_id = conn.execute(self._sqlite.insert, values).lastrowid
            assert row_id is not None
            return row_id
        found = conn.execute(self._postgres.insert, values).fetchone()
        assert found is not None
        return int(found[0])

    async def aput(self, conn: psycopg.AsyncConnection[Any], tube: str, payload: Any, *,
                   priority: int = 1024, delay: float = 0.0, ttr: float = 60.0,
                   key: str | None = None, depends_on: Deps = (), group: str | None = None
                   ) -> int:
        """:meth:`put` on a psycopg ``AsyncConnection``."""
        values = self._values(tube, payload, priority, delay, ttr, key, depends_on, group)
        cursor = await conn.execute(self._postgres.insert, values)
        found = await cursor.fetchone()
        assert found is not None
        return int(found[0])

    def _values(self, tube: str, payload: Any, priority: int, delay: float, ttr: float,
                key: str | None, depends_on: Deps, group: str | None) -> tuple[Any, ...]:
        check_tube(tube)
        body = check_body(encode_body(self.codec, self.context, payload, tube))
        if len(body) > MAX_BODY:
            raise InvalidJobError(f"the job body is {len(body)} bytes, over the job store's "
                                  f"{MAX_BODY}", hint="put large data elsewhere and a "
                                                      "reference in the job")
        if key is not None:
            check_key(key)
        if group is not None:
            check_group(group)
        return (tube, body, check_priority(priority), check_seconds(delay, "delay"),
                check_seconds(ttr, "ttr"), key, deps_text(depends_on), time.time(), group)


def _check_skip(skip_upto: int | None) -> None:
    if skip_upto is not None and (not isinstance(skip_upto, int) or isinstance(skip_upto, bool)
                                  or skip_upto < 0):
        raise ValueError(f"skip_upto is a row id (an int >= 0), not {skip_upto!r}")
