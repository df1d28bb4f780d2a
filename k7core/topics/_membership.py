"""A consumer group's directory: who is a member, and the assignment every member follows.

    k7py-groups/<group>/k7py-group.lock      flock held while membership or state changes;
                                             its holder's pid written in it
    k7py-groups/<group>/state.json           {"generation", "strategy", "partitions",
                                             "members", "assignment"} (written atomically)
    k7py-groups/<group>/members/<id>.member  one per member; the member's process holds an
                                             exclusive flock on it for as long as it is in;
                                             its mtime is the member's last heartbeat

A member's flock is released by the kernel when its process dies (SIGKILL included): a
member file whose lock can be taken belongs to a dead member, and the next member that
looks removes it and writes a new assignment. Joining and leaving happen under the group
lock, so a member file is never seen between its creation and its flock. A member that
declared a ``max_poll_interval`` and has not beaten for longer is left out of the
assignment (its file stays: it is back at its next heartbeat).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import StorageError
from .._format import check_group_name
from .._storage import FILE_MODE, lock_is_free, open_fd, read_file, storage_error, try_lock
from ._assign import STRATEGIES, Assignment, assign
from ._errors import MemberBusyError, TopicError
from ._layout import make_dirs, write_atomic
from ._lockfile import hold, try_hold

GROUP_LOCK = "k7py-group.lock"
STATE_FILE = "state.json"
MEMBERS_DIR = "members"
MEMBER_SUFFIX = ".member"
MEMBER_FILE_SIZE = 1024  # a member file's content is padded to this (or its size so far)


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


class MemberFile:
    """A member's own file, created and locked by :meth:`GroupDir.take_member`. Its content
    says what the member holds (for stats and tools), padded with spaces so that rewriting
    it needs no new space on a full disk; its mtime is the member's last heartbeat."""

    def __init__(self, fd: int, path: Path, max_poll_interval: float | None) -> None:
        self.fd = fd
        self.path = path
        self.max_poll_interval = max_poll_interval
        self._size = 0

    def publish(self, held: Iterable[int], generation: int) -> None:
        """Write what the member holds (a reader that meets a half-written file just sees
        no partitions)."""
        info = json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "generation": generation,
            "held": sorted(held), "max_poll_interval": self.max_poll_interval,
        }).encode()
        size = max(self._size, MEMBER_FILE_SIZE, len(info))
        try:
            os.pwrite(self.fd, info.ljust(size), 0)
        except OSError as exc:
            raise storage_error(exc, self.path, "write member file") from exc
        self._size = size

    def touch(self) -> None:
        """Stamp a heartbeat (the file's mtime: no data, so it works on a full disk)."""
        try:
            os.utime(self.fd)
        except OSError as exc:
            raise storage_error(exc, self.path, "stamp member file") from exc

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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
        self._limits: dict[tuple[str, int], float | None] = {}  # (member, inode) -> limit

    def create(self) -> None:
        make_dirs(self.members_dir, "group directory")

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the group lock (every holder keeps it for a few file operations): wait up
        to ``timeout`` seconds, then ``TopicLockTimeoutError`` names the holder's pid."""
        what = f"the lock of group {self.path.name!r},"
        fd = hold(self.path / GROUP_LOCK, self.file_mode, timeout, what)
        try:
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def try_locked(self) -> Iterator[bool]:
        """Hold the group lock if it is free now: yield whether it was."""
        fd = try_hold(self.path / GROUP_LOCK, self.file_mode)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                os.close(fd)

    def member_path(self, member: str) -> Path:
        return self.members_dir / f"{member}{MEMBER_SUFFIX}"

    def take_member(self, member: str, max_poll_interval: float | None) -> MemberFile:
        """Create and lock this member's file (under the group lock). A failure (a full
        disk) leaves no file and no descriptor behind."""
        path = self.member_path(member)
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, self.file_mode)
        if not try_lock(fd):
            os.close(fd)
            raise MemberBusyError(
                f"member {member!r} of group {self.path.name!r} is already in the group",
                path=path, hint="give each member its own id (member=None picks one)",
            )
        mf = MemberFile(fd, path, max_poll_interval)
        try:
            mf.publish((), 0)
        except BaseException:
            self.drop_member(member)
            mf.close()
            raise
        return mf

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

    def member_stalled(self, member: str, now: float) -> bool:
        """True when the member declared a ``max_poll_interval`` and its last heartbeat
        (its file's mtime) is older than that at ``now`` (wall clock)."""
        try:
            st = os.stat(self.member_path(member), follow_symlinks=False)
        except OSError:
            return False
        key = (member, st.st_ino)
        if key not in self._limits:
            info = self.member_info(member)
            if not info:
                return False  # being written: asked again at the next heartbeat
            v = info.get("max_poll_interval")
            self._limits[key] = float(v) if isinstance(v, (int, float)) else None
        limit = self._limits[key]
        return limit is not None and now - st.st_mtime > limit

    def members_now(self, now: float, keep: str | None = None) -> tuple[list[str], list[str]]:
        """(the members the assignment is for, the dead members' names): every member
        whose process holds its file's lock and that is not stalled, and ``keep``."""
        live, dead = [], []
        names = self.member_names()
        for key in [k for k in self._limits if k[0] not in names]:
            del self._limits[key]  # members gone: their ids come back only by chance
        for m in names:
            if m == keep:
                live.append(m)
            elif not self.member_live(m):
                dead.append(m)
            elif not self.member_stalled(m, now):
                live.append(m)
        return live, dead

    def prune(self, now: float, keep: str | None = None) -> list[str]:
        """Remove dead members' files (under the group lock); return the members the
        assignment is for."""
        live, dead = self.members_now(now, keep)
        for m in dead:
            self.drop_member(m)
        return live

    def last_active(self) -> float | None:
        """The newest of the members' heartbeats (their files' mtimes) and the last
        generation written (the state file's), wall clock; None with neither."""
        times = []
        for path in [self.state_path, *map(self.member_path, self.member_names())]:
            with contextlib.suppress(OSError):
                times.append(os.stat(path, follow_symlinks=False).st_mtime)
        return max(times, default=None)

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

    def rebalance(
        self, partitions: int, strategy: str, now: float, keep: str | None = None
    ) -> GroupState:
        """Under the group lock: prune the dead, and write a new generation if the live
        members differ from the stored ones. Return the state in force."""
        old = self.read_state()
        live = tuple(self.prune(now, keep))
        if old is not None and old.members == live and old.partitions == partitions:
            return old
        if old is not None and old.strategy != strategy and old.members:
            strategy = old.strategy  # the group's strategy is its first member's
        previous = old.assignment if old is not None else {}
        new = GroupState(
            (old.generation if old is not None else 0) + 1, strategy, partitions, live,
            assign(strategy, live, partitions, previous),
        )
        write_atomic(self.state_path, new.to_json(), self.file_mode)
        return new

    def check_strategy(self, strategy: str) -> None:
        st = self.read_state()
        if st is not None and st.members and st.strategy != strategy:
            raise TopicError(
                f"group {self.path.name!r} assigns with {st.strategy!r}, not {strategy!r}",
                path=self.path, hint="every member of a group uses the group's strategy",
            )
