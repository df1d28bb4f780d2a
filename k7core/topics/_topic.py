"""Topic: a directory of partition queues with key placement, records and back-pressure."""

from __future__ import annotations

import bisect
import math
import os
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from time import monotonic
from typing import NamedTuple

from .._errors import ClosedError, K7Error
from .._format import Fsync, frame_size
from .._queue import Queue
from .._resource import Resource
from .._stats import GroupInfo, read_cursors
from .._storage import FILE_MODE, list_segments
from ._consumer import TopicConsumer
from ._envelope import (
    HeadersArg,
    Record,
    Value,
    check_headers,
    check_timestamp,
    decode_many,
    encode,
    now_ms,
    value_bytes,
)
from ._errors import BackPressureError
from ._layout import (
    DirWatch,
    check_partitions,
    groups_dir,
    newest_segment_size,
    open_meta,
    partition_dir,
)
from ._lockfile import LOCK_TIMEOUT
from ._membership import GroupDir, GroupState
from ._partitioner import KeylessSpreader, key_bytes, partitioner_for
from ._pressure import BackPressure, GroupActivity, LagMeter, Watermarks, watched_lag
from ._stats import PartitionLag, PartitionStats, PressureStats, TopicGroupStats, TopicStats

_EXPIRY_RECHECK = 1.0  # while sending, groups' expiry is re-read at most this often
TOPIC_SEGMENT_SIZE = 32 * 1024 * 1024
"""Partitions' default segment size at creation: a topic preallocates one segment per
partition (and a spare per writer process), so smaller than a plain queue's 256 MiB. The
size a topic is created with is recorded; opening it later without ``segment_size`` uses
that one."""


class ProducerRecord(NamedTuple):
    """One record for ``Topic.send_many``: the arguments of ``send``."""

    value: Value
    key: Value | None = None
    headers: HeadersArg = None
    timestamp: int | None = None
    partition: int | None = None


class Topic(Resource):
    """A partitioned topic: ``partitions`` k7 queues in a directory, records with key,
    headers and timestamp, keys placed as Kafka's Java producer places them.

    ``Topic(path, partitions=N)`` creates the topic or opens it (then ``N`` must match);
    ``partitions=None`` opens an existing one. ``partitioner`` (``"kafka"``, the default at
    creation, or ``"murmur3"``) is fixed when the topic is created. Every partition is a
    queue opened with ``writers="shared"``, so any number of processes send to one topic;
    ``readonly=True`` opens it for reading and consuming only. Use a Topic from one thread
    at a time. ``back_pressure`` makes ``send`` wait (or raise) while a consumer group is
    too far behind (see ``BackPressure``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        partitions: int | None = None,
        partitioner: str | None = None,
        *,
        fsync: str | Fsync = Fsync.ASYNC,
        segment_size: int | None = None,
        commit_interval: float = 50e-6,
        readonly: bool = False,
        retention: str = "none",
        retention_bytes: int | None = None,
        retention_age: float | None = None,
        file_mode: int = FILE_MODE,
        back_pressure: BackPressure | None = None,
    ) -> None:
        self._closed = True
        self._path = Path(path)
        if partitioner is not None:
            partitioner_for(partitioner)  # a bad name fails before anything is created
        if back_pressure is not None and not isinstance(back_pressure, BackPressure):
            raise TypeError("back_pressure must be a k7core.topics.BackPressure or None")
        self._meta = open_meta(
            self._path, check_partitions(partitions), partitioner, create=not readonly,
            file_mode=file_mode,
            segment_size=TOPIC_SEGMENT_SIZE if segment_size is None else segment_size,
        )
        if segment_size is None:  # the topic's own (older topics: their newest segment's)
            segment_size = self._meta.segment_size or newest_segment_size(
                self._path, TOPIC_SEGMENT_SIZE)
        self._n = self._meta.partitions
        self._place = partitioner_for(self._meta.partitioner).placer(self._n)
        self._spread = KeylessSpreader()
        self._queue_args = {
            "fsync": fsync, "segment_size": segment_size, "commit_interval": commit_interval,
            "readonly": readonly, "retention": retention, "retention_bytes": retention_bytes,
            "retention_age": retention_age, "file_mode": file_mode,
        }
        self._readonly = readonly
        self._file_mode = file_mode
        # No finalizer of its own: each partition Queue has one (closing them again from
        # ours at interpreter exit would touch queues already released).
        self._queues: list[Queue | None] = [None] * self._n
        self._watch: DirWatch | None = None  # a writer's check that the directory is there
        self._bp = back_pressure
        self._bp_messages = back_pressure is None or back_pressure.unit == "messages"
        self._marks = (
            Watermarks(back_pressure.high, back_pressure.low_mark)
            if back_pressure is not None else None
        )
        self._meter = LagMeter(
            back_pressure.unit if back_pressure is not None else "bytes",
            self._ends, self._group_cursors, self._earliest, self._count,
        )
        self._next_check = 0.0
        self._activity = GroupActivity(back_pressure.group_expiry if back_pressure else None)
        self._expired: frozenset[str] = frozenset()
        self._next_expiry = 0.0
        self._lag = 0
        self._since = 0  # what this topic sent since the last reading, in the unit
        self._ends_now: list[int] = []  # the partitions' visible ends at the last reading
        # (offset, frame size) of what this topic wrote, per partition, until it is visible
        self._unpublished: list[list[tuple[int, int]]] = [[] for _ in range(self._n)]
        self._blocked = 0.0
        self._consumers: weakref.WeakSet[TopicConsumer] = weakref.WeakSet()
        self._closed = False
        if not readonly:  # every partition exists (for readers) and fails now, not later
            try:
                for p in range(self._n):
                    self._queue(p)
            except BaseException:
                self._closed = True
                self._close_watch()
                _close_queues(self._queues)
                raise

    # ------------------------------------------------------------------ what it is

    @property
    def path(self) -> Path:
        return self._path

    @property
    def name(self) -> str:
        """The topic's name: its directory's name (Spark's ``topic`` column)."""
        return self._path.name

    @property
    def partitions(self) -> int:
        return self._n

    @property
    def partitioner(self) -> str:
        return self._meta.partitioner

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def file_mode(self) -> int:
        """The mode the topic's files are created with (partitions, group files)."""
        return self._file_mode

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"topic {self._path} is closed", path=self._path)

    def partition(self, partition: int) -> Queue:
        """The queue of one partition (opened on first use; closed with the topic)."""
        self._check_open()
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise TypeError(f"partition must be an int, not {type(partition).__name__}")
        if not 0 <= partition < self._n:
            raise ValueError(f"partition must be 0 .. {self._n - 1}, not {partition}")
        return self._queue(partition)

    def _queue(self, p: int) -> Queue:
        q = self._queues[p]
        if q is None:
            args = dict(self._queue_args)
            if not self._readonly:
                args["writers"] = "shared"
            q = self._queues[p] = Queue(partition_dir(self._path, p), **args)  # type: ignore[arg-type]
            if not self._readonly and self._watch is None:
                self._watch = DirWatch(
                    self._path, 0.0 if q.fsync is Fsync.SYNC else q.commit_interval,
                    f"the directory of topic {self._path}")
        return q

    def _writer(self, p: int) -> Queue:
        """Partition ``p``'s queue, to write into: TopicDeletedError if the topic's
        directory was deleted (the records would be lost with the unlinked files)."""
        q = self._queue(p)
        w = self._watch
        if w is not None and monotonic() >= w.due:
            w.check()
        return q

    def _record(
        self, value: Value, key: Value | None, headers: HeadersArg, timestamp: int | None,
        partition: int | None,
    ) -> tuple[int, bytes]:
        """A record's partition and payload, every argument checked (the common cases,
        bytes and None, without a call)."""
        kb = key if key is None or type(key) is bytes else key_bytes(key)
        if partition is None:
            p = self._spread.next(self._n) if kb is None else self._place(kb)
        elif isinstance(partition, bool) or not isinstance(partition, int):
            raise TypeError(f"partition must be an int, not {type(partition).__name__}")
        elif not 0 <= partition < self._n:
            raise ValueError(f"partition must be 0 .. {self._n - 1}, not {partition}")
        else:
            p = partition
        return p, encode(
            value if type(value) is bytes else value_bytes(value), kb,
            () if headers is None else check_headers(headers),
            now_ms() if timestamp is None else check_timestamp(timestamp),
        )

    def partition_for(self, key: Value) -> int:
        """The partition of a key (the topic's partitioner; Kafka's for ``"kafka"``)."""
        kb = key_bytes(key)
        if kb is None:
            raise TypeError("a key is needed (None spreads records: it has no partition)")
        return self._place(kb)

    # ------------------------------------------------------------------ sending

    def send(
        self,
        value: Value,
        key: Value | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Append one record; return ``(partition, offset)``. Durable per ``fsync`` when
        this returns. ``partition`` if given (Kafka's and TitanMQ's explicit partition),
        else the partition of the key's hash; no key spreads records round-robin over the
        partitions. ``timestamp`` is milliseconds (None: now)."""
        if self._closed:
            raise ClosedError(f"topic {self._path} is closed", path=self._path)
        p, payload = self._record(value, key, headers, timestamp, partition)
        if self._marks is None:
            return p, self._writer(p).enqueue(payload)
        size = frame_size(len(payload))
        self._gate(1 if self._bp_messages else size)
        off = self._writer(p).enqueue(payload)
        self._unpublished[p].append((off, size))
        return p, off

    def send_many(self, records: Iterable[ProducerRecord | Value]) -> list[tuple[int, int]]:
        """Append several records (``ProducerRecord``, or a bare value), one batch per
        partition; return each one's ``(partition, offset)`` in order. Every record is
        checked before anything is written."""
        self._check_open()
        if isinstance(records, (str, bytes, bytearray, memoryview)):
            raise TypeError(
                "send_many takes an iterable of records, not one "
                f"{type(records).__name__} (use send for one record)"
            )
        where: list[int] = []
        batches: dict[int, list[bytes]] = {}
        biggest = 0
        for r in records:
            if type(r) is not ProducerRecord:
                if isinstance(r, (bytes, bytearray, memoryview, str)):
                    r = ProducerRecord(r)
                elif not isinstance(r, ProducerRecord):
                    raise TypeError(
                        f"send_many takes ProducerRecord or bytes items, not {type(r).__name__}"
                    )
            p, payload = self._record(*r)
            where.append(p)
            batches.setdefault(p, []).append(payload)
            if len(payload) > biggest:
                biggest = len(payload)
        if where:  # every partition has the same segment size: all or nothing
            self._queue(where[0]).check_message_size(biggest)
        if self._marks is not None and where:
            self._gate(len(where) if self._bp_messages
                       else sum(frame_size(len(b)) for bs in batches.values() for b in bs))
        writers = {p: self._writer(p) for p in batches}  # every one checked first
        written = {p: writers[p].enqueue_many(batch) for p, batch in batches.items()}
        if self._marks is not None:
            for p, offs in written.items():
                sizes = map(frame_size, map(len, batches[p]))
                self._unpublished[p] += zip(offs, sizes, strict=True)
        offsets = {p: iter(offs) for p, offs in written.items()}
        return [(p, next(offsets[p])) for p in where]

    def sync(self) -> None:
        """msync every open partition (everything sent so far is durable)."""
        for q in self._queues:
            if q is not None:
                q.sync()

    # ------------------------------------------------------------------ back-pressure

    def _gate(self, amount: int) -> None:
        """Let a send (of ``amount`` records or bytes) through, or wait / raise while the
        watched lag is at the high mark. Between readings, what this topic sent counts as
        lag, so that a producer alone stops at the mark, not one interval later."""
        bp, marks = self._bp, self._marks
        assert bp is not None and marks is not None
        now = time.monotonic()
        if now < self._next_check and not marks.paused and self._lag + self._since < bp.high:
            self._since += amount
            return
        if not self._refresh(now, recheck=False):
            self._since += amount
            return
        if bp.on_high == "raise":
            raise self._pressure_error()
        deadline = now + bp.timeout if bp.timeout is not None else math.inf
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._pressure_error()
                time.sleep(min(bp.interval, left))
                if not self._refresh(time.monotonic(), recheck=False):
                    self._since += amount
                    return
        finally:
            self._blocked += time.monotonic() - now

    def _refresh(self, now: float, recheck: bool = True) -> bool:
        """Re-read the watched lag (the groups' expiry too if ``recheck`` or due); return
        whether sends are paused."""
        assert self._bp is not None and self._marks is not None
        # one reading of the ends for both parts, or a publish between them counts nowhere
        self._ends_now = [self._queue(p).end for p in range(self._n)]
        lags = self._meter.lags()
        if self._bp.group_expiry is not None and (recheck or now >= self._next_expiry):
            wall = time.time()
            self._expired = frozenset(
                g for g in lags if self._activity.expired(g, self._files_active(g), wall))
            self._next_expiry = now + _EXPIRY_RECHECK
        self._lag = watched_lag(lags, self._bp.group, self._expired) + self._not_visible()
        self._since = 0
        self._next_check = now + self._bp.interval
        return self._marks.update(self._lag)

    def _pressure_error(self) -> BackPressureError:
        bp = self._bp
        assert bp is not None
        who = f"group {bp.group!r}" if bp.group is not None else "the slowest group"
        return BackPressureError(
            f"topic {self._path}: {who} lags {self._lag} {bp.unit}, over the high "
            f"watermark {bp.high} (sends resume at {bp.low_mark})", lag=self._lag,
            hint="consume faster, raise the watermarks, or wait (on_high='block')",
        )

    def paused(self) -> bool:
        """Re-read the watched lag; True while sends are paused by back-pressure (False
        without ``back_pressure``). For callers that wait elsewhere, such as k7async."""
        self._check_open()
        if self._marks is None:
            return False
        return self._refresh(time.monotonic())

    def throttle_ratio(self) -> float:
        """0 below the low watermark, 1 at the high one or while paused, linear between
        (0 without ``back_pressure``). Re-reads the lag."""
        self._check_open()
        if self._marks is None:
            return 0.0
        self._refresh(time.monotonic())
        return self._marks.ratio(self._lag)

    # ------------------------------------------------------------------ lag

    def _ends(self) -> list[int]:
        return self._ends_now

    def _not_visible(self) -> int:
        """What this topic wrote that readers do not see yet (the flusher publishes it at
        its next pass), in the back-pressure unit: every group lags by that too."""
        total = 0
        for p, mine in enumerate(self._unpublished):
            if mine:
                i = bisect.bisect_left(mine, (self._ends_now[p], 0))
                del mine[:i]
                total += len(mine) if self._bp_messages else sum(size for _, size in mine)
        return total

    def _earliest(self, p: int) -> int:
        bases = list_segments(partition_dir(self._path, p))
        return bases[0] if bases else 0

    def _count(self, p: int, start: int, end: int) -> int | None:
        if start >= end:
            return 0
        return self._queue(p).count_messages(start, end)

    def group_names(self) -> list[str]:
        """The consumer groups of the topic: every group a member ever joined, and every
        group with a cursor in some partition (one used through Spark or a plain
        ``ConsumerGroup`` of a partition queue, say)."""
        return sorted(self._group_cursors())

    def _group_cursors(self) -> dict[str, list[int | None]]:
        """Each group's committed offset per partition (None: no cursor there yet)."""
        try:
            joined = os.listdir(groups_dir(self._path))
        except FileNotFoundError:
            joined = []
        out: dict[str, list[int | None]] = {g: [None] * self._n for g in joined}
        for p in range(self._n):
            d = partition_dir(self._path, p)
            if not d.exists():
                continue
            for g, committed in read_cursors(d):
                out.setdefault(g, [None] * self._n)[p] = committed
        self._activity.saw(out, time.time())
        return out

    def _files_active(self, group: str) -> float | None:
        """A group's last heartbeat or generation, as its directory's files tell."""
        return GroupDir(groups_dir(self._path) / group).last_active()

    # ------------------------------------------------------------------ reading

    def read(self, partition: int, offset: int, max_records: int = 1000) -> list[Record]:
        """Up to ``max_records`` records of one partition from ``offset`` (a record's
        offset, or the partition's earliest), without a consumer group. The next record's
        offset is past the last one's frame: walk a partition with :meth:`records`."""
        return self._read(partition, offset, max_records)[0]

    def records(self, partition: int, offset: int | None = None) -> Iterator[Record]:
        """Every record of one partition from ``offset`` (None: the earliest) to the end
        visible when each batch is read."""
        pos = self.partition(partition).earliest() if offset is None else offset
        while True:
            batch, pos = self._read(partition, pos, 1000)
            if not batch:
                return
            yield from batch

    def _read(self, partition: int, offset: int, max_records: int) -> tuple[list[Record], int]:
        q = self.partition(partition)
        if offset >= q.end:
            return [], offset
        b = q.read_columnar(offset, max_records)
        recs = decode_many([(b.offsets[i], b.payload(i)) for i in range(len(b))], partition)
        return recs, b.next

    def consumer(
        self,
        group: str,
        member: str | None = None,
        *,
        strategy: str = "sticky",
        heartbeat: float = 0.1,
        revoke_timeout: float = 10.0,
        cursor_fsync: str | Fsync = Fsync.ASYNC,
        on_data_loss: str = "raise",
        lock_timeout: float = LOCK_TIMEOUT,
        max_poll_interval: float | None = None,
    ) -> TopicConsumer:
        """Join consumer group ``group`` as ``member`` (None: a unique id); see
        ``TopicConsumer``."""
        if self._closed:
            raise ClosedError(f"topic {self._path} is closed", path=self._path)
        c = TopicConsumer(
            self, group, member, strategy=strategy, heartbeat=heartbeat,
            revoke_timeout=revoke_timeout, cursor_fsync=cursor_fsync,
            on_data_loss=on_data_loss, lock_timeout=lock_timeout,
            max_poll_interval=max_poll_interval,
        )
        self._consumers.add(c)
        return c

    # ------------------------------------------------------------------ stats

    def stats(self) -> TopicStats:
        """Partitions, every group's members, assignment and lag per partition, and the
        back-pressure state. Reads the directory; takes no lock."""
        if self._closed:
            raise ClosedError(f"topic {self._path} is closed", path=self._path)
        parts: list[PartitionStats] = []
        per_group: dict[str, dict[int, GroupInfo]] = {}
        for p in range(self._n):
            qs = self._queue(p).stats()
            parts.append(PartitionStats(p, qs.earliest_offset, qs.next_offset, qs.writer_pids))
            for g in qs.groups:
                per_group.setdefault(g.name, {})[p] = g
        groups = []
        for name in self.group_names():
            gd = GroupDir(groups_dir(self._path) / name)
            st = gd.read_state() or GroupState(0, "", self._n, ())
            owner = {p: m for m, ps in st.assignment.items() for p in ps}
            holders = gd.holders()
            lags = []
            for p in range(self._n):
                info = per_group.get(name, {}).get(p)
                end, earliest = parts[p].next_offset, parts[p].earliest_offset
                committed = info.committed if info is not None else earliest
                lags.append(PartitionLag(
                    p, committed, max(0, end - committed),
                    info.lag_messages if info is not None else self._count(p, earliest, end),
                    owner.get(p), holders.get(p), info.owned if info is not None else False,
                ))
            files = gd.last_active()
            groups.append(TopicGroupStats(
                name, st.generation, st.strategy or None, st.members,
                {m: list(ps) for m, ps in st.assignment.items()}, tuple(lags),
                self._activity.last_active(name, files),
                self._activity.expired(name, files, time.time()),
            ))
        return TopicStats(str(self._path), tuple(parts), self._meta.partitioner,
                          tuple(groups), self.pressure_stats())

    def pressure_stats(self, *, refresh: bool = True) -> PressureStats | None:
        """The back-pressure state (None without ``back_pressure``); ``refresh=False``
        reports the last reading without touching the topic (for another thread, such as
        a metrics scrape)."""
        bp, marks = self._bp, self._marks
        if bp is None or marks is None:
            return None
        if refresh:
            self._check_open()
            self._refresh(time.monotonic())
        return PressureStats(bp.unit, bp.group, bp.high, bp.low_mark, self._lag, marks.paused,
                             marks.ratio(self._lag), marks.pauses, self._blocked,
                             bp.group_expiry, tuple(sorted(self._expired)))

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the topic's consumers and partition queues (everything durable). Idempotent."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        for c in list(self._consumers):
            try:
                c.close()
            except K7Error as exc:
                first = first or exc
        self._close_watch()
        try:
            _close_queues(self._queues)
        except K7Error as exc:
            first = first or exc
        if first is not None:
            raise first

    def _close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("readonly" if self._readonly else "open")
        return f"<k7core.topics.Topic {str(self._path)!r} {self._n} partitions {state}>"


def _close_queues(queues: list[Queue | None]) -> None:
    first: BaseException | None = None
    for i, q in enumerate(queues):
        if q is not None:
            try:
                q.close()
            except K7Error as exc:
                first = first or exc
            queues[i] = None
    if first is not None:
        raise first

