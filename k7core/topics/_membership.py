"""A consumer group's directory: who is a member, and the assignment every member follows.

    k7py-groups/<group>/k7py-group.lock      flock held while membership or state changes
    k7py-groups/<group>/state.json           {"generation", "strategy", "partitions",
                                             "members", "assignment"} (written atomically)
    k7py-groups/<group>/members/<id>.member  one per member; the member's process holds an
                                             exclusive flock on it for as long as it is in

A member's flock is released by the kernel when its process dies (SIGKILL included): a
member file whose lock can be taken belongs to a dead member, and the next member that
looks removes it and writes a new assignment. Joining and leaving happen under the group
lock, so a member file is never seen between its creation and its flock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import StorageError
from .._format import check_group_name
from .._storage import FILE_MODE, lock_is_free, open_fd, read_file, try_lock, write_file_atomic
from ._assign import STRATEGIES, Assignment, assign
from ._errors import MemberBusyError, TopicError

GROUP_LOCK = "k7py-group.lock"
STATE_FILE = "state.json"
MEMBERS_DIR = "members"
MEMBER_SUFFIX = ".member"


@dataclass(frozen=True)
class GroupState:
    """One generation of a group: its live members and the partitions of each."""

    generation: int
    strategy: str
    partitions: int
    members: tuple[str, ...]
    assignment: Assignment = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({
            "generation": self.generation, "strategy": self.strategy,
            "partitions": self.partitions, "members": list(self.members),
            "assignment": self.assignment,
        }, sort_keys=True).encode() + b"\n"

    @classmethod
    def parse(cls, data: bytes) -> GroupState | None:
        """The state, or None for a document this version cannot use (rewritten then)."""
        try:
            d = json.loads(data)
            st = cls(
                int(d["generation"]), str(d["strategy"]), int(d["partitions"]),
                tuple(str(m) for m in d["members"]),
                {str(m): [int(p) for p in ps] for m, ps in d["assignment"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return st if st.strategy in STRATEGIES else None


def publish(fd: int, held: Iterable[int], generation: int = 0) -> None:
    """Write what a member holds into its own member file (for stats and tools; a reader
    that meets a half-written file just sees no partitions)."""
    info = json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "generation": generation,
        "held": sorted(held),
    }).encode()
    os.pwrite(fd, info, 0)
    os.ftruncate(fd, len(info))


def check_member_id(member: object) -> str:
    try:
        return check_group_name(member)
    except Exception as exc:
        raise type(exc)(str(exc).replace("group name", "member id")) from None


def default_member_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class GroupDir:
    """The files of one consumer group of a topic."""

    def __init__(self, path: Path, file_mode: int = FILE_MODE) -> None:
        self.path = path
        self.members_dir = path / MEMBERS_DIR
        self.state_path = path / STATE_FILE
        self.file_mode = file_mode

    def create(self) -> None:
        self.members_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the group lock (blocking: every holder keeps it for a few file operations)."""
        fd = open_fd(self.path / GROUP_LOCK, os.O_RDWR | os.O_CREAT, self.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def member_path(self, member: str) -> Path:
        return self.members_dir / f"{member}{MEMBER_SUFFIX}"

    def take_member(self, member: str) -> int:
        """Create and lock this member's file (under the group lock); return its fd."""
        path = self.member_path(member)
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, self.file_mode)
        if not try_lock(fd):
            os.close(fd)
            raise MemberBusyError(
                f"member {member!r} of group {self.path.name!r} is already in the group",
                path=path, hint="give each member its own id (member=None picks one)",
            )
        publish(fd, ())
        return fd

    def drop_member(self, member: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.member_path(member))

    def member_names(self) -> list[str]:
        try:
            names = os.listdir(self.members_dir)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(MEMBER_SUFFIX)] for n in names if n.endswith(MEMBER_SUFFIX))

    def member_live(self, member: str) -> bool:
        try:
            return not lock_is_free(self.member_path(member))
        except StorageError:
            return False

    def member_info(self, member: str) -> dict[str, object]:
        try:
            doc = json.loads(read_file(self.member_path(member)) or b"{}")
        except (StorageError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def holders(self) -> dict[int, str]:
        """Which live member holds each partition, as the members publish it."""
        out: dict[int, str] = {}
        for m in self.member_names():
            held = self.member_info(m).get("held")
            if isinstance(held, list) and self.member_live(m):
                for p in held:
                    if isinstance(p, int):
                        out[p] = m
        return out

    def prune(self, keep: str | None = None) -> list[str]:
        """Remove dead members' files (under the group lock); return the live members."""
        live = []
        for m in self.member_names():
            if m == keep or self.member_live(m):
                live.append(m)
            else:
                self.drop_member(m)
        return live

    def state_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.state_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read_state(self) -> GroupState | None:
        try:
            return GroupState.parse(read_file(self.state_path))
        except StorageError:
            return None

    def rebalance(self, partitions: int, strategy: str, keep: str | None = None) -> GroupState:
        """Under the group lock: prune the dead, and write a new generation if the live
        members differ from the stored ones. Return the state in force."""
        old = self.read_state()
        live = tuple(self.prune(keep))
        if old is not None and old.members == live and old.partitions == partitions:
            return old
        if old is not None and old.strategy != strategy and old.members:
            strategy = old.strategy  # the group's strategy is its first member's
        previous = old.assignment if old is not None else {}
        new = GroupState(
            (old.generation if old is not None else 0) + 1, strategy, partitions, live,
            assign(strategy, live, partitions, previous),
        )
        write_file_atomic(self.state_path, new.to_json(), self.file_mode)
        return new

    def check_strategy(self, strategy: str) -> None:
        st = self.read_state()
        if st is not None and st.members and st.strategy != strategy:
            raise TopicError(
                f"group {self.path.name!r} assigns with {st.strategy!r}, not {strategy!r}",
                path=self.path, hint="every member of a group uses the group's strategy",
            )
