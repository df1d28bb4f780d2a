"""Consumer groups whose members are processes: joins, leaves and SIGKILLs while records
flow; every record acked exactly once per group, none skipped, per-key order kept."""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from k7core.topics import Topic
from tests._childproc import Child

CHILDREN = "tests.k7core.topics._group_children"
SEG = 1 << 20


def consumer(
    stack: ExitStack, topic: Path, group: str, member: str, log: Path, strategy: str = "sticky"
) -> Child:
    c = stack.enter_context(
        Child("consume", str(topic), group, member, str(log), strategy, program=CHILDREN)
    )
    assert c.line() == b"joined"
    return c


def producer(stack: ExitStack, topic: Path, name: str, count: int, pause: float) -> Child:
    return stack.enter_context(
        Child("produce", str(topic), name, str(count), str(pause), program=CHILDREN)
    )


def settled(topic: Topic, group: str, alive: set[str]) -> bool:
    """The group's newest generation names exactly ``alive``, and every partition is held
    (its cursor lock) by the member it is assigned to."""
    g = next((g for g in topic.stats().groups if g.name == group), None)
    return (
        g is not None and set(g.members) == alive
        and all(p.owned and p.owner in alive and p.holder == p.owner for p in g.partitions)
    )


def wait_for(cond: object, what: str, limit: float = 30.0) -> float:
    """Poll ``cond()`` (file-system state: no event to wait on) until true; return the
    seconds it took. Fails after ``limit``."""
    assert callable(cond)
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > limit:
            raise AssertionError(f"not within {limit} s: {what}")
        time.sleep(0.01)
    return time.monotonic() - start


def drained(topic: Topic, group: str) -> bool:
    g = next((g for g in topic.stats().groups if g.name == group), None)
    return g is not None and all(p.lag_bytes == 0 for p in g.partitions)


def parse_log(log: Path) -> Iterator[tuple[str, int, int, str]]:
    if not log.exists():
        return
    for line in log.read_text().splitlines():
        parts = line.split(" ")
        yield parts[0], int(parts[1]), int(parts[2]), parts[3] if len(parts) > 3 else ""


def check_exactly_once(topic: Topic, logs: dict[str, Path], killed: set[str]) -> int:
    """Every record of every partition acked once (a killed member's last unconfirmed try
    may be the one ack of a record that nobody else acked); each member acked each key's
    records in the order they were sent. Return the number of records."""
    confirmed: dict[tuple[int, int], list[str]] = defaultdict(list)
    unconfirmed: dict[str, set[tuple[int, int]]] = {}
    for member, log in logs.items():
        tried: set[tuple[int, int]] = set()
        last_seq: dict[str, int] = {}
        for kind, p, off, value in parse_log(log):
            if kind == "try":
                tried.add((p, off))
            elif kind == "ack":
                tried.discard((p, off))
                confirmed[(p, off)].append(member)
                name, seq = value.split(":")
                key = f"{name}-k{int(seq) % 20}"
                assert int(seq) > last_seq.get(key, -1), f"{member} acked {key} out of order"
                last_seq[key] = int(seq)
            else:
                tried.discard((p, off))
        unconfirmed[member] = tried
    total = 0
    for p in range(topic.partitions):
        for r in topic.records(p):
            total += 1
            who = confirmed.get((p, r.offset), [])
            assert len(who) <= 1, f"record {p}/{r.offset} acked by {who}"
            if not who:
                guess = [m for m in killed if (p, r.offset) in unconfirmed[m]]
                assert guess, f"record {p}/{r.offset} was never acked"
    for m in set(logs) - killed:
        assert not unconfirmed[m], f"{m} left tries unconfirmed: {unconfirmed[m]}"
    return total


@pytest.mark.timeout(300)
def test_members_join_leave_and_die_while_records_flow(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    path = tmp_path / "t"
    logs = {m: tmp_path / f"{m}.log" for m in ("a", "b", "c", "d")}
    with Topic(path, partitions=6, segment_size=SEG) as topic, ExitStack() as stack:
        # 2 x 3000 records over ~3 s: they flow through every change below
        producers = [producer(stack, path, f"p{i}", 3000, 0.05) for i in range(2)]
        a = consumer(stack, path, "g", "a", logs["a"])
        b = consumer(stack, path, "g", "b", logs["b"])
        wait_for(lambda: settled(topic, "g", {"a", "b"}), "a and b share the partitions")
        c = consumer(stack, path, "g", "c", logs["c"])
        joined = wait_for(lambda: settled(topic, "g", {"a", "b", "c"}), "c takes its share")
        b.kill_and_drain()
        died = wait_for(lambda: settled(topic, "g", {"a", "c"}), "b's partitions move")
        assert any(p.proc.poll() is None for p in producers), "records flow through the kill"
        c.send("quit")
        assert c.line() == b"left"
        left = wait_for(lambda: settled(topic, "g", {"a"}), "c's partitions move to a")
        d = consumer(stack, path, "g", "d", logs["d"])
        wait_for(lambda: settled(topic, "g", {"a", "d"}), "d takes its share")
        for p in producers:
            assert p.line() == b"done"
            p.wait()
        wait_for(lambda: drained(topic, "g"), "every record acked", limit=120)
        for m in (a, d):
            m.send("quit")
            assert m.line() == b"left"
        total = check_exactly_once(topic, logs, killed={"b"})
        assert total == 6000
        g = topic.stats().groups[0]
        assert g.members == () and all(not p.owned for p in g.partitions)
    record_property("rebalance_seconds", f"join {joined:.3f} kill {died:.3f} leave {left:.3f}")
    # about a second each (heartbeat 0.1 s); generous bounds for a loaded machine
    assert max(joined, died, left) < 5.0, (joined, died, left)


@pytest.mark.timeout(300)
def test_random_member_kills_while_records_flow(tmp_path: Path) -> None:
    """Three members at a time; one chosen at random is SIGKILLed and replaced, five times,
    while two producers send. ``K7_TOPICS_SEED`` picks the victims."""
    rng = random.Random(int(os.environ.get("K7_TOPICS_SEED", "7")))
    path = tmp_path / "t"
    logs: dict[str, Path] = {}
    killed: set[str] = set()
    with Topic(path, partitions=5, segment_size=SEG) as topic, ExitStack() as stack:
        producers = [producer(stack, path, f"p{i}", 3000, 0.05) for i in range(2)]
        live: dict[str, Child] = {}
        for n in range(3):
            name = f"m{n}"
            logs[name] = tmp_path / f"{name}.log"
            live[name] = consumer(stack, path, "g", name, logs[name], "roundrobin")
        for k in range(5):
            wait_for(lambda: settled(topic, "g", set(live)), f"settled before kill {k}")
            victim = rng.choice(sorted(live))
            live.pop(victim).kill_and_drain()
            killed.add(victim)
            name = f"m{3 + k}"
            logs[name] = tmp_path / f"{name}.log"
            live[name] = consumer(stack, path, "g", name, logs[name], "roundrobin")
        for p in producers:
            assert p.line() == b"done"
            p.wait()
        wait_for(lambda: drained(topic, "g"), "every record acked", limit=120)
        for c in live.values():
            c.send("quit")
            assert c.line() == b"left"
        assert check_exactly_once(topic, logs, killed) == 6000
