"""``relay(source, store)``: the relay for a database named by a string (the command line's
and the server's way in)."""

from __future__ import annotations

from ..jobs._store import JobStore
from ._postgres import PostgresRelay
from ._relay import Relay
from ._sql import DEFAULT_TABLE
from ._sqlite import SqliteRelay

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SCHEME = "sqlite:"


def is_postgres(source: str) -> bool:
    """Whether ``source`` names a PostgreSQL database (else a SQLite file)."""
    return source.startswith(POSTGRES_SCHEMES)


def sqlite_path(source: str) -> str:
    """The SQLite file ``source`` names (a path, ``sqlite:PATH`` or ``sqlite:///PATH``)."""
    path = source.removeprefix(SQLITE_SCHEME)
    return path[2:] if path.startswith("//") else path


def relay(source: str, store: JobStore, *, table: str = DEFAULT_TABLE, batch: int = 1000
          ) -> Relay:
    """A relay of the outbox ``table`` of ``source`` into ``store``: a PostgreSQL DSN
    (``postgresql://...``, ``postgres://...``), or a SQLite database file (its path, or
    ``sqlite:PATH``)."""
    if is_postgres(source):
        return PostgresRelay(source, store, table=table, batch=batch)
    return SqliteRelay(sqlite_path(source), store, table=table, batch=batch)
