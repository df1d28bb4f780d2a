"""Topics: two producer processes publish order and user events through a topic exchange;
a consumer group of two member processes splits the orders topic's partitions.

    python examples/topics.py [DIRECTORY]

The exchange ``events`` routes ``order.*`` to the topic ``orders`` (4 partitions) and
everything (``#``) to the topic ``audit``. Records are keyed by customer, so each
customer's orders stay in one partition, in order. Without DIRECTORY everything goes to a
temporary directory, removed at the end.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from collections import Counter
from multiprocessing.synchronize import Barrier
from pathlib import Path

from k7core.topics import Exchange, Topic

PRODUCERS = 2
PER_PRODUCER = 5_000
KINDS = ("order.created", "order.paid", "user.signup")


def produce(root: str, producer: int) -> int:
    """One producer process: publish through the exchange (its bindings are on disk)."""
    with Exchange(Path(root) / "events") as events:
        for i in range(PER_PRODUCER):
            kind = KINDS[i % len(KINDS)]
            customer = f"customer-{(producer * 7 + i) % 50}"
            events.publish(f"{producer}:{i}:{kind}", kind, key=customer,
                           headers={"producer": str(producer)})
    return producer


Result = tuple[str, dict[int, int]]


def consume(root: str, member: str, ready: Barrier, out: multiprocessing.Queue[Result]) -> None:
    """One member of group "billing": poll and ack until the group has read everything."""
    seen: Counter[int] = Counter()
    last: dict[tuple[bytes | None, str], int] = {}
    with Topic(Path(root) / "orders", readonly=True) as orders, \
            orders.consumer("billing", member, strategy="range") as me:
        ready.wait()  # both members are in
        me.beat()  # apply the newest generation now (poll does it every heartbeat)
        while True:
            batch = me.poll(max_records=500, timeout=0.2)
            for r in batch:
                producer, i, _ = r.value.decode().split(":")
                # each producer's records of one customer arrive in the order it sent them
                assert int(i) > last.get((r.key, producer), -1), "per-customer order"
                last[(r.key, producer)] = int(i)
                seen[r.partition] += 1
            me.ack_many(batch)
            if not batch:
                group = me.stats().topic_group
                if group is not None and group.lag_bytes == 0:
                    break
        out.put((member, dict(sorted(seen.items()))))


def main(root: Path) -> None:
    Topic(root / "orders", partitions=4).close()
    Topic(root / "audit", partitions=2).close()
    with Exchange(root / "events", "topic") as events:
        events.bind(root / "orders", "order.*")
        events.bind(root / "audit", "#")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PRODUCERS) as pool:
        pool.starmap(produce, [(str(root), p) for p in range(PRODUCERS)])
    total = PRODUCERS * PER_PRODUCER
    orders = sum(1 for i in range(PER_PRODUCER) if KINDS[i % 3].startswith("order.")) * PRODUCERS
    print(f"published {total} events through the exchange; {orders} of them are orders")

    ready = ctx.Barrier(2)
    results: multiprocessing.Queue[Result] = ctx.Queue()
    members = [ctx.Process(target=consume, args=(str(root), m, ready, results))
               for m in ("member-a", "member-b")]
    for p in members:
        p.start()
    got = [results.get(timeout=120) for _ in members]
    for p in members:
        p.join()
    read = 0
    for member, per_partition in sorted(got):
        print(f"{member} read partitions {per_partition}")
        read += sum(per_partition.values())
    print(f"group billing read {read} orders")
    assert read == orders
    with Topic(root / "audit", readonly=True) as audit:
        print(f"audit holds {sum(1 for p in range(2) for _ in audit.records(p))} events")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
