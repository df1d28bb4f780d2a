"""k7async: anyio bridges to k7core queues (asyncio and trio).

    async with k7async.open_queue("/var/data/q", fsync="sync") as q:
        off = await q.enqueue(b"hello")                    # group commit across tasks
        async with k7async.producer_channel(q) as send:    # batched, back-pressured
            await send.send(b"more")
        async with k7async.consumer_group_channel(q, "workers", auto_ack=False) as msgs:
            async for msg in msgs:
                ...
                await msgs.ack(msg)

One writer thread per queue (shared by every producer channel, sink and AsyncQueue of that
queue), one reader thread per consumer group channel; no storage logic here.
"""

from k7core import __version__ as __version__

from ._bridge import Payload as Payload
from ._consumer import MessageStream as MessageStream
from ._consumer import consumer_group_channel as consumer_group_channel
from ._errors import SinkBusyError as SinkBusyError
from ._producer import producer_channel as producer_channel
from ._producer import sink as sink
from ._queue import AsyncQueue as AsyncQueue
from ._queue import open_queue as open_queue
from ._writer import QueueWriter as QueueWriter
from ._writer import queue_writer as queue_writer

__all__ = [
    "AsyncQueue",
    "MessageStream",
    "Payload",
    "QueueWriter",
    "SinkBusyError",
    "consumer_group_channel",
    "open_queue",
    "producer_channel",
    "queue_writer",
    "sink",
]
