"""Topics (issue 18): ``k7core.topics.Topic`` end to end in TitanMQ's shape, against Redis
Streams doing the same work from Python, side by side in the same run; and the routing cost
of each exchange kind.

Every case names itself ``topics ...`` (``python -m benchmarks --only topics``).

End to end (:func:`pair_name`): 4 producer processes send 1 KiB values with string keys
(``key-{i % 10000}``, ``i`` the record's number) to one 8-partition topic, then a consumer
group of 2 member processes polls and acks every record. Each process is a child
(``sys.executable -c``, :data:`CHILD`): it opens what it needs and builds its records,
prints ``ready``, waits for ``go`` on stdin, works, prints its own count and seconds. The
parent times each phase from the first ``go`` to the last child's report: producers msg/s =
the records / that time, consumers msg/s likewise, end to end = the records / (producers'
time + consumers' time); MB/s counts the values' bytes (10**6 bytes a MB). The phases run
one after the other (the consumers start on a full topic). Between the phases the parent
counts what the topic (or the streams) hold and fails the run on a difference; after the
consumers it checks that every record is acked.

- k7: ``Topic(path, partitions=8, fsync=..., segment_size=64 MiB)``, each producer
  ``send_many`` of :data:`BATCH` ``ProducerRecord(value, key)``; each consumer
  ``topic.consumer("bench", member)`` on a ``readonly`` Topic, ``poll(BATCH, 1.0)`` then
  ``ack_many`` of what it got (``cursor_fsync`` as the topic's ``fsync``). The members join
  and the group settles (every member holds what it is assigned) before ``go``.
- Redis Streams on a local ``redis-server`` (``_workers.Redis``: a child on a free port,
  ``--save ""``, ``appendonly yes``, its files under the case's directory; then ``CONFIG SET
  appendfsync`` everysec or always), redis-py: 8 streams ``topic:0`` .. ``topic:7`` as
  partitions, a key's stream chosen by Kafka's partitioner (``kafka_murmur2``, as the
  topic's); each producer a ``pipeline(transaction=False)`` of :data:`BATCH` ``XADD``
  (fields ``key`` and ``value``) per round trip; the group ``bench`` created at id 0 after
  the producers; consumer ``i`` reads the streams ``p % 2 == i`` (as the topic's group
  assigns 4 partitions to each), ``XREADGROUP COUNT BATCH/4`` over its 4 streams, the
  ``XACK`` of the previous batch pipelined with the next read (one round trip a batch).
  Before each run: ``FLUSHALL`` and ``BGREWRITEAOF`` (waited for), so each run starts from
  an empty data set and a small AOF (Redis's automatic AOF rewrite is left at its default).

The pairs, k7 and Redis in turn in each run (which goes first alternates), with the ratios
k7 / Redis of producers, consumers and end to end: ``"async"`` against ``appendfsync
everysec`` (both: on the OS's pages when the call returns, written to disk in the
background) and ``"sync"`` against ``always`` (both: on disk before the call returns), with
fewer records (:attr:`Sizes.sync_records`). ``os.sync()`` before each leg (not timed), so a
leg does not pay for the last one's writeback. Without redis-server or redis-py (or with
``--no-peers``) the k7 legs run alone and the Redis legs are skipped with the reason.

``topics k7 [async] send, ...``: the same 4 producers with one ``send(value, key)`` per
record (producers only).

Routing (``topics routing <kind>``): ``Router.route`` (``k7core.topics._routing``) per
record, on one thread, over 1,000 prepared (routing key, headers) pairs in turn; msg/s and
µs a record.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from k7core.topics import Binding, Exchange, Router, Topic

from ._harness import Case, Run, Samples, Skipped
from ._jobs import FSYNC_PER_PUT, OS_BUFFERED
from ._scenarios import child_process

PRODUCERS = 4
PARTITIONS = 8
CONSUMERS = 2
BATCH = 1000  # records per send_many, per XADD pipeline, per poll and XREADGROUP
VALUE_SIZE = 1024
KEYS = 10_000  # distinct keys: key-0 .. key-9999
SEGMENT = 64 << 20
GROUP = "bench"
STREAM = "topic:{}"  # Redis stream of partition p
REDIS_FSYNC = {"async": "everysec", "sync": "always"}  # the pairs: k7 fsync -> appendfsync
_runs = itertools.count()  # fresh directory names


@dataclass(frozen=True)
class Sizes:
    records: int  # records per run (all producers), "async" and the Redis everysec leg
    sync_records: int  # records per run, "sync" and the Redis always leg
    send_records: int  # records per run, the per-record send case
    routes: int  # Router.route calls per run and routing case
    publish: int  # records per run and leg, Exchange.publish against Topic.send


QUICK = Sizes(records=20_000, sync_records=4_000, send_records=20_000, routes=20_000,
              publish=5_000)
FULL = Sizes(records=1_000_000, sync_records=250_000, send_records=1_000_000, routes=500_000,
             publish=200_000)


# ---------------------------------------------------------------------- the children

# One child: argv[1] = a JSON object of arguments; "kind" says which. Producers print
# "ready", wait for "go", send, print {"count", "seconds"}. Consumers print "joined", wait
# for "settle", wait until the group is stable, print {"generation", "assigned"}, wait for
# "go COUNTS" (the records per partition, a JSON list), read and ack until they have every
# record of their partitions, print {"count", "seconds"}, then wait for their stdin to close
# before they leave the group (a member leaving would rebalance the others mid-run).
CHILD = r"""
import gc, json, resource, sys, time
a = json.loads(sys.argv[1])
kind, batch, n, first = a["kind"], a["batch"], a.get("n", 0), a.get("first", 0)
value = b"v" * a["value_size"]
keys = ["key-%d" % (i % a["keys"]) for i in range(first, first + n)]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return r.ru_utime + r.ru_stime

def say(obj):
    print(json.dumps(obj), flush=True)

def hear(word):
    line = sys.stdin.readline()
    if not line.startswith(word):
        sys.exit("expected %r, got %r" % (word, line))
    return line[len(word):].strip()

def chunks(seq):
    return [seq[i:i + batch] for i in range(0, len(seq), batch)]

def consume(settle, expect, step, close):
    say({"joined": True})
    hear("settle")
    settled = settle()
    gc.freeze()
    say(settled)
    counts = json.loads(hear("go"))
    expected = expect(counts)
    t0, c0 = time.perf_counter(), cpu()
    got, last = 0, t0
    while got < expected:
        k = step()
        if k:
            got, last = got + k, time.perf_counter()
        elif time.perf_counter() - last > 60:
            sys.exit("no record for 60 s: %d of %d" % (got, expected))
    seconds = time.perf_counter() - t0
    say({"count": got, "seconds": seconds, "cpu": cpu() - c0})
    sys.stdin.read()
    close()

if kind == "k7-produce":
    from k7core.topics import ProducerRecord, Topic
    topic = Topic(a["path"], partitions=a["partitions"], fsync=a["fsync"],
                  segment_size=a["segment"])
    if batch == 1:
        send = topic.send
        def loop():
            for key in keys:
                send(value, key)
    else:
        send_many = topic.send_many
        todo = chunks([ProducerRecord(value, key) for key in keys])
        def loop():
            for records in todo:
                send_many(records)
    close = topic.close
elif kind == "redis-produce":
    import redis
    from k7core.topics import kafka_murmur2
    client = redis.Redis(port=a["port"])
    streams, parts = [a["stream"].format(p) for p in range(a["partitions"])], a["partitions"]
    todo = chunks([(key, {"key": key, "value": value}) for key in keys])
    pipe = client.pipeline(transaction=False)
    def loop():
        xadd, execute = pipe.xadd, pipe.execute
        for records in todo:
            for key, fields in records:
                xadd(streams[(kafka_murmur2(key.encode()) & 0x7FFFFFFF) % parts], fields)
            execute()
    close = client.close
elif kind == "k7-consume":
    from k7core.topics import Topic
    topic = Topic(a["path"], readonly=True)
    member = topic.consumer(a["group"], a["member"], cursor_fsync=a["fsync"])
    def settle():
        while True:
            member.beat()
            st = member.stats()
            if (len(st.members) == a["members"] and sorted(st.assigned) == sorted(st.held)
                    and not st.revoking):
                return {"generation": st.generation, "assigned": sorted(st.assigned)}
            time.sleep(0.005)
    poll, ack_many = member.poll, member.ack_many
    def step():
        records = poll(batch, 1.0)
        if records:
            ack_many(records)
        return len(records)
    def close():
        member.close()
        topic.close()
    consume(settle, lambda counts: sum(counts[p] for p in member.assignment), step,
            close)
    sys.exit(0)
elif kind == "redis-consume":
    import redis
    client = redis.Redis(port=a["port"])
    mine = [a["stream"].format(p) for p in a["partitions"]]
    pipe = client.pipeline(transaction=False)
    want = {s: ">" for s in mine}
    count = max(1, batch // len(mine))
    acks = []
    def step():
        for stream, ids in acks:
            pipe.xack(stream, a["group"], *ids)
        pipe.xreadgroup(a["group"], a["member"], want, count=count)
        reply = pipe.execute()[-1] or []
        acks[:] = [(stream, [e[0] for e in entries]) for stream, entries in reply if entries]
        return sum(len(ids) for _, ids in acks)
    def close():
        for stream, ids in acks:
            pipe.xack(stream, a["group"], *ids)
        pipe.execute()
        client.close()
    consume(lambda: {"assigned": a["partitions"]},
            lambda counts: sum(counts[p] for p in a["partitions"]), step, close)
    sys.exit(0)
else:
    sys.exit("unknown child kind %r" % kind)
gc.freeze()  # the prepared records: no collection walks them
say({"ready": True})
hear("go")
t0, c0 = time.perf_counter(), cpu()
loop()
seconds = time.perf_counter() - t0
say({"count": n, "seconds": seconds, "cpu": cpu() - c0})
close()
"""


@dataclass(frozen=True)
class Phase:
    count: int  # records the children handled
    wall: float  # seconds from the first "go" to the last child's report
    ready: list[dict[str, Any]]  # each child's "ready" (consumers: "settled") line
    cpu: float  # CPU seconds of the children in their timed loops (every thread)
    server_cpu: float  # CPU seconds of the server over the phase (Redis; 0 for k7)


def _say(child: Any, line: str) -> None:
    child.stdin.write(line.encode() + b"\n")
    child.stdin.flush()


def _hear(child: Any, what: str) -> dict[str, Any]:
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"a topics benchmark child exited before its {what}")
    out: dict[str, Any] = json.loads(line)
    return out


def run_children(args: Sequence[dict[str, Any]], go: str = "", settle: bool = False,
                 server_cpu: Callable[[], float] | None = None) -> Phase:
    """One child (:data:`CHILD`) per ``args``, started together: each gets ready (consumers
    join, then settle once all have joined); then all get ``go`` (with ``go`` after it);
    the clock runs from the first ``go`` to the last child's report. The children's stdin
    closes after every report. ``server_cpu`` (the server's CPU seconds so far) is read
    before the first ``go`` and after the last report."""
    common = {"value_size": VALUE_SIZE, "keys": KEYS, "batch": BATCH, "stream": STREAM,
              "group": GROUP}
    with ExitStack() as stack:
        children = [stack.enter_context(child_process(CHILD, json.dumps({**common, **a})))
                    for a in args]
        if settle:
            for child in children:
                _hear(child, "join")
            for child in children:
                _say(child, "settle")
        ready = [_hear(child, "ready line") for child in children]
        s0 = server_cpu() if server_cpu is not None else 0.0
        t0 = time.perf_counter()
        for child in children:
            _say(child, f"go {go}".rstrip())
        reports = [_hear(child, "report") for child in children]
        wall = time.perf_counter() - t0
        s1 = server_cpu() if server_cpu is not None else 0.0
    return Phase(sum(int(r["count"]) for r in reports), wall, ready,
                 sum(float(r["cpu"]) for r in reports), s1 - s0)


def _split(total: int) -> list[tuple[int, int]]:
    """(first record, records) of each producer: ``total`` in PRODUCERS blocks."""
    per, extra = divmod(total, PRODUCERS)
    out, first = [], 0
    for j in range(PRODUCERS):
        n = per + (j < extra)
        out.append((first, n))
        first += n
    return out


@dataclass(frozen=True)
class Leg:
    """One side of a pair, one run: producers, then consumers (None: producers only)."""

    produced: Phase
    consumed: Phase | None
    server: bool = False  # a server process did part of the work (Redis)

    def samples(self, prefix: str) -> Samples:
        n, mb = self.produced.count, self.produced.count * VALUE_SIZE / 1e6
        out = {f"{prefix} producers": ("msg/s", n / self.produced.wall),
               f"{prefix} producers MB/s": ("MB/s", mb / self.produced.wall)}
        out |= self._cpu(prefix, "producers", self.produced)
        if self.consumed is not None:
            c = self.consumed
            out |= {f"{prefix} consumers": ("msg/s", n / c.wall),
                    f"{prefix} consumers MB/s": ("MB/s", mb / c.wall),
                    f"{prefix} end to end": ("msg/s", n / (self.produced.wall + c.wall))}
            out |= self._cpu(prefix, "consumers", c)
        return out

    def _cpu(self, prefix: str, who: str, phase: Phase) -> Samples:
        """CPU microseconds a record: every process of the phase (the clients, and the
        server if any), and the server's part alone."""
        out = {f"{prefix} {who} CPU per record": (
            "us", (phase.cpu + phase.server_cpu) / phase.count * 1e6)}
        if self.server:
            out[f"{prefix} {who} server CPU per record"] = (
                "us", phase.server_cpu / phase.count * 1e6)
        return out


def _check_group(ready: list[dict[str, Any]], who: str) -> None:
    """The members settled on one generation and split the partitions between them."""
    parts = sorted(p for r in ready for p in r["assigned"])
    if parts != list(range(PARTITIONS)):
        raise RuntimeError(f"{who}: the members' partitions are {parts}")
    if len({r.get("generation") for r in ready}) != 1:
        raise RuntimeError(f"{who}: the members settled on different generations: {ready}")


# ---------------------------------------------------------------------- k7


def k7_leg(root: Path, fsync: str, total: int, batch: int = BATCH,
           consumers: bool = True) -> Leg:
    """One k7 run in a fresh directory under ``root`` (removed after)."""
    path = root / f"topic-{next(_runs)}"
    try:
        Topic(path, partitions=PARTITIONS, fsync=fsync, segment_size=SEGMENT).close()
        produced = run_children([
            {"kind": "k7-produce", "path": str(path), "partitions": PARTITIONS,
             "fsync": fsync, "segment": SEGMENT, "first": first, "n": n, "batch": batch}
            for first, n in _split(total)])
        with Topic(path, readonly=True) as topic:
            counts = []
            for p in range(PARTITIONS):
                q = topic.partition(p)
                counts.append(q.count_messages(q.earliest(), q.end))
        if None in counts or sum(c or 0 for c in counts) != produced.count:
            raise RuntimeError(f"the topic holds {counts} records, the producers sent "
                               f"{produced.count}")
        if not consumers:
            return Leg(produced, None)
        consumed = run_children([
            {"kind": "k7-consume", "path": str(path), "member": f"m{i}",
             "members": CONSUMERS, "fsync": fsync} for i in range(CONSUMERS)],
            go=json.dumps(counts), settle=True)
        _check_group(consumed.ready, "k7")
        with Topic(path, readonly=True) as topic:
            groups = topic.stats().groups
        lag = [g.lag_bytes for g in groups if g.name == GROUP]
        if consumed.count != produced.count or lag != [0]:
            raise RuntimeError(f"the consumers got {consumed.count} of {produced.count} "
                               f"records; the group's lag is {lag} bytes")
        return Leg(produced, consumed)
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------- Redis Streams


def redis_missing() -> str | None:
    """Why the Redis legs cannot run here, or None."""
    if importlib.util.find_spec("redis") is None:
        return "redis-py not installed; pip install '.[bench]'"
    if shutil.which("redis-server") is None:
        return "redis-server not on the PATH (apt-get install redis-server)"
    return None


class RedisStreams:
    """``_workers.Redis`` (a ``redis-server`` child, ``appendonly yes``, ``--save ""``) with
    ``appendfsync`` set to ``appendfsync``; :meth:`close` stops it."""

    def __init__(self, directory: Path, appendfsync: str) -> None:
        from ._workers import Redis

        self._server = Redis(directory)
        self.port = self._server.port
        # redis-py types every reply as a sync/async union: Any here
        self.client: Any = cast(Any, self._server.client)
        try:
            self.client.config_set("appendfsync", appendfsync)
            if self.client.config_get("appendfsync").get("appendfsync") != appendfsync:
                raise RuntimeError(f"redis-server did not take appendfsync {appendfsync}")
        except BaseException:
            self.close()
            raise

    def reset(self) -> None:
        """Empty the data set and rewrite the AOF (small again), waiting for the rewrite."""
        self.client.flushall()
        self._wait_rewrite()
        self.client.bgrewriteaof()
        self._wait_rewrite()

    def _wait_rewrite(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            info = self.client.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server: the AOF rewrite takes over 120 s")
            time.sleep(0.01)

    def cpu(self) -> float:
        """CPU seconds of redis-server so far, and of its children (AOF rewrites)."""
        info = self.client.info("cpu")
        return float(sum(info[k] for k in ("used_cpu_sys", "used_cpu_user",
                                            "used_cpu_sys_children", "used_cpu_user_children")))

    def close(self) -> None:
        self._server.close()


def redis_leg(server: RedisStreams, total: int) -> Leg:
    """One Redis Streams run on an emptied server."""
    server.reset()
    produced = run_children([
        {"kind": "redis-produce", "port": server.port, "partitions": PARTITIONS,
         "first": first, "n": n} for first, n in _split(total)], server_cpu=server.cpu)
    client = server.client
    streams = [STREAM.format(p) for p in range(PARTITIONS)]
    counts = [int(client.xlen(s)) for s in streams]
    if sum(counts) != produced.count:
        raise RuntimeError(f"the streams hold {counts} entries, the producers sent "
                           f"{produced.count}")
    for s in streams:
        client.xgroup_create(s, GROUP, id="0")
    consumed = run_children([
        {"kind": "redis-consume", "port": server.port, "member": f"m{i}",
         "partitions": [p for p in range(PARTITIONS) if p % CONSUMERS == i]}
        for i in range(CONSUMERS)], go=json.dumps(counts), settle=True, server_cpu=server.cpu)
    _check_group([{**r, "generation": 0} for r in consumed.ready], "Redis")
    pending = [int(client.xpending(s, GROUP)["pending"]) for s in streams]
    if consumed.count != produced.count or any(pending):
        raise RuntimeError(f"the consumers got {consumed.count} of {produced.count} entries; "
                           f"pending per stream: {pending}")
    return Leg(produced, consumed, server=True)


# ---------------------------------------------------------------------- cases


def k7_name(fsync: str) -> str:
    """The k7 end-to-end case alone (no Redis to compare with)."""
    return (f"topics k7 [{fsync}], {PRODUCERS} producers, {PARTITIONS} partitions, "
            f"send_many({BATCH}), {CONSUMERS} consumers")


def pair_name(fsync: str) -> str:
    """The pair of k7 ``fsync`` and Redis Streams with its ``appendfsync``; records add
    `` k7 ...``, `` redis ...`` and `` k7/redis ...`` (``producers``, ``consumers``,
    ``end to end``, and ``producers MB/s``, ``consumers MB/s``)."""
    return (f"topics k7 [{fsync}] vs Redis Streams [{REDIS_FSYNC[fsync]}], {PRODUCERS} "
            f"producers, {PARTITIONS} partitions, batches of {BATCH}, {CONSUMERS} consumers")


def redis_name(fsync: str) -> str:
    """What is skipped when the Redis leg cannot run."""
    return f"topics Redis Streams [{REDIS_FSYNC[fsync]}] (against k7 [{fsync}])"


SEND_CASE = f"topics k7 [async] send, {PRODUCERS} producers, {PARTITIONS} partitions"


def _params(fsync: str, records: int, **extra: Any) -> dict[str, Any]:
    return {"payload": VALUE_SIZE, "records": records, "producers": PRODUCERS,
            "partitions": PARTITIONS, **extra,
            "durability": OS_BUFFERED if fsync == "async" else FSYNC_PER_PUT}


def _pair_case(fsync: str, records: int) -> Case:
    name = pair_name(fsync)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        server = RedisStreams(root / "redis", REDIS_FSYNC[fsync])
        turns = itertools.count()
        try:
            def run() -> Samples:
                order = ["k7", "redis"][::1 if next(turns) % 2 else -1]
                legs: dict[str, Leg] = {}
                for side in order:
                    os.sync()
                    legs[side] = (k7_leg(root, fsync, records) if side == "k7"
                                  else redis_leg(server, records))
                k7, redis = legs["k7"].samples(f"{name} k7"), legs["redis"].samples(
                    f"{name} redis")
                ratios = {f"{name} k7/redis {what}": (
                    "x", k7[f"{name} k7 {what}"][1] / redis[f"{name} redis {what}"][1])
                    for what in ("producers", "consumers", "end to end")}
                return k7 | redis | ratios

            yield run
        finally:
            server.close()

    return Case(name, "k7", setup, _params(
        fsync, records, consumers=CONSUMERS, batch=BATCH, segment_MiB=SEGMENT >> 20,
        setting=f'Topic(fsync="{fsync}"), send_many({BATCH}), poll({BATCH}) + ack_many; '
        f"redis-server appendfsync {REDIS_FSYNC[fsync]}, pipelined XADD x {BATCH}, "
        f"XREADGROUP COUNT {BATCH // (PARTITIONS // CONSUMERS)} x "
        f"{PARTITIONS // CONSUMERS} streams + XACK; k7 and Redis in turn"))


def _k7_case(fsync: str, records: int) -> Case:
    name = k7_name(fsync)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        def run() -> Samples:
            os.sync()
            return k7_leg(root, fsync, records).samples(name)

        yield run

    return Case(name, "k7", setup, _params(
        fsync, records, consumers=CONSUMERS, batch=BATCH, segment_MiB=SEGMENT >> 20,
        setting=f'Topic(fsync="{fsync}"), send_many({BATCH}), poll({BATCH}) + ack_many'))


def _send_case(records: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        def run() -> Samples:
            os.sync()
            return k7_leg(root, "async", records, batch=1, consumers=False).samples(
                SEND_CASE)

        yield run

    return Case(SEND_CASE, "k7", setup, _params(
        "async", records, segment_MiB=SEGMENT >> 20,
        setting='Topic(fsync="async"), one send(value, key) per record; producers only'))


# ---------------------------------------------------------------------- routing

PUBLISH_CASE = (f"topics exchange publish [async], direct, 1 binding, into 1 topic of "
                f"{PARTITIONS} partitions")


def _publish_leg(root: Path, n: int, through_exchange: bool) -> float:
    """msg/s of ``n`` records sent to a new topic in this process, one ``publish`` (or one
    ``send``) a record; the first record, which opens the topic, is not timed."""
    path = root / f"publish-{next(_runs)}"
    try:
        topic_path = path / "topic"
        Topic(topic_path, partitions=PARTITIONS).close()
        keys = [f"key-{i % KEYS}" for i in range(n)]
        value = b"v" * VALUE_SIZE
        exchange: Any = None
        if through_exchange:
            exchange = Exchange(path / "exchange", "direct", fsync="async")
            exchange.bind(topic_path, "orders")
            publish = exchange.publish
            publish(value, "orders", key="first")
            t0 = time.perf_counter()
            for key in keys:
                publish(value, "orders", key=key)
            seconds = time.perf_counter() - t0
            exchange.close()
        else:
            with Topic(topic_path, fsync="async") as topic:
                send = topic.send
                send(value, "first")
                t0 = time.perf_counter()
                for key in keys:
                    send(value, key)
                seconds = time.perf_counter() - t0
        with Topic(topic_path, readonly=True) as topic:
            stored = 0
            for p in range(PARTITIONS):
                q = topic.partition(p)
                stored += q.count_messages(q.earliest(), q.end) or 0
        if stored != n + 1:
            raise RuntimeError(f"the topic holds {stored} records, {n + 1} were sent")
        return n / seconds
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _publish_case(n: int) -> Case:
    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        turns = itertools.count()

        def run() -> Samples:
            got: dict[bool, float] = {}
            for through in [True, False][::1 if next(turns) % 2 else -1]:
                os.sync()
                got[through] = _publish_leg(root, n, through)
            return {f"{PUBLISH_CASE} publish": ("msg/s", got[True]),
                    f"{PUBLISH_CASE} Topic.send": ("msg/s", got[False]),
                    f"{PUBLISH_CASE} publish/send": ("x", got[True] / got[False])}

        yield run

    return Case(PUBLISH_CASE, "k7", setup, _params(
        "async", n, producers=1,
        setting='Exchange(path, "direct", fsync="async"), bind(topic, "orders"), publish('
        'value, "orders", key=key) per record, one process; against Topic(fsync="async")'
        ".send(value, key) in the same run, in turn"))



ROUTE_SET = 1000  # prepared (routing key, headers) pairs, used in turn


@dataclass(frozen=True)
class RouteSpec:
    name: str
    kind: str
    bindings: Sequence[tuple[str, str, tuple[tuple[str, str], ...], str]]  # dest, key, x-match
    record: Callable[[int], tuple[str, dict[str, str] | None]]  # i -> (routing key, headers)
    note: str
    distinct: bool = False  # every record its own routing key (else ROUTE_SET in turn)


def routing_specs() -> list[RouteSpec]:
    """The routing cases' bindings and records (what each matches is in its note)."""
    regions = [f"r{i}" for i in range(10)]
    events = ["created", "updated", "deleted", "shipped"]
    direct = RouteSpec(
        "direct", "direct",
        [(f"q{i}", f"orders.{r}", (), "all") for i, r in enumerate(regions)],
        lambda i: (f"orders.{regions[i % 10]}", None),
        "10 bindings, keys orders.r0 .. orders.r9; every record matches one")

    def topic(n: int, distinct: bool) -> RouteSpec:
        shapes = ["orders.{w}.*", "*.{w}.created", "orders.#.{w}", "#.{w}.#", "{w}.#"]
        words = [f"w{i}" for i in range(n)]
        bindings = [(f"q{i}", shapes[i % len(shapes)].format(w=words[i]), (), "all")
                    for i in range(n)]
        shape = (f"{n} patterns of 5 shapes (orders.W.*, *.W.created, orders.#.W, #.W.#, "
                 "W.#) over words w0 ..; ")
        if distinct:
            return RouteSpec(
                f"topic, {n} bindings, distinct keys", "topic", bindings,
                lambda i: (f"orders.{words[i % n]}.e{i}", None),
                shape + "keys orders.W.eI, each record its own (the Router's cache of "
                "routing keys never hits: the trie's cost)", distinct=True)
        return RouteSpec(
            f"topic, {n} bindings", "topic", bindings,
            lambda i: (f"orders.{words[i % n]}.{events[i % 4]}", None),
            shape + f"keys orders.W.EVENT, {n * 4 // math.gcd(n, 4)} distinct ones in turn "
            "(answered from the Router's cache of routing keys)")

    fanout = RouteSpec(
        "fanout", "fanout", [(f"q{i}", "", (), "all") for i in range(10)],
        lambda i: ("orders.r0", None), "10 bindings; every record goes to all 10")
    headers = RouteSpec(
        "headers", "headers",
        [(f"q{i}", "", (("region", regions[i]), ("type", "order")), "all" if i % 2 else "any")
         for i in range(10)],
        lambda i: ("", {"region": regions[i % 10], "type": "order" if i % 3 else "refund",
                        "priority": "high"}),
        "10 bindings of 2 pairs (region, type), x-match all and any alternately; records "
        "with 3 str headers")
    return [direct, topic(10, False), topic(100, False), topic(10, True), topic(100, True),
            fanout, headers]


def routing_name(spec: RouteSpec) -> str:
    return f"topics routing {spec.name}"


def _routing_case(spec: RouteSpec, routes: int) -> Case:
    name = routing_name(spec)

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        router = _router(spec)
        records = [spec.record(i) for i in range(routes if spec.distinct else ROUTE_SET)]
        rounds = max(1, routes // len(records))
        n = rounds * len(records)
        route: Callable[[str, dict[str, str] | None], list[str]] = router.route

        def run() -> Samples:
            t0 = time.perf_counter()
            for _ in range(rounds):
                for k, h in records:
                    route(k, h)
            seconds = time.perf_counter() - t0
            return {name: ("msg/s", n / seconds),
                    f"{name} per record": ("us", seconds / n * 1e6)}

        yield run

    return Case(name, "k7", setup, {
        "records": routes, "bindings": len(spec.bindings), "kind": spec.kind,
        "destinations_per_record": round(_matches(spec) / ROUTE_SET, 2),
        "setting": f"Router.route(routing_key, headers) in a loop; {spec.note}"})


def _router(spec: RouteSpec) -> Any:
    return Router(spec.kind, [Binding(d, k, h, x) for d, k, h, x in spec.bindings])


def _matches(spec: RouteSpec) -> int:
    """How many destinations the records match in all (the params say it per record)."""
    route = _router(spec).route
    return sum(len(route(*spec.record(i))) for i in range(ROUTE_SET))


# ---------------------------------------------------------------------- all of them


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    out: list[Case] = []
    skipped: list[Skipped] = []
    missing = redis_missing() if with_peers else "--no-peers"
    for fsync, records in (("async", s.records), ("sync", s.sync_records)):
        if missing is None:
            out.append(_pair_case(fsync, records))
        else:
            out.append(_k7_case(fsync, records))
            skipped.append(Skipped(redis_name(fsync), missing))
    out.append(_send_case(s.send_records))
    out.append(_publish_case(s.publish))
    out += [_routing_case(spec, s.routes) for spec in routing_specs()]
    return out, skipped
