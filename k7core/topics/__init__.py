"""k7core.topics: partitioned topics on k7 logs, Kafka-compatible key placement, routing
exchanges, lag back-pressure and consumer groups whose members are processes.

    with Topic("/var/data/orders", partitions=8) as topic:
        partition, offset = topic.send(b"{...}", key="customer-42")
        with topic.consumer("billing") as member:
            for record in member.poll(max_records=100, timeout=1.0):
                member.ack(record)

A topic is a directory of partition queues (each a k7 log any k7 tool reads) plus a small
metadata file; processes coordinate through files and the flocks the kernel releases when
a process dies (docs/topics.md).
"""

from ._assign import STRATEGIES as STRATEGIES
from ._consumer import ConsumerStats as ConsumerStats
from ._consumer import TopicConsumer as TopicConsumer
from ._envelope import Record as Record
from ._errors import BackPressureError as BackPressureError
from ._errors import CorruptRecordError as CorruptRecordError
from ._errors import MemberBusyError as MemberBusyError
from ._errors import NotAssignedError as NotAssignedError
from ._errors import TopicDeletedError as TopicDeletedError
from ._errors import TopicError as TopicError
from ._errors import TopicLockTimeoutError as TopicLockTimeoutError
from ._exchange import Delivery as Delivery
from ._exchange import Exchange as Exchange
from ._lockfile import LOCK_TIMEOUT as LOCK_TIMEOUT
from ._partitioner import PARTITIONERS as PARTITIONERS
from ._partitioner import kafka_murmur2 as kafka_murmur2
from ._partitioner import murmur3_32 as murmur3_32
from ._pressure import BackPressure as BackPressure
from ._routing import Binding as Binding
from ._routing import ExchangeKind as ExchangeKind
from ._routing import InvalidBindingError as InvalidBindingError
from ._routing import InvalidRecordError as InvalidRecordError
from ._routing import Router as Router
from ._routing import parse_header_condition as parse_header_condition
from ._stats import PartitionLag as PartitionLag
from ._stats import PartitionStats as PartitionStats
from ._stats import PressureStats as PressureStats
from ._stats import TopicGroupStats as TopicGroupStats
from ._stats import TopicStats as TopicStats
from ._topic import TOPIC_SEGMENT_SIZE as TOPIC_SEGMENT_SIZE
from ._topic import ProducerRecord as ProducerRecord
from ._topic import Topic as Topic

__all__ = [
    "LOCK_TIMEOUT",
    "PARTITIONERS",
    "STRATEGIES",
    "TOPIC_SEGMENT_SIZE",
    "BackPressure",
    "BackPressureError",
    "Binding",
    "ConsumerStats",
    "CorruptRecordError",
    "Delivery",
    "Exchange",
    "ExchangeKind",
    "InvalidBindingError",
    "InvalidRecordError",
    "MemberBusyError",
    "NotAssignedError",
    "PartitionLag",
    "PartitionStats",
    "PressureStats",
    "ProducerRecord",
    "Record",
    "Router",
    "Topic",
    "TopicConsumer",
    "TopicDeletedError",
    "TopicError",
    "TopicGroupStats",
    "TopicLockTimeoutError",
    "TopicStats",
    "kafka_murmur2",
    "murmur3_32",
    "parse_header_condition",
]

# Public objects report this package as their module (as k7core's do).
for _value in [globals()[name] for name in __all__]:
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _value
