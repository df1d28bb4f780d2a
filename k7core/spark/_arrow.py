"""Rows: the source's schema, queue frames as Arrow record batches, and Arrow columns of
payloads appended to a queue. Column-wise both ways: no Python object per row. For topics:
Kafka's source schema, records decoded (and sink rows checked) by the topics' one codec,
one record at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .. import ColumnarBatch, K7Error, Queue
from ..topics._envelope import Headers, check_headers, decode_many, now_ms, value_bytes
from ..topics._partitioner import key_bytes
from ._errors import K7OptionError

DEFAULT_SCHEMA = "offset BIGINT, payload BINARY"
VALUE_SCHEMA = "offset BIGINT, payload BINARY, value STRING"
PAYLOAD_SCHEMA = pa.schema([pa.field("payload", pa.binary())])
"""What the sink stages: one binary column."""


def source_schema(include_value: bool) -> str:
    """The read schema (Spark DDL); ``include_value`` adds ``value STRING``."""
    return VALUE_SCHEMA if include_value else DEFAULT_SCHEMA


def arrow_schema(include_value: bool) -> pa.Schema:
    """The read schema as Arrow."""
    return pa.schema(
        [pa.field("offset", pa.int64()), pa.field("payload", pa.binary())]
        + ([pa.field("value", pa.string())] if include_value else [])
    )


def record_batch(batch: ColumnarBatch, schema: pa.Schema, include_value: bool) -> pa.RecordBatch:
    """Column-wise: the offsets array as it is, payloads gathered by the C kernel into one
    buffer with Arrow int32 offsets."""
    n = len(batch)
    data, offs = batch.gather()
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.offsets)])
    payload = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(data)]
    )
    columns = [offsets, payload]
    if include_value:
        columns.append(utf8(payload))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def utf8(payload: pa.Array) -> pa.Array:
    """UTF-8 view of the payloads; invalid bytes replaced (per row, only where invalid)."""
    try:
        arr = payload.cast(pa.string())
        arr.validate(full=True)
        return arr
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [bytes(v).decode("utf-8", "replace") for v in payload.to_pylist()], pa.string()
        )


def payload_column(schema: StructType) -> tuple[str, bool]:
    """The column a sink writes: ``("payload", False)`` for a ``payload`` BINARY column,
    else ``("value", True)`` for a ``value`` STRING one (to encode as UTF-8)."""
    fields = {f.name: f.dataType for f in schema.fields}
    if isinstance(fields.get("payload"), BinaryType):
        return "payload", False
    if isinstance(fields.get("value"), StringType):
        return "value", True
    found = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
    raise K7OptionError(
        f"the k7 sink needs a 'payload' BINARY or a 'value' STRING column; "
        f"the DataFrame has: {found or 'no columns'}"
    )


def append_binary(q: Queue, col: pa.Array) -> None:
    """Append an Arrow binary column as it is: its data buffer and int32 offsets."""
    n = len(col)
    if not n:
        return
    buffers = col.buffers()
    offsets = memoryview(buffers[1]).cast("i")[col.offset : col.offset + n + 1]
    data = buffers[2] if buffers[2] is not None else b""
    q.enqueue_columnar(memoryview(data), offsets)


# ---------------------------------------------------------------------------- topics

TOPIC_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
"""A topic's read schema: Kafka's source schema (headers always included)."""

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
TOPIC_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()), pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()), pa.field("headers", HEADERS_TYPE),
])
CREATE_TIME = 0
"""``timestampType`` of every record: Kafka's CreateTime (the producer's timestamp)."""


def topic_record_batch(batch: ColumnarBatch, topic: str, partition: int) -> pa.RecordBatch:
    """The records of one partition's frames as Kafka's source rows, each decoded by the
    topics' one decoder (``CorruptRecordError`` for a payload that is not a record)."""
    n = len(batch)
    records = decode_many([(batch.offsets[i], batch.payload(i)) for i in range(n)], partition)
    millis = pa.array([r.timestamp for r in records], pa.int64())
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(batch.offsets)]),
        millis.cast(pa.timestamp("ms", tz="UTC")).cast(TIMESTAMP_TYPE),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        pa.array([list(r.headers) for r in records], HEADERS_TYPE),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=TOPIC_ARROW_SCHEMA)


TOPIC_WRITE_COLUMNS = "value (BINARY or STRING, required), key (BINARY or STRING), " \
    "headers (ARRAY<STRUCT<key: STRING, value: BINARY>>), timestamp (TIMESTAMP), partition (INT)"


def topic_columns(schema: StructType) -> dict[str, str]:
    """The columns a topic sink writes, checked: ``{name: type}`` of those present among
    value, key, headers, timestamp and partition (other columns, such as a read topic's
    ``topic`` and ``offset``, are left out)."""
    fields = {f.name: f.dataType for f in schema.fields}
    ok: dict[str, Callable[[DataType], bool]] = {
        "value": lambda t: isinstance(t, (BinaryType, StringType)),
        "key": lambda t: isinstance(t, (BinaryType, StringType)),
        "headers": lambda t: (
            isinstance(t, ArrayType) and isinstance(t.elementType, StructType)
            and [f.name for f in t.elementType.fields] == ["key", "value"]
            and isinstance(t.elementType.fields[0].dataType, StringType)
            and isinstance(t.elementType.fields[1].dataType, (BinaryType, StringType))
        ),
        "timestamp": lambda t: isinstance(t, (TimestampType, TimestampNTZType)),
        "partition": lambda t: isinstance(t, IntegerType),
    }
    found = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
    if "value" not in fields:
        raise K7OptionError(
            f"the k7 topic sink needs a 'value' column; it writes {TOPIC_WRITE_COLUMNS}; "
            f"the DataFrame has: {found or 'no columns'}"
        )
    for name, check in ok.items():
        if name in fields and not check(fields[name]):
            raise K7OptionError(
                f"the k7 topic sink cannot write column {name} "
                f"{fields[name].simpleString()}: it writes {TOPIC_WRITE_COLUMNS}"
            )
    return {name: fields[name].simpleString() for name in ok if name in fields}


class TopicRow(NamedTuple):
    """One row for a topic, as the envelope takes it (``partition`` None: placed by key)."""

    value: bytes
    key: bytes | None
    headers: Headers
    timestamp: int
    partition: int | None


def topic_rows(batch: pa.RecordBatch, columns: dict[str, str]) -> list[TopicRow]:
    """The rows of an Arrow batch of a topic sink's DataFrame, checked (a null value is
    an error; a null key, headers, timestamp or partition is absent)."""
    n = batch.num_rows
    nones: list[Any] = [None] * n

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in columns else nones

    values = batch.column("value")
    if values.null_count:
        raise K7Error("the k7 topic sink got a null value (a record's value must be bytes)")
    if "timestamp" in columns:
        col = batch.column("timestamp")
        micros = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64()).to_pylist()
        stamps = [now_ms() if us is None else us // 1000 for us in micros]
    else:
        stamp = now_ms()
        stamps = [stamp] * n
    out = []
    for value, key, headers, ts, p in zip(
        values.to_pylist(), column("key"), column("headers"), stamps, column("partition"),
        strict=True,
    ):
        pairs = () if headers is None else check_headers([_header(h) for h in headers])
        out.append(TopicRow(value_bytes(value), key_bytes(key), pairs, ts, p))
    return out


def _header(h: dict[str, Any] | None) -> tuple[str, bytes]:
    if h is None or h["key"] is None or h["value"] is None:
        raise K7Error(
            f"the k7 topic sink got a null header or header key or value ({h!r}): a "
            f"record's header is a name and bytes"
        )
    return h["key"], h["value"]
