"""A topic as the data source sees it: is a path a topic, its metadata, which sink a write
takes (topic or queue), and a topic created from the ``partitions`` option."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql.types import BinaryType, StructType

from .._storage import list_segments
from ..topics import Topic
from ..topics._layout import META_FILE, TopicMeta, open_meta
from ._errors import K7OptionError
from ._options import int_option

TOPIC_ONLY_COLUMNS = ("key", "headers", "partition", "timestamp")
"""Columns that only a topic's records have (a queue's message is only bytes)."""


def is_topic(options: dict[str, str]) -> bool:
    """Whether the ``path`` option names a topic directory (one with ``k7py-topic.json``)."""
    path = options.get("path")
    if not path:
        return False
    return (Path(os.path.abspath(path)) / META_FILE).is_file()


def topic_meta(path: str) -> TopicMeta:
    """The metadata of the topic at ``path`` (``TopicError`` if it is not valid)."""
    return open_meta(Path(path), None, None, create=False)


def sink_is_topic(options: dict[str, str], schema: StructType) -> bool:
    """Whether a write goes to a topic: the path is one, the ``partitions`` option asks to
    create one, or the path is not a queue and the DataFrame is shaped as topic records (a
    ``value`` BINARY, or key, headers, partition or timestamp columns, and no ``payload``:
    ``ensure_topic`` then says how to create the topic)."""
    path = Path(os.path.abspath(options.get("path") or "."))
    if (path / META_FILE).is_file() or "partitions" in options:
        return True
    if path.is_dir() and list_segments(path):
        return False
    fields = {f.name: f.dataType for f in schema.fields}
    return "payload" not in fields and (
        isinstance(fields.get("value"), BinaryType) or any(c in fields for c in TOPIC_ONLY_COLUMNS)
    )


def ensure_topic(path: str, options: dict[str, str]) -> None:
    """Check that ``path`` is a topic (of ``partitions`` partitions, if the option is set),
    or create it with the ``partitions`` option; without it, a clear error."""
    partitions = int_option(options, "partitions", 0, 1)
    topic = Path(path)
    if (topic / META_FILE).is_file():
        open_meta(topic, partitions or None, None, create=False)  # the count must match
        return
    if not partitions:
        raise K7OptionError(
            f"{topic} is not a topic (no {META_FILE}): set option('partitions', N) to create "
            f"a topic of N partitions, or write a 'payload' BINARY or 'value' STRING column "
            f"alone to a plain queue"
        )
    if topic.is_dir() and list_segments(topic):
        raise K7OptionError(
            f"{topic} is a queue, not a topic: a topic cannot be created in a queue's "
            f"directory (option partitions={partitions})"
        )
    Topic(topic, partitions=partitions).close()  # created (or found created meanwhile)
