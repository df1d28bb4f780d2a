"""k7async: anyio bridges to k7core queues (asyncio and trio).

    async with k7async.open_queue("/var/data/q", fsync="sync") as q:
        off = await q.enqueue(b"hello")                    # group commit across tasks
        async with k7async.producer_channel(q) as send:    # batched, back-pressured
            await send.send(b"more")
        async with k7async.consumer_group_channel(q, "workers", auto_ack=False) as msgs:
            async for msg in msgs:
                ...
                await msgs.ack(msg)

    async with k7async.open_topic("/var/data/orders", partitions=8) as topic:  # k7core.topics
        partition, offset = await topic.send(b"{...}", key="customer-42")
        async with k7async.topic_consumer_stream(topic, "billing") as records:
            async for record in records:                   # k7core.topics.Record
                ...

One writer thread per queue (shared by every producer channel, sink and AsyncQueue of that
queue), one reader thread per consumer group channel, one thread per ``AsyncTopic`` and one
per topic consumer stream, all owner threads (``_owner.Owner``); no storage logic here.
"""

from k7core import __version__ as __version__

from ._consumer import MessageStream as MessageStream
from ._consumer import consumer_group_channel as consumer_group_channel
from ._errors import AutoAckError as AutoAckError
from ._errors import SinkBusyError as SinkBusyError
from ._errors import StreamClosedError as StreamClosedError
from ._jobs import AsyncJobOwner as AsyncJobOwner
from ._jobs import AsyncJobStore as AsyncJobStore
from ._jobs import open_jobs as open_jobs
from ._outbox import run_relay as run_relay
from ._producer import producer_channel as producer_channel
from ._producer import sink as sink
from ._queue import AsyncQueue as AsyncQueue
from ._queue import open_queue as open_queue
from ._registry import queue_writer as queue_writer
from ._topics import AsyncTopic as AsyncTopic
from ._topics import RecordStream as RecordStream
from ._topics import open_topic as open_topic
from ._topics import topic_consumer_stream as topic_consumer_stream
from ._topics import topic_producer_channel as topic_producer_channel
from ._types import Payload as Payload
from ._worker_sources import AsyncBeanstalkSource as AsyncBeanstalkSource
from ._worker_sources import AsyncSession as AsyncSession
from ._worker_sources import AsyncSource as AsyncSource
from ._worker_sources import AsyncStoreSource as AsyncStoreSource
from ._worker_sources import InlineSource as InlineSource
from ._workers import AsyncWorker as AsyncWorker
from ._writer import QueueWriter as QueueWriter

__all__ = [
    "AsyncBeanstalkSource",
    "AsyncJobOwner",
    "AsyncJobStore",
    "AsyncQueue",
    "AsyncSession",
    "AsyncSource",
    "AsyncStoreSource",
    "AsyncTopic",
    "AsyncWorker",
    "AutoAckError",
    "InlineSource",
    "MessageStream",
    "Payload",
    "QueueWriter",
    "RecordStream",
    "SinkBusyError",
    "StreamClosedError",
    "consumer_group_channel",
    "open_jobs",
    "open_queue",
    "open_topic",
    "producer_channel",
    "queue_writer",
    "run_relay",
    "sink",
    "topic_consumer_stream",
    "topic_producer_channel",
]


def _public_names() -> None:
    """Public classes and functions say ``k7async.X`` (in reprs and tracebacks), as anyio's
    do: their home is the package, not the private module that defines them."""
    import contextlib

    for name in __all__:
        with contextlib.suppress(AttributeError, TypeError):  # a type alias: no module of its own
            globals()[name].__module__ = __name__


_public_names()
