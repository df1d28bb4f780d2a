"""The records of ``Topic.stats()`` and ``TopicConsumer.stats()``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionStats:
    partition: int
    earliest_offset: int
    next_offset: int
    writer_pids: tuple[int, ...]


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group: its cursor, the lag behind the end, and whether a member
    holds it now (its cursor lock)."""

    partition: int
    committed: int
    lag_bytes: int
    lag_messages: int | None
    owner: str | None  # the member the current generation assigns it to
    holder: str | None  # the member holding it now (its previous owner while it drains)
    owned: bool  # some consumer holds its cursor lock


@dataclass(frozen=True)
class TopicGroupStats:
    """A group of the topic: its generation, members and assignment, each partition's lag;
    ``last_active`` (wall-clock seconds: its members' last heartbeat, its last generation,
    its offsets' last move seen by this topic) and whether that is older than the
    back-pressure's ``group_expiry`` (then it no longer holds producers back)."""

    name: str
    generation: int
    strategy: str | None
    members: tuple[str, ...]
    assignment: dict[str, list[int]]
    partitions: tuple[PartitionLag, ...]
    last_active: float | None = None
    expired: bool = False

    @property
    def lag_bytes(self) -> int:
        return sum(p.lag_bytes for p in self.partitions)

    @property
    def lag_messages(self) -> int | None:
        ns = [p.lag_messages for p in self.partitions]
        return None if None in ns else sum(n for n in ns if n is not None)


@dataclass(frozen=True)
class PressureStats:
    """Back-pressure now: the watched lag, the marks, paused or not, the throttle ratio;
    ``expired_groups`` are the groups inactive for ``group_expiry`` seconds, not counted."""

    unit: str
    group: str | None
    high: int
    low: int
    lag: int
    paused: bool
    throttle_ratio: float
    pauses: int
    blocked_seconds: float
    group_expiry: float | None = None
    expired_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopicStats:
    path: str
    partitions: tuple[PartitionStats, ...]
    partitioner: str
    groups: tuple[TopicGroupStats, ...]
    back_pressure: PressureStats | None
