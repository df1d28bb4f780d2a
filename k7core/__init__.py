"""k7core: a durable, very fast, embedded message log (k7-compatible on disk).

    with k7core.Queue("/var/data/q", fsync="flush") as q:
        off = q.enqueue(b"hello")
        with q.consumer_group("workers") as cg:
            for msg in cg.poll(max_batch=10, timeout=0.05):
                cg.ack(msg)
"""

from ._checks import MAX_BATCH as MAX_BATCH
from ._columnar import ColumnarBatch as ColumnarBatch
from ._errors import ClosedError as ClosedError
from ._errors import ConcurrentUseError as ConcurrentUseError
from ._errors import CorruptFrameError as CorruptFrameError
from ._errors import CursorError as CursorError
from ._errors import DataLossError as DataLossError
from ._errors import GroupBusyError as GroupBusyError
from ._errors import IntegrityError as IntegrityError
from ._errors import InvalidNameError as InvalidNameError
from ._errors import K7Error as K7Error
from ._errors import LockedError as LockedError
from ._errors import LockFileLostError as LockFileLostError
from ._errors import LockTimeoutError as LockTimeoutError
from ._errors import MessageTooLargeError as MessageTooLargeError
from ._errors import NotAQueueError as NotAQueueError
from ._errors import QueueLockedError as QueueLockedError
from ._errors import ReadOnlyError as ReadOnlyError
from ._errors import StorageError as StorageError
from ._format import Fsync as Fsync
from ._format import frame_size as frame_size
from ._group import ConsumerGroup as ConsumerGroup
from ._group import Message as Message
from ._kernel import crc32c as crc32c
from ._kernel import hardware_crc as hardware_crc
from ._options import QueueOptions as QueueOptions
from ._queue import Queue as Queue
from ._stats import LAG_COUNT_LIMIT as LAG_COUNT_LIMIT
from ._stats import GroupInfo as GroupInfo
from ._stats import GroupStats as GroupStats
from ._stats import QueueStats as QueueStats
from ._stats import RecoveryEvent as RecoveryEvent
from ._stats import SegmentInfo as SegmentInfo
from ._stats import SyncLatency as SyncLatency

__version__ = "0.1.0"  # the distribution k7py's version too (pyproject.toml reads it)

__all__ = [
    "LAG_COUNT_LIMIT",
    "MAX_BATCH",
    "ClosedError",
    "ColumnarBatch",
    "ConcurrentUseError",
    "ConsumerGroup",
    "CorruptFrameError",
    "CursorError",
    "DataLossError",
    "Fsync",
    "GroupBusyError",
    "GroupInfo",
    "GroupStats",
    "IntegrityError",
    "InvalidNameError",
    "K7Error",
    "LockFileLostError",
    "LockTimeoutError",
    "LockedError",
    "Message",
    "MessageTooLargeError",
    "NotAQueueError",
    "Queue",
    "QueueLockedError",
    "QueueOptions",
    "QueueStats",
    "ReadOnlyError",
    "RecoveryEvent",
    "SegmentInfo",
    "StorageError",
    "SyncLatency",
    "crc32c",
    "frame_size",
    "hardware_crc",
]

# Public objects report this package as their module, as anyio's do: tracebacks, reprs and
# help() name what users import (k7core.QueueLockedError), not the private module behind it.
for _value in [globals()[name] for name in __all__]:
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _value
