"""k7core.workers: yoltq's consumers over a job store — retries with backoff, a per-tube
gate after failures, liveness, figures, health, context capture and a test mode.

    from k7core import jobs, workers

    with jobs.JobStore("/var/data/jobs") as store, workers.Worker(store) as w:
        @w.consumer("emails", concurrency=4, max_retries=10)
        def send(payload: dict) -> None: ...
        w.put("emails", {"to": "a@example.com"})

The logic both faces share is ``_core`` (no I/O), the failure rules ``_policy``, the figures
and health ``_monitor``; ``Worker`` runs consumers on threads, ``k7async.AsyncWorker`` on
tasks.
"""

from types import FunctionType

from ._codec import JSON as JSON
from ._codec import PICKLE as PICKLE
from ._codec import Codec as Codec
from ._codec import PayloadError as PayloadError
from ._codec import codec as codec
from ._core import FailedJob as FailedJob
from ._core import NoJobError as NoJobError
from ._core import OptionsDict as OptionsDict
from ._policy import Backoff as Backoff
from ._policy import Options as Options
from ._source import JobView as JobView
from ._source import ManualClock as ManualClock
from ._source import MemorySource as MemorySource
from ._source import Session as Session
from ._source import Source as Source
from ._source import StoreSource as StoreSource
from ._worker import Worker as Worker

__all__ = [
    "JSON",
    "PICKLE",
    "Backoff",
    "Codec",
    "FailedJob",
    "JobView",
    "ManualClock",
    "MemorySource",
    "NoJobError",
    "Options",
    "OptionsDict",
    "PayloadError",
    "Session",
    "Source",
    "StoreSource",
    "Worker",
    "codec",
]

# Public classes and functions report this package as their module (as k7core's do).
for _value in [globals()[name] for name in __all__]:
    if isinstance(_value, type | FunctionType) and _value.__module__.startswith(__name__):
        _value.__module__ = __name__
del _value
