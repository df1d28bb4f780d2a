"""Rows: the source's schema, queue frames as Arrow record batches, and Arrow columns of
payloads appended to a queue. Column-wise both ways: no Python object per row."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import BinaryType, StringType, StructType

from .. import ColumnarBatch, Queue
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
