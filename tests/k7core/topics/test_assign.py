"""Partition assignment (k7core.topics._assign): ``range`` and ``roundrobin`` against Kafka's
RangeAssignor and RoundRobinAssignor for one topic (tables and a transliteration of their
Java), ``sticky`` balanced, complete and moving no more partitions than balance forces over
sequences of joins and leaves, and every strategy deterministic."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k7core.topics import STRATEGIES
from k7core.topics._assign import Assignment, assign, java_order, moved

# ------------------------------------------------------------------------ Kafka's Java


def java_sorted(members: Sequence[str]) -> list[str]:
    """``Collections.sort`` of member ids: Java's String.compareTo, UTF-16 code unit by
    code unit (written out, not with the module's key)."""

    def units(s: str) -> list[int]:
        out = []
        for ch in s:
            c = ord(ch)
            if c > 0xFFFF:
                c -= 0x10000
                out += [0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF)]
            else:
                out.append(c)
        return out

    return sorted(set(members), key=units)


def kafka_range(members: Sequence[str], n: int) -> Assignment:
    """RangeAssignor.assign for one topic, as its Java loop writes it."""
    consumers = java_sorted(members)
    per, with_extra = divmod(n, len(consumers))
    out: Assignment = {}
    for i, c in enumerate(consumers):
        start = per * i + min(i, with_extra)
        length = per + (0 if i + 1 > with_extra else 1)
        out[c] = list(range(start, start + length))
    return out


def kafka_roundrobin(members: Sequence[str], n: int) -> Assignment:
    """RoundRobinAssignor.assign for one topic: a CircularIterator over the sorted members,
    partitions in order."""
    consumers = java_sorted(members)
    out: Assignment = {c: [] for c in consumers}
    it = itertools.cycle(consumers)
    for p in range(n):
        out[next(it)].append(p)
    return out


KAFKA = {"range": kafka_range, "roundrobin": kafka_roundrobin}

# (members, partitions) -> expected, from Kafka's RangeAssignorTest / RoundRobinAssignorTest
# and the usual worked examples.
TABLES: dict[str, list[tuple[list[str], int, list[list[int]]]]] = {
    "range": [
        (["c1"], 3, [[0, 1, 2]]),
        (["c1", "c2"], 3, [[0, 1], [2]]),
        (["c1", "c2"], 4, [[0, 1], [2, 3]]),
        (["c1", "c2", "c3"], 7, [[0, 1, 2], [3, 4], [5, 6]]),
        (["c1", "c2", "c3"], 2, [[0], [1], []]),
        (["a", "b", "c", "d"], 10, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (["c1", "c2"], 0, [[], []]),
    ],
    "roundrobin": [
        (["c1"], 3, [[0, 1, 2]]),
        (["c1", "c2"], 3, [[0, 2], [1]]),
        (["c1", "c2", "c3"], 7, [[0, 3, 6], [1, 4], [2, 5]]),
        (["c1", "c2", "c3"], 2, [[0], [1], []]),
        (["a", "b", "c", "d"], 10, [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]),
    ],
}


@pytest.mark.parametrize(
    ("strategy", "members", "n", "expected"),
    [(s, m, n, e) for s, rows in TABLES.items() for m, n, e in rows],
)
def test_kafka_tables(strategy: str, members: list[str], n: int, expected: list[list[int]]) -> None:
    want = dict(zip(members, expected, strict=True))
    assert assign(strategy, members, n) == want
    assert assign(strategy, list(reversed(members)), n) == want
    assert KAFKA[strategy](members, n) == want  # the reference agrees with the table


member_ids = st.text(
    st.characters(codec="utf-8") | st.sampled_from("aAz0-_.\uff21\U0001f600"),
    min_size=1, max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(strategy=st.sampled_from(["range", "roundrobin"]),
       members=st.lists(member_ids, min_size=1, max_size=9), n=st.integers(0, 40))
def test_equals_kafka(strategy: str, members: list[str], n: int) -> None:
    assert assign(strategy, members, n) == KAFKA[strategy](members, n)


def test_members_sorted_as_java_strings() -> None:
    """Kafka sorts member ids by String.compareTo: UTF-16 code units, so a character beyond
    U+FFFF (a surrogate pair, 0xD83D...) comes before U+FF21, although Python's code point
    order puts it after."""
    astral, fullwidth = "\U0001f600", "\uff21"
    assert sorted([astral, fullwidth]) == [fullwidth, astral]  # Python's order
    assert assign("range", [fullwidth, astral], 3) == {astral: [0, 1], fullwidth: [2]}
    assert assign("roundrobin", [fullwidth, astral], 3) == {astral: [0, 2], fullwidth: [1]}
    assert java_order(astral) < java_order(fullwidth)
    assert sorted(["b", "a", "B", "é"], key=java_order) == ["B", "a", "b", "é"]


# ------------------------------------------------------------------------ every strategy


def check_complete(a: Mapping[str, Sequence[int]], members: Sequence[str], n: int) -> None:
    """Every member present, each partition exactly once, every member ⌊N/M⌋ or ⌈N/M⌉."""
    assert set(a) == set(members)
    owned = sorted(p for ps in a.values() for p in ps)
    assert owned == list(range(n))
    lo, hi = n // len(a), -(-n // len(a))
    assert all(lo <= len(ps) <= hi for ps in a.values()), a
    assert all(list(ps) == sorted(ps) for ps in a.values())


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(deadline=None)  # a loaded machine is slow, not wrong
@given(members=st.lists(member_ids, min_size=1, max_size=9, unique=True),
       n=st.integers(0, 50), seed=st.integers(0, 2**32))
def test_balanced_complete_deterministic(
    strategy: str, members: list[str], n: int, seed: int,
) -> None:
    a = assign(strategy, members, n)
    check_complete(a, members, n)
    shuffled = members[:]
    random.Random(seed).shuffle(shuffled)
    assert assign(strategy, shuffled, n) == a  # member order irrelevant
    assert assign(strategy, members + members[:2], n) == a  # a repeated member is one
    assert assign(strategy, tuple(members), n) == a


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_zero_members(strategy: str) -> None:
    assert assign(strategy, [], 8) == {}
    assert assign(strategy, (), 0, {"gone": [1, 2]}) == {}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_more_members_than_partitions(strategy: str) -> None:
    members = [f"m{i}" for i in range(7)]
    a = assign(strategy, members, 3)
    check_complete(a, members, 3)
    assert sorted(len(ps) for ps in a.values()) == [0, 0, 0, 0, 1, 1, 1]
    assert assign(strategy, members, 0) == {m: [] for m in members}


def test_unknown_strategy() -> None:
    for members in (["a"], []):
        with pytest.raises(ValueError, match="strategy must be one of sticky, range, "
                                             "roundrobin, not 'cooperative'"):
            assign("cooperative", members, 3)


def test_result_is_fresh() -> None:
    """The caller may change the map it gets: it is not the previous one, nor shared."""
    prev = {"a": [0, 1], "b": [2, 3]}
    a = assign("sticky", ["a", "b"], 4, prev)
    assert a == prev
    a["a"].append(9)
    assert prev == {"a": [0, 1], "b": [2, 3]}
    assert assign("sticky", ["a", "b"], 4, prev) == prev


# ------------------------------------------------------------------------ moved()


def test_moved_counts_changed_owners() -> None:
    before = {"a": [0, 1], "b": [2]}
    assert moved(before, before) == 0
    assert moved({}, {"a": [0, 1, 2]}) == 3  # new to the map: each counts once
    assert moved(before, {"a": [0], "b": [1, 2]}) == 1
    assert moved(before, {"b": [0, 1, 2]}) == 2  # a left
    assert moved(before, {"a": [0, 1], "b": [2], "c": [3]}) == 1  # partition 3 is new


# ------------------------------------------------------------------------ sticky


def fewest_moves(before: Mapping[str, Sequence[int]], members: Sequence[str], n: int) -> int:
    """The lower bound: the fewest partitions that change owner in any balanced complete
    assignment of ``members``, by trying every choice of the members that get ⌈N/M⌉."""
    ms = sorted(set(members))
    owner: dict[int, str] = {}
    for m in sorted(before):  # the first holder of a partition listed twice keeps it
        for p in before[m]:
            if 0 <= p < n:
                owner.setdefault(p, m)
    held = {m: sum(1 for o in owner.values() if o == m) for m in ms}
    per, extra = divmod(n, len(ms))
    best_kept = max(
        sum(min(held[m], per + (m in big)) for m in ms)
        for big in map(set, itertools.combinations(ms, extra))
    )
    return n - best_kept


def test_sticky_keeps_what_it_can() -> None:
    a = assign("sticky", ["a", "b", "c"], 7)
    check_complete(a, ["a", "b", "c"], 7)
    # c leaves: only c's partitions move, to a and b
    b = assign("sticky", ["a", "b"], 7, a)
    check_complete(b, ["a", "b"], 7)
    assert moved(a, b) == len(a["c"])
    assert set(a["a"]) <= set(b["a"]) and set(a["b"]) <= set(b["b"])
    # d joins: it takes ⌊7/3⌋ = 2, nobody else's partitions move
    c = assign("sticky", ["a", "b", "d"], 7, b)
    check_complete(c, ["a", "b", "d"], 7)
    assert moved(b, c) == 2 == len(c["d"])
    assert set(c["a"]) <= set(b["a"]) and set(c["b"]) <= set(b["b"])


def test_sticky_previous_is_not_trusted() -> None:
    """A previous map with dead members, partitions out of range and a partition held twice
    still gives a complete balanced map."""
    prev = {"dead": [0, 1], "a": [2, 3, 3, 99, -1], "b": [3, 4, 5, 6, 7]}
    a = assign("sticky", ["a", "b", "c"], 6, prev)
    check_complete(a, ["a", "b", "c"], 6)
    assert moved(prev, a) == fewest_moves(prev, ["a", "b", "c"], 6)
    assert {2, 3} <= set(a["a"])  # a keeps its two (3 is a's: "a" sorts before "b")


def test_sticky_with_the_same_members_moves_nothing() -> None:
    for n in range(0, 20):
        for m in range(1, 6):
            members = [f"m{i}" for i in range(m)]
            a = assign("sticky", members, n)
            assert assign("sticky", members, n, a) == a
            assert assign("sticky", list(reversed(members)), n, a) == a


names = st.sampled_from([f"m{i}" for i in range(8)])
steps = st.lists(st.tuples(st.booleans(), names), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 40), first=st.lists(names, min_size=1, max_size=4, unique=True),
       ops=steps)
def test_sticky_minimal_movement(n: int, first: list[str], ops: list[tuple[bool, str]]) -> None:
    members = list(first)
    a = assign("sticky", members, n)
    check_complete(a, members, n)
    for join, name in ops:
        if join:
            if name in members:
                continue
            nxt = [*members, name]
        else:
            if name not in members or len(members) == 1:
                continue
            nxt = [m for m in members if m != name]
        b = assign("sticky", nxt, n, a)
        check_complete(b, nxt, n)
        lower = fewest_moves(a, nxt, n)
        assert moved(a, b) == lower, (a, nxt, b)
        if join:
            # a balanced group that one member joins moves just what the newcomer takes,
            # ⌊N/(M+1)⌋ (it is the emptiest, so it gets the smaller quota)
            assert moved(a, b) == len(b[name]) == n // len(nxt)
            assert all(set(b[m]) <= set(a[m]) for m in members)
        else:
            # after a leave only the leaver's partitions move: nobody else's
            assert moved(a, b) == len(a[name])
            assert all(set(a[m]) <= set(b[m]) for m in nxt)
        assert assign("sticky", list(reversed(nxt)), n, a) == b  # deterministic
        a, members = b, nxt
