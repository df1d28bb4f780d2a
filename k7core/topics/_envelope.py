"""The topic record envelope: key, headers, timestamp and value inside one k7 payload.

The one place that reads or writes it (docs/format.md, "Topic records")::

    0       1       2                10
    +-------+-------+----------------+----------------------+------------------+-------+
    | 0xE7  | flags | timestamp ms   | key (flags & 1):     | headers          | value |
    | magic |       | int64 LE       | u32 LE length, bytes | (flags & 2):     | (the  |
    |       |       | (Unix epoch)   |                      | u16 LE count,    | rest) |
    |       |       |                |                      | then per header: |       |
    |       |       |                |                      | u16 name length, |       |
    |       |       |                |                      | UTF-8 name,      |       |
    |       |       |                |                      | u32 value length,|       |
    |       |       |                |                      | value bytes      |       |
    +-------+-------+----------------+----------------------+------------------+-------+

Flag bits other than 1 and 2 are reserved (zero); a reader refuses a payload that sets
them, or whose magic is not 0xE7 (``CorruptRecordError``). An absent key differs from an
empty one (Kafka's null key), as in Kafka; headers keep their order and may repeat a name.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeAlias

from .._group import Message
from .._native._fast import record_encode, records_decode
from ._errors import CorruptRecordError

MAGIC = 0xE7
FLAG_KEY = 1
FLAG_HEADERS = 2
HEAD_SIZE = 10
MAX_HEADERS = 0xFFFF
MAX_HEADER_NAME = 0xFFFF

_HEAD = struct.Struct("<BBq")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_TS_MIN, _TS_MAX = -(1 << 63), (1 << 63) - 1

Headers: TypeAlias = tuple[tuple[str, bytes], ...]
Value: TypeAlias = bytes | bytearray | memoryview | str
"""A record value (or key): bytes-like as is, ``str`` as UTF-8."""
HeadersArg: TypeAlias = (
    "Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]] | None"
)


class Record(NamedTuple):
    """A record read from a topic: where it is, and what the producer sent."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp: int  # milliseconds since the Unix epoch, as Kafka's record timestamp


def now_ms() -> int:
    """The default record timestamp: wall-clock milliseconds (Kafka's CreateTime)."""
    return time.time_ns() // 1_000_000


def value_bytes(value: object, what: str = "value") -> bytes:
    """A record value or key as bytes: bytes-like as is, ``str`` as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return _utf8(value, what)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: say which argument, and where
        raise ValueError(
            f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None


def check_headers(headers: object) -> Headers:
    """Headers as stored: ``(name, value bytes)`` pairs, from a mapping or pairs."""
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"headers must be a mapping or (name, value) pairs, not {type(headers).__name__}"
        )
    out: list[tuple[str, bytes]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"each header must be a (name, value) pair, not {item!r}")
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"a header name must be a str, not {type(name).__name__}")
        if len(_utf8(name, f"header name {name[:40]!r}")) > MAX_HEADER_NAME:
            raise ValueError(f"header name {name[:40]!r}... is longer than 65535 bytes")
        out.append((name, value_bytes(value, f"header {name!r}")))
    if len(out) > MAX_HEADERS:
        raise ValueError(f"a record holds at most {MAX_HEADERS} headers, not {len(out)}")
    return tuple(out)


def check_timestamp(timestamp: object) -> int:
    """A record timestamp in milliseconds (None: now)."""
    if timestamp is None:
        return now_ms()
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(
            f"timestamp must be an int of milliseconds since the epoch, not "
            f"{type(timestamp).__name__}"
        )
    if not _TS_MIN <= timestamp <= _TS_MAX:
        raise ValueError(f"timestamp {timestamp} does not fit in 64 bits")
    return timestamp


encode = record_encode
"""``encode(value, key, headers, timestamp) -> bytes``: one record's payload, built in C
(``_fast.c``'s ``record_encode``, the layout above). Arguments come checked: bytes, bytes or
None, ``check_headers``' pairs, an int64 (see the ``check_*`` functions)."""


def decode_many(
    pairs: list[Message] | list[tuple[int, memoryview]], partition: int
) -> list[Record]:
    """The records of ``(offset, payload)`` pairs (a ``k7core.Message`` is one) of one
    partition, decoded in C; ``CorruptRecordError`` (from :func:`decode`, which says which
    and why) if one is not an envelope."""
    try:
        return records_decode(pairs, partition, Record)
    except ValueError:
        for off, payload in pairs:
            decode(payload, partition, off)
        raise


def decode(payload: bytes | memoryview, partition: int, offset: int) -> Record:
    """The record in one payload; ``CorruptRecordError`` if it is not an envelope."""
    try:
        magic, flags, ts = _HEAD.unpack_from(payload, 0)
        if magic != MAGIC or flags & ~(FLAG_KEY | FLAG_HEADERS):
            raise ValueError("magic or flags")
        pos = HEAD_SIZE
        key: bytes | None = None
        if flags & FLAG_KEY:
            (n,) = _U32.unpack_from(payload, pos)
            pos += 4
            if pos + n > len(payload):
                raise ValueError("key")
            key = bytes(payload[pos:pos + n])
            pos += n
        headers: Headers = ()
        if flags & FLAG_HEADERS:
            (count,) = _U16.unpack_from(payload, pos)
            pos += 2
            hs = []
            for _ in range(count):
                (n,) = _U16.unpack_from(payload, pos)
                pos += 2
                name = bytes(payload[pos:pos + n]).decode()
                pos += n
                (m,) = _U32.unpack_from(payload, pos)
                pos += 4
                if pos + m > len(payload):
                    raise ValueError("header")
                hs.append((name, bytes(payload[pos:pos + m])))
                pos += m
            headers = tuple(hs)
        return Record(partition, offset, key, bytes(payload[pos:]), headers, ts)
    except (struct.error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptRecordError(
            f"the payload at offset {offset} of partition {partition} is not a topic record "
            f"({len(payload)} bytes; {exc})", offset=offset,
            hint="a topic's partitions hold only records written through k7core.topics",
        ) from None
