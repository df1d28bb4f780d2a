"""k7core.outbox: the transactional outbox. Jobs are put as rows of the application's own
database, inside its own transactions (``Outbox.put``), so a rolled-back transaction puts
nothing and a committed one always does; a relay moves committed rows into a job store
or a beanstalkd server exactly once, even when it is killed at any point.

    import sqlite3
    from k7core import jobs, outbox

    box = outbox.Outbox()
    with sqlite3.connect("app.db") as db:          # the application's transaction
        box.create(db)
        db.execute("INSERT INTO orders VALUES (?)", ("o-1",))
        box.put(db, "emails", {"order": "o-1"})
    with jobs.JobStore("jobs") as store, outbox.SqliteRelay("app.db", store):
        ...                                          # rows become jobs as they commit

SQLite: ``SqliteRelay`` (the relay's position is a store mark, journaled with each put).
PostgreSQL (psycopg 3, ``pip install 'k7py[postgres]'``): ``PostgresRelay`` (claim, put with
a remembered key, delete). Into a beanstalkd server (beanstalkd itself or ``k7 serve``):
``BeanstalkRelay`` (jobs put parked, made live once their ids are recorded). An outbox
feeds one store or server (the first relay binds it), and a relay refuses ids that went
back below what its store holds (``OutboxError``; ``Outbox.reset`` or ``k7 outbox reset``
once you know why). ``docs/outbox.md`` has the details.
"""

from types import FunctionType

from ._beanstalk import BeanstalkRelay as BeanstalkRelay
from ._errors import OutboxBusyError as OutboxBusyError
from ._errors import OutboxError as OutboxError
from ._errors import OutboxRewoundError as OutboxRewoundError
from ._errors import OutboxTargetError as OutboxTargetError
from ._open import relay as relay
from ._outbox import Outbox as Outbox
from ._postgres import PostgresRelay as PostgresRelay
from ._relay import Relay as Relay
from ._sql import DEFAULT_TABLE as DEFAULT_TABLE
from ._sqlite import SqliteRelay as SqliteRelay

__all__ = ["DEFAULT_TABLE", "BeanstalkRelay", "Outbox", "OutboxBusyError", "OutboxError",
           "OutboxRewoundError",
           "OutboxTargetError", "PostgresRelay", "Relay", "SqliteRelay", "relay"]

# Public classes and functions report this package as their module (as k7core's do).
for _value in [globals()[name] for name in __all__]:
    if isinstance(_value, type | FunctionType) and _value.__module__.startswith(__name__):
        _value.__module__ = __name__
del _value
