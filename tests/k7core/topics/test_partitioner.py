"""Key placement (k7core.topics._partitioner): Kafka's murmur2 and TitanMQ's MurmurHash3 in the
C kernel against published vectors and against the slow pure-Python references below, the
partition each gives, keyless spreading, and the refusals."""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k7core._kernel import lib
from k7core.topics._partitioner import (
    KAFKA_SEED,
    PARTITIONERS,
    TITANMQ_SEED,
    KafkaPartitioner,
    KeylessSpreader,
    Murmur3Partitioner,
    kafka_murmur2,
    key_bytes,
    murmur3_32,
    partitioner_for,
)

# ------------------------------------------------------------- pure-Python references

U32 = 0xFFFFFFFF


def ref_murmur2(data: bytes, seed: int = 0x9747B28C) -> int:
    """Kafka's Utils.murmur2, step by step in Java's 32-bit int arithmetic."""
    m, length = 0x5BD1E995, len(data)
    h = (seed ^ length) & U32
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & U32
        k ^= k >> 24  # Java's >>> on an int
        k = (k * m) & U32
        h = (h * m) & U32
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest >= 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & U32
    h ^= h >> 13
    h = (h * m) & U32
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h  # as Java's int


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & U32


def _rotr(x: int, r: int) -> int:
    return _rotl(x, 32 - r)


C1, C2 = 0xCC9E2D51, 0x1B873593


def ref_murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 as Appleby's reference (MurmurHash3.cpp) writes it, unsigned."""
    h = seed
    nblocks = len(data) // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = _rotl((k * C1) & U32, 15) * C2 & U32
        h ^= k
        h = (_rotl(h, 13) * 5 + 0xE6546B64) & U32
    tail = data[4 * nblocks :]
    k = 0
    for j in reversed(range(len(tail))):  # case 3, 2, 1, falling through
        k ^= tail[j] << (8 * j)
    if tail:
        h ^= _rotl((k * C1) & U32, 15) * C2 & U32
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & U32
    h ^= h >> 16
    return h


def four_bytes_hashing_to(target: int, seed: int) -> bytes:
    """The 4-byte key whose MurmurHash3_x86_32 is ``target``: each step of the hash of one
    block is a bijection on 32 bits, so it runs backwards."""

    def inv(x: int) -> int:
        return pow(x, -1, 1 << 32)

    h = target
    h ^= h >> 16
    h = (h * inv(0xC2B2AE35)) & U32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * inv(0x85EBCA6B)) & U32
    h ^= h >> 16
    h ^= 4
    k = _rotr(((h - 0xE6546B64) * inv(5)) & U32, 13) ^ seed
    w = (_rotr((k * inv(C2)) & U32, 15) * inv(C1)) & U32
    return w.to_bytes(4, "little")


def java_abs_mod(h: int, n: int) -> int:
    """TitanMQ's ``Math.abs(h) % n`` for a Java int ``h`` other than -2**31."""
    return abs(h) % n


def signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


# ------------------------------------------------------------------------ murmur2

# Kafka's UtilsTest.testMurmur2.
KAFKA_VECTORS = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items())
def test_murmur2_kafka_vectors(key: str, expected: int) -> None:
    data = key.encode()
    assert kafka_murmur2(data) == expected
    assert lib.k7_murmur2(data, len(data), KAFKA_SEED) == expected
    assert ref_murmur2(data) == expected  # the reference is right too


def test_murmur2_empty_key() -> None:
    assert kafka_murmur2(b"") == ref_murmur2(b"")
    assert kafka_murmur2(b"") != 0  # the seed counts even with no bytes


@given(st.binary(max_size=200))
def test_murmur2_matches_reference(data: bytes) -> None:
    assert kafka_murmur2(data) == ref_murmur2(data)


@pytest.mark.parametrize("length", range(12))  # every tail (0..3), over 0..2 blocks
@given(data=st.data())
def test_murmur2_every_tail(length: int, data: st.DataObject) -> None:
    key = data.draw(st.binary(min_size=length, max_size=length))
    assert kafka_murmur2(key) == ref_murmur2(key)


@given(st.binary(max_size=40), st.integers(0, U32))
def test_murmur2_other_seeds(data: bytes, seed: int) -> None:
    assert lib.k7_murmur2(data, len(data), seed) == ref_murmur2(data, seed)


def test_murmur2_high_bytes_are_unsigned() -> None:
    """Java masks each byte with 0xff: a byte >= 0x80 must not sign-extend."""
    for key in (b"\xff", b"\x80\x81", b"\xfe\xff\x80", b"\xff\xff\xff\xff", b"\x90" * 7):
        assert kafka_murmur2(key) == ref_murmur2(key), key


# ------------------------------------------------------------------------ murmur3


@pytest.mark.parametrize(
    ("data", "seed", "expected"),
    [
        (b"", 0, 0),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"hello", 0, 0x248BFA47),
        (b"Hello, world!", 1234, 0xFAF6CDB3),
        (b"The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723),
    ],
)
def test_murmur3_known_vectors(data: bytes, seed: int, expected: int) -> None:
    assert murmur3_32(data, seed) == expected
    assert ref_murmur3_32(data, seed) == expected


@given(st.binary(max_size=200), st.integers(0, U32))
def test_murmur3_matches_reference(data: bytes, seed: int) -> None:
    assert murmur3_32(data, seed) == ref_murmur3_32(data, seed)


@pytest.mark.parametrize("length", range(12))
@given(data=st.data())
def test_murmur3_every_tail(length: int, data: st.DataObject) -> None:
    key = data.draw(st.binary(min_size=length, max_size=length))
    seed = data.draw(st.sampled_from([0, TITANMQ_SEED, U32]))
    assert murmur3_32(key, seed) == ref_murmur3_32(key, seed)


def _mmh3_hash() -> Callable[[bytes, int], int] | None:
    try:
        mmh3 = importlib.import_module("mmh3")  # not a dependency: an oracle when present
    except ImportError:
        return None
    return lambda data, seed: cast(int, mmh3.hash(data, seed, signed=False))


@pytest.mark.skipif(_mmh3_hash() is None, reason="mmh3 is not installed (an optional oracle)")
@given(st.binary(max_size=100), st.integers(0, U32))
def test_murmur3_matches_mmh3(data: bytes, seed: int) -> None:
    oracle = _mmh3_hash()
    assert oracle is not None
    assert murmur3_32(data, seed) == oracle(data, seed)


@pytest.mark.parametrize("seed", [-1, 1 << 32])
def test_murmur3_seed_out_of_range(seed: int) -> None:
    with pytest.raises(ValueError, match="seed"):
        murmur3_32(b"k", seed)
    with pytest.raises(ValueError, match="seed"):
        Murmur3Partitioner(seed)


def test_murmur3_seed_not_an_int() -> None:
    with pytest.raises(TypeError, match="seed"):
        murmur3_32(b"k", "1")  # type: ignore[arg-type]


# --------------------------------------------------------------------- partitions

# (murmur2 & 0x7fffffff) % n of the golden hashes, for n = 1, 2, 3, 12, 100.
KAFKA_PLACEMENTS = {
    "21": [0, 0, 0, 0, 40],
    "foobar": [0, 0, 0, 6, 66],
    "a-little-bit-long-string": [0, 0, 2, 8, 12],
    "a-little-bit-longer-string": [0, 1, 2, 11, 19],
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": [0, 1, 2, 5, 77],
    "abc": [0, 1, 0, 3, 7],
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_PLACEMENTS.items())
def test_kafka_placement(key: str, expected: list[int]) -> None:
    p = KafkaPartitioner()
    assert [p.partition(key.encode(), n) for n in (1, 2, 3, 12, 100)] == expected
    h = KAFKA_VECTORS[key]
    assert [(h & 0x7FFFFFFF) % n for n in (1, 2, 3, 12, 100)] == expected


def test_kafka_placement_is_the_mask_not_abs() -> None:
    """Kafka's toPositive keeps the low 31 bits; Math.abs would move "21" (a negative hash)."""
    assert KafkaPartitioner().partition(b"21", 100) == 40
    assert abs(KAFKA_VECTORS["21"]) % 100 == 8


@given(st.binary(max_size=64), st.integers(1, 10_000))
def test_kafka_partition_in_range_and_as_kafka(key: bytes, n: int) -> None:
    part = KafkaPartitioner().partition(key, n)
    assert part == (ref_murmur2(key) & 0x7FFFFFFF) % n
    assert 0 <= part < n


@given(st.binary(max_size=64), st.integers(1, 10_000))
def test_murmur3_partition_as_titanmq(key: bytes, n: int) -> None:
    h = signed(ref_murmur3_32(key, TITANMQ_SEED))
    part = Murmur3Partitioner().partition(key, n)
    assert 0 <= part < n
    if h != -(1 << 31):
        assert part == java_abs_mod(h, n)


def test_murmur3_partition_of_a_negative_hash() -> None:
    key = four_bytes_hashing_to(0xDEADBEEF, TITANMQ_SEED)
    assert murmur3_32(key, TITANMQ_SEED) == 0xDEADBEEF
    # Math.abs(0xDEADBEEF as an int) = 0x21524111, not 0xDEADBEEF & 0x7fffffff.
    assert Murmur3Partitioner().partition(key, 1000) == 0x21524111 % 1000 == 737
    assert (0xDEADBEEF & 0x7FFFFFFF) % 1000 == 911  # what the mask would give


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 1000])
def test_murmur3_partition_of_min_int(n: int) -> None:
    """The one hash Math.abs leaves negative (-2**31) still gives a partition in range."""
    key = four_bytes_hashing_to(0x80000000, TITANMQ_SEED)
    assert murmur3_32(key, TITANMQ_SEED) == 0x80000000
    assert Murmur3Partitioner().partition(key, n) == (1 << 31) % n


def test_murmur3_partitioner_seed() -> None:
    key = b"customer-123"
    h = signed(ref_murmur3_32(key, 7))
    assert Murmur3Partitioner(7).partition(key, 97) == java_abs_mod(h, 97)
    assert Murmur3Partitioner().seed == TITANMQ_SEED == 0x1234ABCD


def test_same_key_same_partition() -> None:
    for p in (KafkaPartitioner(), Murmur3Partitioner()):
        assert len({p.partition(b"order-42", 16) for _ in range(100)}) == 1


@pytest.mark.parametrize("name", PARTITIONERS)
def test_keys_spread_over_all_partitions(name: str) -> None:
    p = partitioner_for(name)
    counts = Counter(p.partition(f"key-{i}".encode(), 8) for i in range(8000))
    assert sorted(counts) == list(range(8))
    assert min(counts.values()) > 800  # 1000 each on average


@pytest.mark.parametrize("n", [0, -1, -12])
def test_bad_partition_count(n: int) -> None:
    for p in (KafkaPartitioner(), Murmur3Partitioner()):
        with pytest.raises(ValueError, match="partition count"):
            p.partition(b"k", n)
    with pytest.raises(ValueError, match="partition count"):
        KeylessSpreader().next(n)


@pytest.mark.parametrize("n", [True, 2.0, "3", None])
def test_partition_count_not_an_int(n: object) -> None:
    for p in (KafkaPartitioner(), Murmur3Partitioner()):
        with pytest.raises(TypeError, match="partition count"):
            p.partition(b"k", n)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="partition count"):
        KeylessSpreader().next(n)  # type: ignore[arg-type]


# ---------------------------------------------------------------- partitioner_for


def test_partitioner_for_names() -> None:
    assert PARTITIONERS == ("kafka", "murmur3")
    assert isinstance(partitioner_for(), KafkaPartitioner)
    assert isinstance(partitioner_for("kafka"), KafkaPartitioner)
    assert isinstance(partitioner_for("murmur3"), Murmur3Partitioner)
    for name in PARTITIONERS:
        assert partitioner_for(name).name == name


@pytest.mark.parametrize("name", ["Kafka", "murmur2", "", "kafka ", None, 3])
def test_partitioner_for_bad_name(name: object) -> None:
    with pytest.raises(ValueError) as info:
        partitioner_for(name)  # type: ignore[arg-type]
    assert str(info.value) == f"partitioner must be 'kafka' or 'murmur3', not {name!r}"


# ---------------------------------------------------------------------------- keys


def test_key_bytes() -> None:
    assert key_bytes(None) is None
    data = b"k\x00\xff"
    assert key_bytes(data) is data
    assert key_bytes(bytearray(data)) == data
    assert type(key_bytes(bytearray(data))) is bytes
    assert key_bytes(memoryview(b"xk\x00\xffx")[1:-1]) == data
    assert key_bytes("clé") == b"cl\xc3\xa9"  # UTF-8, as Kafka's StringSerializer
    assert key_bytes("") == b""


def test_str_key_places_as_kafka_string_key() -> None:
    data = key_bytes("foobar")
    assert data is not None
    assert kafka_murmur2(data) == KAFKA_VECTORS["foobar"]


@pytest.mark.parametrize("key", [1, 1.5, ["k"], {"k": 1}, object()])
def test_key_bytes_refuses_other_types(key: object) -> None:
    with pytest.raises(TypeError, match="str, bytes, bytearray, memoryview or None"):
        key_bytes(key)  # type: ignore[arg-type]


def test_key_bytes_lone_surrogate() -> None:
    with pytest.raises(UnicodeEncodeError):
        key_bytes("\ud800")


@pytest.mark.parametrize("key", ["abc", None, 3])
def test_hashes_refuse_non_bytes(key: object) -> None:
    for fn in (kafka_murmur2, murmur3_32):
        with pytest.raises(TypeError, match="bytes-like"):
            fn(key)  # type: ignore[arg-type]
    for p in (KafkaPartitioner(), Murmur3Partitioner()):
        with pytest.raises(TypeError, match="bytes-like"):
            p.partition(key, 3)  # type: ignore[arg-type]


def test_hashes_take_bytearray_and_memoryview() -> None:
    data = b"a-little-bit-long-string"
    for key in (bytearray(data), memoryview(data)):
        assert kafka_murmur2(key) == KAFKA_VECTORS[data.decode()]  # type: ignore[arg-type]
        assert murmur3_32(key, 5) == ref_murmur3_32(data, 5)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- keyless


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_keyless_covers_every_partition(n: int) -> None:
    spreader = KeylessSpreader()
    for _ in range(3):  # any n calls in a row give each partition once
        assert sorted(spreader.next(n) for _ in range(n)) == list(range(n))


def test_keyless_round_robin_from_start() -> None:
    spreader = KeylessSpreader(start=5)
    assert [spreader.next(4) for _ in range(6)] == [1, 2, 3, 0, 1, 2]


def test_keyless_starts_at_random() -> None:
    firsts = {KeylessSpreader().next(1000) for _ in range(50)}
    assert len(firsts) > 1  # fifty producers starting on one partition: chance 1000**-49


def test_keyless_bad_start() -> None:
    with pytest.raises(ValueError, match="start"):
        KeylessSpreader(start=-1)


def test_keyless_shared_between_threads() -> None:
    spreader = KeylessSpreader(start=0)
    n, per_thread, threads = 7, 7000, 4
    results: list[list[int]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def run(out: list[int]) -> None:
        barrier.wait()
        out.extend(spreader.next(n) for _ in range(per_thread))

    workers = [threading.Thread(target=run, args=(r,)) for r in results]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    counts = Counter(p for r in results for p in r)
    assert counts == dict.fromkeys(range(n), per_thread * threads // n)
