"""The C record codec (``_fast.c``: ``record_encode``, ``records_decode``) against the
envelope's Python decoder, which owns the layout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k7core.topics import CorruptRecordError, Record
from k7core.topics._envelope import decode, decode_many, encode

keys = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=5).map(
    tuple)
stamps = st.integers(-(1 << 63), (1 << 63) - 1)


@given(st.lists(st.tuples(st.binary(max_size=200), keys, headers, stamps), max_size=20),
       st.integers(0, 4095))
def test_c_decoding_equals_python_decoding(
    recs: list[tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...], int]], partition: int
) -> None:
    payloads = [encode(*r) for r in recs]
    pairs = [(i * 1000, memoryview(p)) for i, p in enumerate(payloads)]
    got = decode_many(pairs, partition)
    assert got == [decode(p, partition, off) for off, p in pairs]
    assert got == [Record(partition, i * 1000, k, v, h, ts)
                   for i, (v, k, h, ts) in enumerate(recs)]
    assert all(type(r) is Record for r in got)


@given(st.binary(max_size=64))
def test_c_refuses_what_python_refuses(data: bytes) -> None:
    try:
        expected: Record | None = decode(data, 1, 7)
    except CorruptRecordError:
        expected = None
    if expected is None:
        with pytest.raises(CorruptRecordError, match="offset 7"):
            decode_many([(7, memoryview(data))], 1)
    else:
        assert decode_many([(7, memoryview(data))], 1) == [expected]


def test_a_bad_record_among_good_ones_is_named() -> None:
    good = encode(b"v", None, (), 1)
    with pytest.raises(CorruptRecordError, match="offset 64 of partition 3"):
        decode_many([(0, memoryview(good)), (64, memoryview(b"\x01" + good[1:]))], 3)
