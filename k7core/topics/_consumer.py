"""TopicConsumer: a member of a consumer group; partitions assigned, moved and drained."""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._checks import check_count, check_seconds, check_timeout
from .._errors import ClosedError, GroupBusyError, K7Error, StorageError
from .._format import Fsync, check_group_name
from .._group import ConsumerGroup, Message
from .._queue import Queue
from .._resource import Resource
from ._assign import STRATEGIES
from ._envelope import Record, decode_many
from ._errors import NotAssignedError
from ._layout import groups_dir
from ._lockfile import LOCK_TIMEOUT
from ._membership import GroupDir, GroupState, MemberFile, check_member_id, default_member_id
from ._stats import TopicGroupStats, TopicStats


def _disk_full(exc: StorageError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


class TopicLike(Protocol):
    """What a consumer needs of its topic (``Topic`` is one)."""

    @property
    def path(self) -> Path: ...
    @property
    def partitions(self) -> int: ...
    @property
    def file_mode(self) -> int: ...
    def partition(self, partition: int) -> Queue: ...
    def stats(self) -> TopicStats: ...

log = logging.getLogger("k7core.topics")

_WAIT_SLICE = 0.002  # with several partitions, how long one partition's wait lasts
_FAST_BEAT = 0.01  # heartbeat while a partition waits to be taken or to drain


@dataclass(frozen=True)
class ConsumerStats:
    """A member's view: its group's generation and members, the partitions assigned to
    it, those it holds now (cursor lock taken), those it is handing over, and the group's
    lag per partition."""

    group: str
    member: str
    generation: int
    members: tuple[str, ...]
    assigned: tuple[int, ...]
    held: tuple[int, ...]
    revoking: tuple[int, ...]
    in_flight: int
    rebalances: int
    topic_group: TopicGroupStats | None


class TopicConsumer(Resource):
    """A member of consumer group ``group`` of a topic (at-least-once).

    Members are processes (or objects in one process) that join and leave at will; each
    partition has one owner at a time (its cursor lock), and the group's committed offset
    for a partition is that partition queue's cursor of the same name. Partitions are
    assigned by ``strategy`` (``"sticky"``, ``"range"``, ``"roundrobin"``; the group's first
    member chooses). Membership is checked every ``heartbeat`` seconds inside ``poll``: a
    member that joins, leaves or dies (its flock is released by the kernel) starts a new
    generation, and each member takes or hands over partitions at its next poll.

    A partition taken away is drained first: no more of its records are delivered, and it
    is released once its records in flight are acked or nacked (at most
    ``revoke_timeout`` seconds; after that they go to the new owner again, and acks of them
    here return False). Use a consumer from one thread at a time, and keep polling: a
    member that stops polling keeps its partitions, unless it gave ``max_poll_interval``:
    then the others leave it out of the assignment once it has not polled (or called
    ``beat``) for that many seconds. Its partitions move as soon as it releases them: when
    it dies, or at its next heartbeat, where it rejoins and follows the new assignment.

    A heartbeat never waits for the group lock: when another member holds it, the
    rebalance is tried again at the next poll. Joining waits for it up to ``lock_timeout``
    seconds, then raises ``TopicLockTimeoutError`` naming the process that holds it.
    """

    def __init__(
        self,
        topic: TopicLike,
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
    ) -> None:
        self._closed = True
        self._topic = topic
        self.group = check_group_name(group)
        self.member = default_member_id() if member is None else check_member_id(member)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        self.strategy = strategy
        self.heartbeat = check_seconds(heartbeat, "heartbeat", 60.0, positive=True)
        self.revoke_timeout = check_seconds(revoke_timeout, "revoke_timeout")
        self.lock_timeout = check_seconds(lock_timeout, "lock_timeout", 3600.0)  # bounded
        self.max_poll_interval = None if max_poll_interval is None else check_seconds(
            max_poll_interval, "max_poll_interval", positive=True)
        if self.max_poll_interval is not None and self.max_poll_interval <= self.heartbeat:
            raise ValueError(
                f"max_poll_interval ({max_poll_interval}) must be longer than the heartbeat "
                f"({heartbeat})"
            )
        if on_data_loss not in ("raise", "earliest"):
            raise ValueError(f"on_data_loss must be 'raise' or 'earliest', not {on_data_loss!r}")
        self._group_args: dict[str, Any] = {
            "cursor_fsync": cursor_fsync, "on_data_loss": on_data_loss,
        }
        self._n = topic.partitions
        self._groups: dict[int, ConsumerGroup] = {}
        self._revoking: dict[int, float] = {}  # partition -> when it is released anyway
        self._nacked: dict[int, set[int]] = {}  # revoking partition -> nacked offsets
        self._pending: set[int] = set()  # assigned, owner not gone yet (or no space)
        self._short: set[int] = set()  # pending for want of space (warned once)
        self._rr = 0
        self._rebalances = 0
        self._published = -1
        self._dir = GroupDir(groups_dir(topic.path) / self.group, topic.file_mode)
        self._dir.create()
        with self._dir.locked(self.lock_timeout):
            self._dir.check_strategy(strategy)
            self._member: MemberFile = self._dir.take_member(self.member, self.max_poll_interval)
            try:
                self._state = self._dir.rebalance(self._n, strategy, time.time(), self.member)
            except BaseException:
                self._dir.drop_member(self.member)
                self._member.close()
                raise
        self._stamp = self._dir.state_stamp()
        self._closed = False
        self._next_beat = 0.0
        try:
            self._beat(time.monotonic())
        except BaseException:
            with contextlib.suppress(K7Error):
                self.close()
            raise

    # ------------------------------------------------------------------ membership

    @property
    def generation(self) -> int:
        return self._state.generation

    @property
    def assignment(self) -> tuple[int, ...]:
        """The partitions this member delivers from now (held, not being handed over)."""
        return tuple(sorted(p for p in self._groups if p not in self._revoking))

    @property
    def assigned(self) -> tuple[int, ...]:
        """The partitions the group's current generation gives this member (some may still
        be held by their previous owner, draining)."""
        return tuple(self._state.assignment.get(self.member, ()))

    def beat(self) -> None:
        """Stamp a heartbeat, check membership and apply the assignment now (``poll`` does
        it every ``heartbeat`` seconds). Never waits for the group lock (see the class)."""
        self._check_open()
        self._beat(time.monotonic())

    def _beat(self, now: float) -> None:
        d = self._dir
        self._member.touch()
        stamp = d.state_stamp()
        if stamp != self._stamp:
            st = d.read_state()
            self._stamp = stamp
            if st is not None:
                self._state = st
        wall = time.time()
        deferred = self._membership_changed(wall) and not self._rebalance(wall)
        self._apply(self._state, now)
        busy = self._pending or self._revoking or deferred
        self._next_beat = now + (min(self.heartbeat, _FAST_BEAT) if busy else self.heartbeat)

    def _membership_changed(self, wall: float) -> bool:
        st = self._state
        if self.member not in st.members or st.partitions != self._n:
            return True
        live, dead = self._dir.members_now(wall, self.member)
        return bool(dead) or tuple(live) != st.members

    def _rebalance(self, wall: float) -> bool:
        """Write the next generation if the group lock is free now; False if it is not (or
        the disk is full): this member goes on with the generation it has, and tries again
        at its next heartbeat."""
        d = self._dir
        with d.try_locked() as got:
            if not got:
                return False
            try:
                self._state = d.rebalance(self._n, self.strategy, wall, self.member)
            except StorageError as exc:
                if not _disk_full(exc):
                    raise
                log.warning("k7core.topics: %s; the rebalance is tried again later", exc)
                return False
        self._stamp = d.state_stamp()
        return True

    def _apply(self, st: GroupState, now: float) -> None:
        target = set(st.assignment.get(self.member, ()))
        for p in self._groups:
            if p not in target and p not in self._revoking:
                self._revoking[p] = now + self.revoke_timeout
                self._nacked[p] = set()
        for p in list(self._revoking):
            if p in target:
                del self._revoking[p]
                self._nacked.pop(p, None)
                continue
            g = self._groups[p]
            if g.in_flight <= len(self._nacked.get(p, ())) or now >= self._revoking[p]:
                del self._revoking[p]
                self._nacked.pop(p, None)
                del self._groups[p]
                g.close()
                self._rebalances += 1
        before = set(self._groups)
        self._pending = set()
        short: set[int] = set()
        for p in sorted(target - self._groups.keys()):
            try:
                self._groups[p] = self._topic.partition(p).consumer_group(
                    self.group, **self._group_args
                )
                self._rebalances += 1
            except GroupBusyError:
                self._pending.add(p)  # its previous owner is draining it
            except StorageError as exc:  # its cursor cannot be created: a full disk
                if not _disk_full(exc):
                    raise
                if p not in self._short:
                    log.warning("k7core.topics: %s; partition %d is taken when space "
                                "returns", exc, p)
                short.add(p)
                self._pending.add(p)
        self._short = short
        if set(self._groups) != before or self._published != st.generation:
            self._member.publish(self._groups, st.generation)
            self._published = st.generation

    # ------------------------------------------------------------------ reading

    def poll(self, max_records: int = 256, timeout: float | None = 0.001) -> list[Record]:
        """Up to ``max_records`` records from this member's partitions, shared fairly
        between them (each gets an equal part; what one leaves goes to the others; the
        first partition asked turns round); wait up to ``timeout`` seconds (None: no limit)
        for the first. Each record is in flight until acked or nacked."""
        self._check_open()
        max_records = check_count(max_records, "max_records")
        deadline = time.monotonic() + check_timeout(timeout)
        while True:
            now = time.monotonic()
            if now >= self._next_beat:
                self._beat(now)
            out = self._take(max_records)
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            wait = max(0.0, min(left, self._next_beat - time.monotonic()))
            active = self.assignment
            if len(active) == 1:
                p = active[0]
                msgs = self._groups[p].poll(max_records, wait)
                if msgs:
                    return self._decode(p, msgs)
            elif active:
                p = active[self._rr % len(active)]
                g = self._groups[p]
                self._topic.partition(p).wait(g.position, min(wait, _WAIT_SLICE))
            else:
                time.sleep(min(wait, _FAST_BEAT))

    def _take(self, max_records: int) -> list[Record]:
        active = self.assignment
        if not active:
            return []
        k = len(active)
        r = self._rr % k
        self._rr += 1
        order = active[r:] + active[:r]
        share = max(1, max_records // k)
        out: list[Record] = []
        full = []
        for p in order:
            room = min(share, max_records - len(out))
            if room <= 0:
                break
            msgs = self._groups[p].poll(room, 0)
            if msgs:
                out += self._decode(p, msgs)
                if len(msgs) == room:
                    full.append(p)
        for p in full:
            room = max_records - len(out)
            if room <= 0:
                break
            msgs = self._groups[p].poll(room, 0)
            out += self._decode(p, msgs)
        return out

    def _decode(self, p: int, msgs: list[Message]) -> list[Record]:
        try:
            return decode_many(msgs, p)
        except K7Error:
            g = self._groups[p]
            for m in msgs:  # nothing lost: they come again (and fail again) until a seek
                g.nack(m)
            raise

    # ------------------------------------------------------------------ acknowledging

    def ack(self, record: Record) -> bool:
        """Mark a record done; False if it was not in flight here (already acked, or its
        partition was handed over). ClosedError once the consumer is closed."""
        self._check_open()
        g = self._groups.get(record.partition)
        if g is None:
            return False
        ok = g.ack(record.offset)
        nacked = self._nacked.get(record.partition)
        if nacked is not None:
            nacked.discard(record.offset)
        return ok

    def ack_many(self, records: Iterable[Record]) -> int:
        """Ack several records (one cursor store per partition); return how many were in
        flight here. ClosedError once the consumer is closed."""
        self._check_open()
        by: dict[int, list[int]] = {}
        for r in records:
            by.setdefault(r.partition, []).append(r.offset)
        n = 0
        for p, offs in by.items():
            g = self._groups.get(p)
            if g is not None:
                n += g.ack_many(offs)
                nacked = self._nacked.get(p)
                if nacked is not None:
                    nacked.difference_update(offs)
        return n

    def nack(self, record: Record) -> bool:
        """Deliver this record again (first, on a later poll); False if it was not in flight
        here. On a partition being handed over, the new owner delivers it. ClosedError once
        the consumer is closed."""
        self._check_open()
        g = self._groups.get(record.partition)
        if g is None:
            return False
        ok = g.nack(record.offset)
        nacked = self._nacked.get(record.partition)
        if ok and nacked is not None:
            nacked.add(record.offset)
        return ok

    def seek(self, partition: int, offset: int) -> None:
        """Move the group's cursor of one of this member's partitions (persisted)."""
        self._held(partition).seek(offset)

    def committed(self, partition: int) -> int:
        """The group's committed offset of a partition this member holds."""
        return self._held(partition).committed

    def position(self, partition: int) -> int:
        return self._held(partition).position

    def _held(self, partition: int) -> ConsumerGroup:
        self._check_open()
        g = self._groups.get(partition)
        if g is None or partition in self._revoking:
            raise NotAssignedError(
                f"partition {partition} is not assigned to member {self.member!r} of group "
                f"{self.group!r} (it holds {list(self.assignment)})",
                hint="seek from the member that owns it (stats() shows the assignment)",
            )
        return g

    @property
    def in_flight(self) -> int:
        return sum(g.in_flight for g in self._groups.values())

    def stats(self) -> ConsumerStats:
        self._check_open()
        st = self._state
        tg = next((g for g in self._topic.stats().groups if g.name == self.group), None)
        return ConsumerStats(
            self.group, self.member, st.generation, st.members, self.assigned,
            tuple(sorted(self._groups)), tuple(sorted(self._revoking)), self.in_flight,
            self._rebalances, tg,
        )

    # ------------------------------------------------------------------ lifetime

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(
                f"consumer {self.member!r} of group {self.group!r} is closed",
                path=self._dir.path,
            )

    def close(self) -> None:
        """Leave the group: commit and release every partition (records in flight go to
        their next owner), then start the next generation for the others. Idempotent."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        for g in self._groups.values():
            try:
                g.close()
            except K7Error as exc:
                first = first or exc
        self._groups.clear()
        self._revoking.clear()
        self._leave()
        if first is not None:
            raise first

    def _leave(self) -> None:
        """Remove the member file and release its lock; write the next generation if the
        group lock is free now and the disk takes it (else the others write it at their
        next heartbeat: they find the member gone)."""
        try:
            with self._dir.try_locked() as got:
                self._dir.drop_member(self.member)
                self._member.close()
                if got:
                    try:
                        self._dir.rebalance(self._n, self.strategy, time.time())
                    except StorageError as exc:
                        log.warning("k7core.topics: %s; the others rebalance", exc)
        finally:
            self._member.close()

    def __repr__(self) -> str:
        return (f"<k7core.topics.TopicConsumer {self.member!r} of {self.group!r} "
                f"{'closed' if self._closed else list(self.assignment)}>")
