"""k7 queues as a PySpark data source: ``spark.dataSource.register(K7DataSource)``, then
``spark.read.format("k7").load(path)`` or ``spark.readStream.format("k7").load(path)``.

Needs the ``spark`` extra (``pip install 'k7py[spark]'``: pyspark >= 4.2 and pyarrow); without
it, importing this module raises a :class:`ModuleNotFoundError` that says so. Every method
runs in a Python worker process that Spark starts, never in the user's process, so the queue
is opened ``readonly=True`` there (a live writer elsewhere is fine). The workers must import
this k7core: :func:`local_session` points ``PYSPARK_PYTHON`` at the running interpreter.

Batch read, batch write (all or nothing), streaming read (read limits, availableNow, group
cursor, failOnDataLoss) and streaming write (exactly once per batch id); topics
(``k7core.topics``) read and written with Kafka's columns and offsets. This module is the
face: the ``"k7"`` format and a local session; the streaming names (``K7StreamReader``,
``K7StreamWriter``, ``K7TopicStreamReader``, ``K7TopicStreamWriter``, ``SINK_PREFIX``) are
imported on first use.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from .._errors import MissingExtraError as _MissingExtraError

try:
    import pyarrow  # noqa: F401
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StructType
except ImportError as exc:
    raise _MissingExtraError("k7core.spark", "spark", exc) from exc

from .. import K7Error
from ._arrow import TOPIC_SCHEMA as _TOPIC_SCHEMA
from ._arrow import source_schema as _source_schema
from ._batch_reader import K7BatchReader, K7TopicBatchReader
from ._batch_writer import K7BatchWriter, K7TopicBatchWriter
from ._errors import K7DataLossError, K7OptionError
from ._options import flag as _flag
from ._options import lower as _lower
from ._partitions import K7Partition, K7TopicPartition
from ._sink import STAGING_DIR, K7StagedRows, K7TopicRows
from ._topic import is_topic as _is_topic
from ._topic import sink_is_topic as _sink_is_topic

if TYPE_CHECKING:
    from ._stream import (
        SINK_PREFIX,
        K7StreamReader,
        K7StreamWriter,
        K7TopicStreamReader,
        K7TopicStreamWriter,
    )

__all__ = [
    "SINK_PREFIX",
    "STAGING_DIR",
    "K7BatchReader",
    "K7BatchWriter",
    "K7DataLossError",
    "K7DataSource",
    "K7OptionError",
    "K7Partition",
    "K7StagedRows",
    "K7StreamReader",
    "K7StreamWriter",
    "K7TopicBatchReader",
    "K7TopicBatchWriter",
    "K7TopicPartition",
    "K7TopicRows",
    "K7TopicStreamReader",
    "K7TopicStreamWriter",
    "local_session",
]


class K7DataSource(DataSource):
    """The ``"k7"`` format. Options (all strings, as Spark passes them):

    - ``path`` (or ``load(path)``): the queue directory;
    - ``startingOffsets``: ``earliest`` (default), ``latest`` or an offset (a frame boundary);
    - ``endingOffsets``: ``latest`` (default) or an offset;
    - ``group``: start from this consumer group's committed cursor (overrides
      ``startingOffsets``; the group is only read, not moved);
    - ``minPartitions``: split the range into at least this many partitions (default: one
      per segment);
    - ``includeValue``: ``true`` adds a ``value`` STRING column (the payload decoded as UTF-8,
      invalid bytes replaced).

    Streaming reads take the same options except ``endingOffsets``; ``startingOffsets`` and
    ``group`` apply to a new query only (a restart resumes at its checkpoint), ``group`` only
    if the group exists, and the group's cursor follows the query's progress. Also:

    - ``maxRecordsPerTrigger`` / ``maxBytesPerTrigger``: at most this many messages / bytes
      of log (frames with headers) per micro-batch, at least one message;
    - ``failOnDataLoss``: ``true`` (default) fails the query when offsets it still has to
      read are gone; ``false`` logs a warning and continues at the earliest offset.

    Writing (``df.write.format("k7").mode("append").save(path)``, or ``writeStream`` with a
    ``checkpointLocation``) takes a ``payload`` BINARY or a ``value`` STRING column (UTF-8
    encoded); ``lockTimeout`` (seconds, default 10) bounds the wait for the queue's writer
    lock at commit.

    A path that is a topic (``k7core.topics``: a directory with ``k7py-topic.json``) reads
    as Kafka's source does: ``key``, ``value``, ``topic``, ``partition``, ``offset``,
    ``timestamp``, ``timestampType``, ``headers``, its partitions in parallel;
    ``startingOffsets`` / ``endingOffsets`` also take Kafka's JSON per partition
    (``{"<topic>": {"0": 23, "1": -2}}``, -2 earliest, -1 latest), and ``group`` is read
    per partition. Writing to a topic takes ``value`` (BINARY or STRING) and optionally
    ``key``, ``headers``, ``timestamp`` and ``partition``; rows without a partition are
    placed by the topic's partitioner on their key (keyless ones spread); the tasks append
    (at least once, as Kafka's sink); ``partitions`` (N) creates the topic. See
    docs/spark.md, "Topics".
    """

    @classmethod
    def name(cls) -> str:
        return "k7"

    def schema(self) -> str:
        options = _lower(self.options)
        if _is_topic(options):
            return _TOPIC_SCHEMA
        return _source_schema(_flag(options, "includeValue"))

    def reader(self, schema: StructType) -> K7BatchReader | K7TopicBatchReader:
        options = _lower(self.options)
        if _is_topic(options):
            return K7TopicBatchReader(options, schema)
        return K7BatchReader(options, schema)

    def writer(
        self, schema: StructType, overwrite: bool
    ) -> K7BatchWriter | K7TopicBatchWriter:
        options = _lower(self.options)
        if _sink_is_topic(options, schema):
            return K7TopicBatchWriter(options, schema, overwrite)
        return K7BatchWriter(options, schema, overwrite)

    def streamReader(self, schema: StructType) -> K7StreamReader | K7TopicStreamReader:
        _load_streaming()
        options = _lower(self.options)
        if _is_topic(options):
            return K7TopicStreamReader(options, schema)
        return K7StreamReader(options, schema)

    def streamWriter(
        self, schema: StructType, overwrite: bool
    ) -> K7StreamWriter | K7TopicStreamWriter:
        _load_streaming()
        options = _lower(self.options)
        if _sink_is_topic(options, schema):
            return K7TopicStreamWriter(options, schema, overwrite)
        return K7StreamWriter(options, schema, overwrite)


def local_session(app_name: str = "k7", **conf: str) -> Any:
    """A SparkSession on this machine (``local[2]``, UI and console progress off, 2 shuffle
    partitions, UTC) with ``format("k7")`` registered: for examples, tests and benchmarks.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` unless set, and ``PYSPARK_PYTHON`` to this interpreter
    so that Spark's Python workers import this k7core. ``conf`` adds Spark settings (dots
    as ``_``: ``sql_warehouse_dir="/tmp/w"`` is ``spark.sql.warehouse.dir``).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]").appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config("spark." + key.replace("_", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(K7DataSource)
    return session


_STREAMING = (
    "SINK_PREFIX", "K7StreamReader", "K7StreamWriter", "K7TopicStreamReader",
    "K7TopicStreamWriter",
)


def _load_streaming() -> None:
    """Bind the streaming names here, imported on first use: they need pyspark >= 4.2 (read
    limits, the Arrow stream writer)."""
    if "K7StreamWriter" in globals():
        return
    try:
        from . import _stream
    except ImportError as exc:
        import pyspark

        raise K7Error(
            f"k7 streaming needs pyspark >= 4.2; this is pyspark {pyspark.__version__} ({exc})",
            hint="pip install -U 'k7py[spark]'",
        ) from exc
    names = {name: getattr(_stream, name) for name in _STREAMING}
    for value in names.values():
        if isinstance(value, type):
            value.__module__ = __name__
    globals().update(names)


def __getattr__(name: str) -> Any:
    """The streaming names of ``__all__``, imported on first use."""
    if name not in _STREAMING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load_streaming()
    return globals()[name]


# Public objects report this package as their module, as anyio's do: tracebacks, reprs and
# help() name what users import (k7core.spark.K7DataSource), not the private module.
for _value in [globals()[name] for name in __all__ if name in globals()]:
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _value
