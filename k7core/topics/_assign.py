"""Partition assignment strategies of a consumer group (sans-I/O: members in, map out).

Every member computes the same map from the same inputs, so any member may write it.
``range`` and ``roundrobin`` are Kafka's RangeAssignor and RoundRobinAssignor for one
topic; ``sticky`` balances as they do (every member gets ⌊N/M⌋ or ⌈N/M⌉ partitions) while
moving as few partitions as possible from the previous assignment. Members are ordered as
Kafka orders member ids, by Java's ``String.compareTo`` (UTF-16 code units: a character
beyond U+FFFF sorts before U+E000 .. U+FFFF, unlike Python's code point order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

STRATEGIES = ("sticky", "range", "roundrobin")
Assignment = dict[str, list[int]]


def assign(
    strategy: str, members: Sequence[str], partitions: int,
    previous: Mapping[str, Sequence[int]] | None = None,
) -> Assignment:
    """The partitions of each member (every member present, possibly with none)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    ms = sorted(set(members), key=java_order)
    if not ms:
        return {}
    if strategy == "range":
        return _range(ms, partitions)
    if strategy == "roundrobin":
        return {m: list(range(i, partitions, len(ms))) for i, m in enumerate(ms)}
    return _sticky(ms, partitions, previous or {})


def java_order(member: str) -> bytes:
    """The sort key that orders strings as Java's ``String.compareTo`` (Kafka's member
    order): their UTF-16 code units, compared as big-endian bytes."""
    return member.encode("utf-16-be", "surrogatepass")


def _range(ms: list[str], n: int) -> Assignment:
    per, extra = divmod(n, len(ms))
    out: Assignment = {}
    start = 0
    for i, m in enumerate(ms):
        size = per + (1 if i < extra else 0)
        out[m] = list(range(start, start + size))
        start += size
    return out


def _sticky(ms: list[str], n: int, previous: Mapping[str, Sequence[int]]) -> Assignment:
    live = set(ms)
    held: dict[str, list[int]] = {m: [] for m in ms}
    taken: set[int] = set()
    for m in sorted(previous, key=java_order):
        if m not in live:
            continue
        for p in previous[m]:
            if 0 <= p < n and p not in taken:
                held[m].append(p)
                taken.add(p)
    per, extra = divmod(n, len(ms))
    # The members holding the most keep the larger quota: fewer partitions move.
    order = sorted(ms, key=lambda m: (-len(held[m]), m))
    quota = {m: per + (1 if i < extra else 0) for i, m in enumerate(order)}
    pool: list[int] = sorted(set(range(n)) - taken)
    for m in ms:
        keep = sorted(held[m])[: quota[m]]
        pool.extend(sorted(held[m])[quota[m]:])
        held[m] = keep
    pool.sort()
    for p in pool:
        m = min((x for x in ms if len(held[x]) < quota[x]), key=lambda x: (len(held[x]), x))
        held[m].append(p)
    return {m: sorted(ps) for m, ps in held.items()}


def moved(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]) -> int:
    """How many partitions changed owner (a partition new to the map counts once; one
    listed twice in ``before`` is its first holder's, as ``assign`` reads a previous map)."""
    owner: dict[int, str] = {}
    for m in sorted(before, key=java_order):
        for p in before[m]:
            owner.setdefault(p, m)
    return sum(1 for m, ps in after.items() for p in ps if owner.get(p) != m)
