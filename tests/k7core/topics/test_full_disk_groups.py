"""Consumer groups on a full disk (a small tmpfs or loop-mounted ext4, as in
tests/k7core/test_full_disk.py): a join that fails leaves nothing behind (no member file,
no descriptor, no partition assigned to a ghost), members keep polling, and once space
returns a new member joins and every record is consumed.

Mounting needs root; elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack
from pathlib import Path

import pytest

from k7core import K7Error, StorageError
from k7core.topics import Exchange, Topic, TopicConsumer
from tests._childproc import Child
from tests.k7core.test_full_disk import _fill_disk, small_fs  # noqa: F401 (a fixture)

CHILDREN = "tests.k7core.topics._group_children"

SEG = 64 << 10
RECORDS = 400


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def drain(members: list[TopicConsumer], seen: set[tuple[int, int]], total: int) -> None:
    """Poll every member in turn, acking, until ``seen`` holds ``total`` distinct records
    (bounded: every poll waits at most 50 ms, and the loop gives up after 2,000 rounds)."""
    for _ in range(2_000):
        for m in members:
            recs = m.poll(100, 0.05)
            m.ack_many(recs)
            seen.update((r.partition, r.offset) for r in recs)
        if len(seen) >= total:
            return


def check_enospc(exc: BaseException) -> None:
    assert isinstance(exc, StorageError), repr(exc)
    assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
    assert exc.hint, exc


@pytest.mark.parametrize("room", [0, 1])  # no block free, or one: the member file's
@pytest.mark.parametrize("new_group", [False, True])
def test_a_join_on_a_full_disk_fails_cleanly(
    small_fs: Path, new_group: bool, room: int,  # noqa: F811
) -> None:
    with Topic(small_fs / "t", partitions=4, segment_size=SEG) as t:
        for i in range(RECORDS):
            t.send(b"v%d" % i, key=b"k%d" % i)
        t.sync()
        a = t.consumer("g", "a")
        group = "h" if new_group else "g"
        before = open_fds()
        filler = _fill_disk(small_fs, room * os.statvfs(small_fs).f_frsize)
        with pytest.raises(K7Error) as info:
            t.consumer(group, "ghost")
        check_enospc(info.value)
        assert open_fds() == before, "a descriptor leaked"
        members = small_fs / "t" / "k7py-groups" / group / "members"
        assert not (members / "ghost.member").exists()
        # the live member polls on: the full disk does not stop consumption
        done: set[tuple[int, int]] = set()
        drain([a], done, RECORDS)
        assert len(done) == RECORDS
        filler.unlink()
        b = t.consumer(group, "b")
        assert all("ghost" not in g.members for g in t.stats().groups)
        for i in range(RECORDS):
            t.send(b"w%d" % i, key=b"k%d" % i)
        t.sync()
        if new_group:
            done.clear()
        drain([a, b] if not new_group else [b], done, 2 * RECORDS)
        assert len(done) == 2 * RECORDS
        g = next(g for g in t.stats().groups if g.name == group)
        assert set(g.members) == ({"b"} if new_group else {"a", "b"})
        assert all(p.lag_bytes == 0 for p in g.partitions), g
        a.close()
        b.close()


def test_a_member_polls_on_while_a_death_cannot_be_written(
    small_fs: Path, tmp_path: Path,  # noqa: F811
) -> None:
    """A member dies (SIGKILL) while the disk is full: the survivor's heartbeat cannot
    write the next generation (its file takes more pages than the dead member's file
    frees: long member ids), and it polls on (no raw OSError) with the partitions it has;
    once space returns the group rebalances and drains."""
    with Topic(small_fs / "t", partitions=4, segment_size=SEG) as t, ExitStack() as stack:
        for i in range(RECORDS):
            t.send(b"v%d" % i, key=b"k%d" % i)
        t.sync()
        a = t.consumer("g", "a", strategy="range")
        b = stack.enter_context(Child(
            "consume", str(t.path), "g", "b" * 190, str(tmp_path / "b.log"), "range",
            program=CHILDREN))
        assert b.line() == b"joined"
        others = [t.consumer("g", f"c{i}" + "c" * 190, strategy="range") for i in range(14)]
        members = [a, *others]
        for _ in range(1_000):
            a.beat()
            if a.assignment == (0,):
                break
        assert a.assignment == (0,)
        generation = a.generation
        filler = _fill_disk(small_fs, 0)
        b.kill_and_drain()
        done: set[tuple[int, int]] = set()
        for _ in range(5):  # several heartbeats, each failing to write the generation
            drain([a], done, 0)
            a.beat()
        assert a.generation == generation and a.assignment == (0,)
        filler.unlink()
        for _ in range(1_000):
            drain(members, done, 0)
            g = t.stats().groups[0]
            if len(g.members) == 15 and all(p.lag_bytes == 0 for p in g.partitions):
                break
        g = t.stats().groups[0]
        assert len(g.members) == 15 and all(p.lag_bytes == 0 for p in g.partitions), g
        for m in members:
            m.close()


def test_a_partition_taken_over_on_a_full_disk_waits_for_space(small_fs: Path) -> None:  # noqa: F811
    """A member leaves, the disk fills, and the survivor cannot create the cursors of the
    partitions it takes over (removed here, as for partitions the group never held): it
    polls its own on (no error) and takes the others once space returns."""
    with Topic(small_fs / "t", partitions=4, segment_size=SEG) as t:
        for i in range(RECORDS):
            t.send(b"v%d" % i, key=b"k%d" % i)
        t.sync()
        a = t.consumer("g", "a", strategy="range")
        b = t.consumer("g", "b", strategy="range")
        a.beat()
        b.beat()
        assert list(b.assignment) == [2, 3]
        b.close()
        for p in (2, 3):
            (small_fs / "t" / f"partition-{p}" / "cursor-g.k7").unlink()
        filler = _fill_disk(small_fs, 0)
        done: set[tuple[int, int]] = set()
        for _ in range(5):
            drain([a], done, 0)
            a.beat()
        assert list(a.assigned) == [0, 1, 2, 3] and list(a.assignment) == [0, 1]
        filler.unlink()
        drain([a], done, RECORDS)
        assert len(done) == RECORDS and list(a.assignment) == [0, 1, 2, 3]
        a.close()


def test_creating_and_binding_on_a_full_disk_raise_storage_errors(
    small_fs: Path,  # noqa: F811
) -> None:
    """Every other write of the topics layer on a full disk: a StorageError with a hint,
    never a raw OSError."""
    Topic(small_fs / "t", partitions=1, segment_size=SEG).close()
    with Exchange(small_fs / "ex", "fanout") as ex:
        filler = _fill_disk(small_fs, 0)
        with pytest.raises(K7Error) as info:
            ex.bind(small_fs / "t")
        check_enospc(info.value)
        for make in (lambda: Exchange(small_fs / "ex2", "direct"),
                     lambda: Topic(small_fs / "t2", partitions=1, segment_size=SEG)):
            with pytest.raises(K7Error) as info:
                make()
            check_enospc(info.value)
        filler.unlink()
        ex.bind(small_fs / "t")
        assert len(ex.bindings()) == 1
