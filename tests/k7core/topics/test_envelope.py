"""The topic record envelope (k7core.topics._envelope): the round trip of every field, the
documented byte layout byte for byte, corrupt payloads refused with their offset, and the
argument checks' errors."""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k7core import IntegrityError, K7Error
from k7core.topics import CorruptRecordError, Record
from k7core.topics._envelope import (
    FLAG_HEADERS,
    FLAG_KEY,
    HEAD_SIZE,
    MAGIC,
    MAX_HEADER_NAME,
    MAX_HEADERS,
    check_headers,
    check_timestamp,
    decode,
    encode,
    now_ms,
    value_bytes,
)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# ------------------------------------------------------------------------ round trip

keys = st.none() | st.binary(max_size=64)
values = st.binary(max_size=256) | st.text(max_size=64)
header_values = st.binary(max_size=32) | st.text(max_size=16)
# Few names, so that names repeat; the empty name is a name too.
header_names = st.sampled_from(["", "a", "trace-id", "é", "名前"]) | st.text(max_size=8)
header_lists = st.lists(st.tuples(header_names, header_values), max_size=8)
timestamps = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(
    [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX]
)


def as_bytes(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else v


@settings(max_examples=400, deadline=None)
@given(value=values, key=keys, headers=header_lists, timestamp=timestamps,
       partition=st.integers(0, 4095), offset=st.integers(0, 1 << 62))
def test_round_trip(
    value: bytes | str, key: bytes | None, headers: list[tuple[str, bytes | str]],
    timestamp: int, partition: int, offset: int,
) -> None:
    stored = check_headers(headers)
    payload = encode(value_bytes(value), key, stored, check_timestamp(timestamp))
    record = decode(payload, partition, offset)
    assert record == Record(
        partition, offset, key, as_bytes(value),
        tuple((n, as_bytes(v)) for n, v in headers), timestamp,
    )
    # The same through a memoryview (what a columnar batch hands out).
    assert decode(memoryview(payload), partition, offset) == record
    assert type(record.value) is bytes
    assert record.key is None or type(record.key) is bytes


@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(value=st.binary(max_size=32), timestamp=timestamps)
def test_absent_key_differs_from_empty_key(value: bytes, timestamp: int) -> None:
    none = encode(value, None, (), timestamp)
    empty = encode(value, b"", (), timestamp)
    assert none != empty
    assert decode(none, 0, 0).key is None
    assert decode(empty, 0, 0).key == b""
    assert none[1] == 0 and empty[1] == FLAG_KEY
    # no key and no headers: the 10-byte head, then the value
    assert len(none) == HEAD_SIZE + len(value)
    assert len(empty) == HEAD_SIZE + 4 + len(value)


def test_headers_keep_order_and_repeated_names() -> None:
    headers = check_headers([("b", b"1"), ("a", "2"), ("b", b"3"), ("", b"")])
    assert headers == (("b", b"1"), ("a", b"2"), ("b", b"3"), ("", b""))
    rec = decode(encode(b"v", None, headers, 7), 3, 99)
    assert rec.headers == headers
    assert rec.key is None and rec.partition == 3 and rec.offset == 99


def test_empty_headers_are_no_headers() -> None:
    assert check_headers(None) == ()
    assert check_headers({}) == ()
    assert check_headers([]) == ()
    assert encode(b"v", None, (), 0)[1] == 0


def test_headers_from_a_mapping_keep_its_order() -> None:
    m = OrderedDict([("z", "last?"), ("a", b"\x00\xff")])
    assert check_headers(m) == (("z", b"last?"), ("a", b"\x00\xff"))
    assert check_headers({"k": bytearray(b"ba"), "m": memoryview(b"mv")}) == (
        ("k", b"ba"), ("m", b"mv"),
    )
    # a generator of pairs is taken as it comes
    assert check_headers((f"h{i}", str(i)) for i in range(3)) == (
        ("h0", b"0"), ("h1", b"1"), ("h2", b"2"),
    )


def test_str_values_are_utf8() -> None:
    assert value_bytes("é€😀") == "é€😀".encode()
    assert value_bytes(b"\xff") == b"\xff"
    assert value_bytes(bytearray(b"ab")) == b"ab"
    assert type(value_bytes(bytearray(b"ab"))) is bytes
    assert value_bytes(memoryview(b"xyz")[1:]) == b"yz"


@pytest.mark.parametrize("timestamp", [INT64_MIN, -1, 0, INT64_MAX])
def test_timestamp_bounds(timestamp: int) -> None:
    assert check_timestamp(timestamp) == timestamp
    assert decode(encode(b"", None, (), timestamp), 0, 0).timestamp == timestamp


def test_timestamp_none_is_now() -> None:
    before = now_ms()
    ts = check_timestamp(None)
    after = now_ms()
    assert before <= ts <= after
    assert ts > 1_600_000_000_000  # milliseconds, not seconds


# ------------------------------------------------------------------------ the layout


def test_layout_byte_for_byte() -> None:
    """docs/format.md "Topic records": magic, flags, int64 LE timestamp, u32 LE key length
    and key, u16 LE header count, per header u16 LE name length, UTF-8 name, u32 LE value
    length, value bytes; then the record's value, the rest of the payload."""
    payload = encode(
        b"VAL", b"ky", (("h1", b"x"), ("é", b"")), 0x0102030405060708,
    )
    expected = bytes([
        0xE7,                                            # magic
        0x03,                                            # flags: key | headers
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  # timestamp int64 LE
        0x02, 0x00, 0x00, 0x00, ord("k"), ord("y"),      # key: u32 LE length, bytes
        0x02, 0x00,                                      # header count u16 LE
        0x02, 0x00, ord("h"), ord("1"),                  # name length u16 LE, name
        0x01, 0x00, 0x00, 0x00, ord("x"),                # value length u32 LE, value
        0x02, 0x00, 0xC3, 0xA9,                          # "é" in UTF-8 (2 bytes)
        0x00, 0x00, 0x00, 0x00,                          # empty value
    ]) + b"VAL"
    assert payload == expected
    assert MAGIC == 0xE7 and FLAG_KEY == 1 and FLAG_HEADERS == 2 and HEAD_SIZE == 10


def test_layout_negative_timestamp_and_headers_only() -> None:
    payload = encode(b"", None, (("a", b"b"),), -2)
    assert payload == (
        b"\xe7\x02" + b"\xfe" + b"\xff" * 7 + b"\x01\x00" + b"\x01\x00a" + b"\x01\x00\x00\x00b"
    )
    assert payload[1] == FLAG_HEADERS
    assert struct.unpack_from("<q", payload, 2) == (-2,)


def test_layout_no_key_no_headers() -> None:
    assert encode(b"hello", None, (), 1) == b"\xe7\x00\x01" + b"\x00" * 7 + b"hello"


# ------------------------------------------------------------------------ corrupt payloads

GOOD = encode(b"value", b"key", (("name", b"hv"),), 123)


def _with_flags(flags: int, rest: bytes = b"") -> bytes:
    return struct.pack("<BBq", MAGIC, flags, 0) + rest


CORRUPT = {
    "empty": b"",
    "short head": GOOD[:HEAD_SIZE - 1],
    "bad magic": b"\xe6" + GOOD[1:],
    "zero magic": b"\x00" * 16,
    "reserved flag 4": _with_flags(4, b"x"),
    "reserved flag 0x80": _with_flags(0x80 | FLAG_KEY, b"\x00\x00\x00\x00"),
    "reserved flags with key and headers": bytes([MAGIC, GOOD[1] | 8]) + GOOD[2:],
    "key length truncated": _with_flags(FLAG_KEY, b"\x01\x00"),
    "key longer than payload": _with_flags(FLAG_KEY, b"\x05\x00\x00\x00abcd"),
    "header count truncated": _with_flags(FLAG_HEADERS, b"\x01"),
    "header missing": _with_flags(FLAG_HEADERS, b"\x01\x00"),
    "header name length truncated": _with_flags(FLAG_HEADERS, b"\x01\x00\x03"),
    "header name longer than payload": _with_flags(FLAG_HEADERS, b"\x01\x00\x09\x00abc"),
    "header value length truncated": _with_flags(FLAG_HEADERS, b"\x01\x00\x01\x00a\x01\x00"),
    "header value longer than payload": _with_flags(
        FLAG_HEADERS, b"\x01\x00\x01\x00a\x04\x00\x00\x00xyz"),
    "second header missing": _with_flags(
        FLAG_HEADERS, b"\x02\x00\x01\x00a\x00\x00\x00\x00"),
    "header name not UTF-8": _with_flags(
        FLAG_HEADERS, b"\x01\x00\x02\x00\xc3\x28\x00\x00\x00\x00"),
    "header name lone surrogate": _with_flags(
        FLAG_HEADERS, b"\x01\x00\x03\x00\xed\xa0\x80\x00\x00\x00\x00"),
    "key truncated after good key flag": GOOD[:HEAD_SIZE + 5],
}


@pytest.mark.parametrize("payload", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_payload_raises_with_offset(payload: bytes) -> None:
    with pytest.raises(CorruptRecordError) as info:
        decode(payload, 5, 4242)
    err = info.value
    assert err.offset == 4242
    assert isinstance(err, IntegrityError) and isinstance(err, K7Error)
    assert "offset 4242" in str(err) and "partition 5" in str(err)
    assert err.hint  # says what a topic's partitions hold
    with pytest.raises(CorruptRecordError):
        decode(memoryview(payload), 5, 4242)


def test_good_payload_decodes() -> None:  # the control of the table above
    assert decode(GOOD, 0, 0) == Record(0, 0, b"key", b"value", (("name", b"hv"),), 123)


def _mutate(data: tuple[bytes, int, int]) -> bytes:
    payload, at, byte = data
    at %= len(payload)
    return payload[:at] + bytes([byte]) + payload[at + 1:]


# Random bytes rarely start with the magic: also the magic then random bytes, and a good
# payload with one byte changed.
suspects = (
    st.binary(max_size=64)
    | st.binary(max_size=64).map(lambda b: bytes([MAGIC]) + b)
    | st.tuples(st.just(GOOD), st.integers(0, 1 << 16), st.integers(0, 255)).map(_mutate)
)


@settings(max_examples=500, deadline=None)
@given(suspects, st.integers(0, 1 << 40))
def test_any_bytes_decode_or_raise_corrupt(payload: bytes, offset: int) -> None:
    """Any bytes either decode to a record (which encodes to a payload decoding to the same
    record), or raise CorruptRecordError: never another exception."""
    try:
        rec = decode(payload, 1, offset)
    except CorruptRecordError as exc:
        assert exc.offset == offset
    else:
        assert decode(encode(rec.value, rec.key, rec.headers, rec.timestamp), 1, offset) == rec


@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(key=keys, headers=header_lists, value=st.binary(max_size=16))
def test_every_truncation_of_the_fields_is_refused(
    key: bytes | None, headers: list[tuple[str, bytes | str]], value: bytes,
) -> None:
    """Cutting a payload anywhere inside its head, key or headers is corrupt; cutting it in
    the value is a shorter value."""
    payload = encode(value, key, check_headers(headers), 0)
    fields_end = len(payload) - len(value)
    for cut in range(fields_end):
        with pytest.raises(CorruptRecordError):
            decode(payload[:cut], 0, 7)
    for cut in range(fields_end, len(payload) + 1):
        assert decode(payload[:cut], 0, 7).value == value[: cut - fields_end]


# ------------------------------------------------------------------------ argument checks


@pytest.mark.parametrize(("headers", "match"), [
    (42, "headers must be a mapping or \\(name, value\\) pairs, not int"),
    ("ab", "headers must be a mapping or \\(name, value\\) pairs, not str"),
    (b"ab", "headers must be a mapping or \\(name, value\\) pairs, not bytes"),
    ([("a",)], "each header must be a \\(name, value\\) pair"),
    ([("a", b"b", b"c")], "each header must be a \\(name, value\\) pair"),
    (["ab"], "each header must be a \\(name, value\\) pair, not 'ab'"),
    ([(1, b"x")], "a header name must be a str, not int"),
    ([(b"n", b"x")], "a header name must be a str, not bytes"),
    ({1: b"x"}, "a header name must be a str, not int"),
    ([("a", 1)], "header 'a' must be bytes or str, not int"),
    ({"n": None}, "header 'n' must be bytes or str, not NoneType"),
])
def test_check_headers_type_errors(headers: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        check_headers(headers)


def test_check_headers_limits() -> None:
    longest = "n" * MAX_HEADER_NAME
    assert check_headers([(longest, b"")]) == ((longest, b""),)
    with pytest.raises(ValueError, match="longer than 65535 bytes"):
        check_headers([("n" * (MAX_HEADER_NAME + 1), b"")])
    # the limit is on the UTF-8 bytes, not the characters
    with pytest.raises(ValueError, match="longer than 65535 bytes"):
        check_headers([("é" * (MAX_HEADER_NAME // 2 + 1), b"")])
    many = [("h", b"")] * MAX_HEADERS
    assert len(check_headers(many)) == MAX_HEADERS
    with pytest.raises(ValueError, match="at most 65535 headers, not 65536"):
        check_headers([*many, ("h", b"")])


def test_most_headers_round_trip() -> None:
    hs = check_headers([(f"h{i % 7}", str(i)) for i in range(MAX_HEADERS)])
    assert decode(encode(b"v", None, hs, 0), 0, 0).headers == hs


def test_header_name_lone_surrogate_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match=r"header name .* not valid Unicode"):
        check_headers([("a\ud800", b"")])


def test_str_value_lone_surrogate_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match="value is not valid Unicode"):
        value_bytes("x\udfff")
    with pytest.raises(ValueError, match="header 'h' is not valid Unicode"):
        check_headers({"h": "\ud800"})


@pytest.mark.parametrize(("value", "kind"), [
    (1, "int"), (None, "NoneType"), (1.5, "float"), ([b"a"], "list"), (object(), "object"),
])
def test_value_bytes_type_errors(value: object, kind: str) -> None:
    with pytest.raises(TypeError, match=f"^value must be bytes or str, not {kind}$"):
        value_bytes(value)
    with pytest.raises(TypeError, match=f"^key must be bytes or str, not {kind}$"):
        value_bytes(value, "key")


@pytest.mark.parametrize(("timestamp", "kind"), [
    (True, "bool"), (False, "bool"), (1.0, "float"), ("1", "str"), (b"1", "bytes"),
])
def test_check_timestamp_type_errors(timestamp: object, kind: str) -> None:
    with pytest.raises(TypeError, match=f"timestamp must be an int of milliseconds since the "
                                        f"epoch, not {kind}"):
        check_timestamp(timestamp)


@pytest.mark.parametrize("timestamp", [INT64_MAX + 1, INT64_MIN - 1, 1 << 100, -(1 << 100)])
def test_check_timestamp_out_of_range(timestamp: int) -> None:
    with pytest.raises(ValueError, match=f"timestamp {timestamp} does not fit in 64 bits"):
        check_timestamp(timestamp)
