"""The streaming half of the k7 data source: the names that need PySpark >= 4.2 (read
limits, availableNow, the Arrow stream writer). Imported on first use, by the package or a
streaming query, so that batch reads and writes also work on older PySpark."""

from __future__ import annotations

from ._stream_reader import K7StreamReader, K7TopicStreamReader
from ._stream_writer import SINK_PREFIX, K7StreamWriter, K7TopicStreamWriter

__all__ = [
    "SINK_PREFIX",
    "K7StreamReader",
    "K7StreamWriter",
    "K7TopicStreamReader",
    "K7TopicStreamWriter",
]
