"""k7core.jobs: a durable job store with beanstalkd's rules (tubes, priorities, delays,
time-to-run, bury and kick), plus unique keys, dependencies and error history, and marks and
remembered keys for an outbox relay.

The store (``JobStore``) keeps every live job in RAM and each change in a k7 log, with
snapshots; this package's sans-I/O core (``_machine``) holds the rules and ``_codec`` the
journal and snapshot encodings.
"""

from ._errors import CorruptJobDataError as CorruptJobDataError
from ._errors import DependencyError as DependencyError
from ._errors import InvalidJobError as InvalidJobError
from ._errors import JobNotFoundError as JobNotFoundError
from ._errors import JournalDamagedError as JournalDamagedError
from ._errors import NotAJobStoreError as NotAJobStoreError
from ._machine import Job as Job
from ._machine import JobState as JobState
from ._store import CLOCK_RECHECK as CLOCK_RECHECK
from ._store import JOURNAL_SEGMENT as JOURNAL_SEGMENT
from ._store import MAX_BODY as MAX_BODY
from ._store import JobOwner as JobOwner
from ._store import JobStore as JobStore
from ._store import TubeOverview as TubeOverview

__all__ = [
    "CLOCK_RECHECK",
    "JOURNAL_SEGMENT",
    "MAX_BODY",
    "CorruptJobDataError",
    "DependencyError",
    "InvalidJobError",
    "Job",
    "JobNotFoundError",
    "JobOwner",
    "JobState",
    "JobStore",
    "JournalDamagedError",
    "NotAJobStoreError",
    "TubeOverview",
]

# Public objects report this package as their module (as k7core's do).
for _value in [globals()[name] for name in __all__]:
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _value
