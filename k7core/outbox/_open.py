"""``relay(source, target)``: the relay for a database named by a string (the command line's
and the server's way in)."""

from __future__ import annotations

from ..jobs._store import JobStore
from ._beanstalk import BeanstalkRelay
from ._postgres import PostgresRelay
from ._relay import Relay, is_postgres, sqlite_path
from ._sql import DEFAULT_TABLE
from ._sqlite import SqliteRelay


def relay(source: str, target: JobStore | str, *, table: str = DEFAULT_TABLE,
          batch: int = 1000) -> Relay:
    """A relay of the outbox ``table`` of ``source`` into ``target``: ``source`` is a
    PostgreSQL DSN (``postgresql://...``, ``postgres://...``) or a SQLite database file (its
    path, or ``sqlite:PATH``); ``target`` a job store, or a beanstalkd server's address
    (``beanstalk://host:port``, ``host:port``, ``unix:/path``: a :class:`BeanstalkRelay`)."""
    if isinstance(target, str):
        return BeanstalkRelay(source, target, table=table, batch=batch)
    store = target
    if is_postgres(source):
        return PostgresRelay(source, store, table=table, batch=batch)
    return SqliteRelay(sqlite_path(source), store, table=table, batch=batch)
