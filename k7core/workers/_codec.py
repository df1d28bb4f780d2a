"""Payload codecs, and the envelope a job body carries the put's context and error
history in.

A body is the encoded payload itself, so that any beanstalkd client can read and write a
tube, unless the job carries context or (over a beanstalkd server, which keeps no error
texts) errors. It is then an envelope::

    b"K7W1"  u32 big-endian header length  header (JSON)  payload (the rest)

with header ``{"c": {var name: value}, "e": [error text, ...], "t": created_at}`` (each key
only when it has something). A payload whose encoding starts with the magic is always put
in an envelope, so reading is never ambiguous.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._errors import K7Error

MAGIC = b"K7W1"
_LENGTH = struct.Struct(">I")
_HEAD = len(MAGIC) + _LENGTH.size


class PayloadError(K7Error, ValueError):
    """A payload could not be encoded at put, or a job body could not be decoded: the
    codec of the tube does not fit the data. Nothing was stored; a job whose body cannot
    be decoded is buried with this error."""


@dataclass(frozen=True)
class Codec:
    """How payloads become job bodies and back (yoltq's ``:encode``/``:decode``)."""

    name: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def _json_encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _msgpack() -> Codec:
    try:
        import msgpack  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise K7Error("the msgpack codec needs the msgpack package",
                      hint="pip install msgpack") from exc
    return Codec("msgpack", lambda v: bytes(msgpack.packb(v)),
                 lambda b: msgpack.unpackb(b))


_json_decoder = json.JSONDecoder()
_json_scan: Callable[[str, int], tuple[Any, int]] = _json_decoder.scan_once  # type: ignore[attr-defined]


def _json_decode(data: bytes) -> Any:
    text = data.decode()
    try:  # a value that fills the text: the scanner alone (decode() adds two regex matches)
        value, end = _json_scan(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):  # whitespace around it, or not JSON: decode() says which
        return _json_decoder.decode(text)
    return value


JSON = Codec("json", _json_encode, _json_decode)
"""The default: UTF-8 JSON, readable by clients in any language."""
PICKLE = Codec("pickle", lambda v: pickle.dumps(v, protocol=5), pickle.loads)
"""Any picklable object. Opt-in: unpickling runs code named by the data, so only for
queues nobody untrusted can put to."""


def codec(spec: str | Codec) -> Codec:
    """The codec ``spec`` names: ``"json"``, ``"msgpack"`` (needs msgpack), ``"pickle"``,
    or a :class:`Codec` of your own."""
    if isinstance(spec, Codec):
        return spec
    if spec == "json":
        return JSON
    if spec == "pickle":
        return PICKLE
    if spec == "msgpack":
        return _msgpack()
    raise K7Error(f"unknown codec {spec!r}",
                  hint='use "json", "msgpack", "pickle" or a k7core.workers.Codec')


class Envelope(NamedTuple):
    """A job body, taken apart."""

    payload: bytes
    context: Mapping[str, Any]
    errors: tuple[str, ...]
    created_at: float | None


def pack(payload: bytes, context: Mapping[str, Any] | None = None,
         errors: tuple[str, ...] = (), created_at: float | None = None) -> bytes:
    """The job body for an encoded payload and what goes with it."""
    header: dict[str, Any] = {}
    if context:
        header["c"] = dict(context)
    if errors:
        header["e"] = list(errors)
    if created_at is not None:
        header["t"] = created_at
    if not header and not payload.startswith(MAGIC):
        return payload
    try:
        head = _json_encode(header)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"the job's context cannot be stored: {exc}",
                           hint="give context variables JSON values (str, int, ...)") from exc
    return MAGIC + _LENGTH.pack(len(head)) + head + payload


def encode_body(c: Codec, context: Iterable[ContextVar[Any]], payload: Any, tube: str
                ) -> bytes:
    """The body of a new job of ``tube``: ``payload`` encoded by ``c``, with the values the
    ``context`` variables have in the caller (those that are set)."""
    try:
        encoded = c.encode(payload)
    except Exception as exc:
        raise PayloadError(f"the {c.name} codec cannot encode this payload of "
                           f"tube {tube!r}: {exc}",
                           hint="pass another codec to the consumer, worker or outbox") from exc
    if isinstance(encoded, str):
        encoded = encoded.encode()
    values = {}
    for var in context:
        with suppress(LookupError):
            values[var.name] = var.get()
    return pack(encoded, values)


def unpack(body: bytes) -> Envelope:
    """A job body taken apart (a body without the magic is all payload)."""
    if not body.startswith(MAGIC):
        return Envelope(body, {}, (), None)
    if len(body) < _HEAD:
        raise PayloadError("a job body is cut short inside its envelope")
    (size,) = _LENGTH.unpack_from(body, len(MAGIC))
    if _HEAD + size > len(body):
        raise PayloadError("a job body is cut short inside its envelope")
    try:
        header = json.loads(body[_HEAD:_HEAD + size])
    except ValueError as exc:
        raise PayloadError(f"a job body's envelope is not valid: {exc}") from exc
    if not isinstance(header, dict):
        raise PayloadError("a job body's envelope is not valid")
    created = header.get("t")
    return Envelope(body[_HEAD + size:], header.get("c") or {},
                    tuple(header.get("e") or ()),
                    float(created) if isinstance(created, int | float) else None)
