"""Shared writers' identity and membership (docs/concurrency.md, docs/format.md): a writer is
a random id holding a slot by a byte lock the kernel drops at its death, never a pid.

- Two writer processes in separate PID namespaces (``unshare --pid --fork``: both are pid 1)
  append to one queue with 4 MiB segments (each with its spare segment): the log stays
  whole, and ``writer_pids`` shows both.
- In a fleet whose writers die one at a time while one lives, the dead are forgotten: more
  than 64 writers come and go, and the dead writers' spare segments are removed.
- A lock file deleted or replaced under a live writer: the next writer is refused and the
  live one stops (``LockFileLostError``), so no offset is handed out twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

import k7core
from k7core._format import SHARED_FILE, SHARED_WRITERS, WRITER_LOCK
from k7core._kernel import BUSY, lib
from k7core.metrics import K7Collector
from tests._childproc import DEADLINE, Child
from tests._queuehelp import poll_until, read_records
from tests.k7core._shared_children import shared_payload
from tests.k7core.test_shared_writers import PROGRAM, Writer, calls_of, check_log

MIB4 = 4 << 20  # the smallest segment with a spare segment (SPARE_MIN_SIZE)

UNSHARE = shutil.which("unshare")


def _can_unshare() -> bool:
    if UNSHARE is None or os.geteuid() != 0:
        return False
    return os.system(f"{UNSHARE} --pid --fork true >/dev/null 2>&1") == 0


def spares(qdir: Path) -> list[str]:
    return sorted(p.name for p in qdir.glob("k7py-spare-*.seg"))


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --pid")
def test_writers_in_separate_pid_namespaces(tmp_path: Path) -> None:
    """Both children are pid 1 (each in its own namespace). Before writers had ids, both
    named their spare ``k7py-spare-1.seg`` and truncated each other's: ``k7 verify`` found
    thousands of problems and no writer saw an error."""
    qdir = tmp_path / "q"
    count = 40_000  # about 4.5 MiB each: each writer rolls, and takes its spare
    k7core.Queue(qdir, fsync="flush", segment_size=MIB4).close()
    assert UNSHARE is not None
    with ExitStack() as stack:
        writers = []
        for wid in (1, 2):
            child = stack.enter_context(Child(
                "gated", str(qdir), "flush", str(MIB4), str(wid), str(wid), str(count),
                program=PROGRAM, prefix=(UNSHARE, "--pid", "--fork")))
            assert child.line() == b"ready", child.stderr()
            assert child.line() == b"pid 1", child.stderr()
            writers.append(Writer(wid, child))
        with k7core.Queue(qdir, readonly=True) as ro:
            assert ro.stats().writer_pids == (1, 1)  # two processes, each pid 1 to itself
            collector = K7Collector(ro, registry=None)
            samples = {s.name: s.value for fam in collector.collect() for s in fam.samples}
            assert samples["k7_queue_writer_processes"] == 2
        assert len(spares(qdir)) == 2, spares(qdir)
        for w in writers:
            w.start()
            w.child.send("go")
        for w in writers:
            w.wait_end()
            assert w.child.wait() == 0, w.child.stderr()
            assert w.lines[-1] == b"done", w.lines[-3:]
    log = check_log(qdir, calls_of(writers), None, complete=True)
    assert len(log) == 2 * count
    assert len(list(qdir.glob("seg-*.k7"))) >= 3
    assert spares(qdir) == []


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare --pid")
def test_writer_killed_waiting_for_the_lock_in_another_pid_namespace(tmp_path: Path) -> None:
    """Writer A (pid 1 in its namespace) holds the append lock; writer B (pid 1 in another)
    sleeps waiting for it (its open enters the writers' table under it) and is SIGKILLed
    there. A robust mutex names its owner by thread
    id: had B slept inside pthread_mutex_lock, the kernel would have checked the lock's
    owner id (1, A's) against the dying B's (1) and marked the live A dead, and the next
    writer would have taken the lock from under A (EOWNERDEAD, a recovery of A's tail).
    The lock stays A's: the next writer finds it busy, and the log stays whole."""
    qdir = tmp_path / "q"
    assert UNSHARE is not None
    unshare = (UNSHARE, "--pid", "--fork")
    with ExitStack() as stack:
        c = stack.enter_context(k7core.Queue(qdir, writers="shared", fsync="flush"))
        mine = [(0, [c.enqueue(shared_payload(0, 0))])]
        a = stack.enter_context(Child("holdlock", str(qdir), "1", program=PROGRAM,
                                      prefix=unshare))
        holder = Writer(1, a)
        holder.lines.append(a.line())
        assert a.line() == b"held", a.stderr()
        # B's open waits for the lock (to enter the writers' table)
        b = stack.enter_context(Child("write", str(qdir), "flush", str(4096), "2", "2", "1",
                                      program=PROGRAM, prefix=unshare))
        inner = _only_child(b.proc.pid)  # B's python, as this namespace sees it
        assert poll_until(lambda: _in_futex_wait(inner), DEADLINE), "B never waited"
        assert c._writer is not None and c._writer._shared is not None
        assert c._writer._shared.holder_pid() == 1  # A, as it sees itself
        os.kill(inner, signal.SIGKILL)
        assert b.wait() != 0
        rc = lib.k7_append(c._writer.c, b"x", 1)  # the fast path: a trylock, no wait
        if rc != BUSY:
            lib.k7_shared_release(c._writer.c)
        assert rc == BUSY, f"the lock was taken from its live holder (append returned {rc})"
        a.send("go")
        holder.lines += [a.line(), a.line()]
        assert holder.lines[-1] == b"done" and a.wait() == 0, a.stderr()
        mine.append((1, [c.enqueue(shared_payload(0, 1))]))
        assert c.stats().recovery_events == ()
    log = check_log(qdir, {0: mine, 1: holder.calls()}, None, complete=True)
    assert len(log) == 4


def _only_child(pid: int) -> int:
    """The one child process of ``pid`` (``unshare --fork``'s)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    assert poll_until(lambda: path.read_text().split() != [], DEADLINE)
    (child,) = path.read_text().split()
    return int(child)


def _in_futex_wait(pid: int) -> bool:
    """Whether the main thread of ``pid`` sleeps in a futex syscall."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return bool(fields) and fields[0] == str(_SYS_FUTEX)


_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine, -1)


def test_dead_writers_are_forgotten_while_one_lives(tmp_path: Path) -> None:
    """Writers of 4 MiB segments join and are SIGKILLed, a few at a time, while a writer of
    this process stays open: more of them than the table has slots. Each join frees the
    slots (and removes the spares) of the writers that died before it, so every join
    succeeds, ``writer_pids`` names the live ones only, and no dead writer's spare stays;
    so does a roll."""
    qdir = tmp_path / "q"
    wave, waves = 6, (SHARED_WRITERS + 12) // 6
    with (
        k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4) as here,
        Child("members", str(qdir), str(MIB4), program=PROGRAM) as fleet,
    ):
        here.enqueue(b"first")
        mine = [_spare_of(here)]
        for _ in range(waves):
            fleet.send(f"spawn {wave}")
            pids: list[int] = []
            names: list[str] = []
            for _ in range(wave):
                word, pid_s, name = fleet.line().split()
                assert word == b"ready", fleet.stderr()
                pids.append(int(pid_s))
                names.append(name.decode())
            # the joins forgot the writers of the last wave: only the live ones are left
            assert spares(qdir) == sorted(mine + names)
            assert here.stats().writer_pids == tuple(sorted([os.getpid(), *pids]))
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            fleet.send(f"reap {wave}")
            assert sorted(int(fleet.line().split()[1]) for _ in pids) == sorted(pids)
        assert here.stats().writer_pids == (os.getpid(),)  # the dead are not listed
        assert len(spares(qdir)) == 1 + wave  # the last wave's: no join came after it
        for _ in range(5):  # a roll: it frees them too
            here.enqueue(bytes(1 << 20))
        assert len(list(qdir.glob("seg-*.k7"))) >= 2
        assert _spare_of(here) == mine[0]  # its next spare, on disk
        assert spares(qdir) == mine
        with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4) as late:
            theirs = _spare_of(late)
            assert spares(qdir) == sorted([*mine, theirs])
            offs = [late.enqueue(b"late"), here.enqueue(b"here")]
        assert spares(qdir) == mine
    with k7core.Queue(qdir, readonly=True) as ro:
        log = read_records(ro, 0)
    assert [p for _, p in log] == [b"first", *[bytes(1 << 20)] * 5, b"late", b"here"]
    assert [o for o, _ in log[-2:]] == offs


def _spare_of(q: k7core.Queue) -> str:
    """The name of ``q``'s spare segment, once it is on disk."""
    w = q._writer
    assert w is not None and w._spare is not None
    w._spare._join()
    return w._spare_name


# --------------------------------------------------------------------------------------
# lock files deleted or replaced under a live writer
# --------------------------------------------------------------------------------------


def _replace(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    else:  # a new file of the same name, as a restore or a sync tool would make
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(path.read_bytes())
        os.replace(tmp, path)


@pytest.mark.parametrize("how", ["delete", "replace"])
def test_state_file_lost_under_a_live_shared_writer(tmp_path: Path, how: str) -> None:
    """``k7py-writers`` deleted or replaced: a writer opening now finds it free and would be
    a second "first" writer handing out the live one's offsets again. It is refused, and
    the live writer stops at its next ``sync()``, roll or ``close()``."""
    qdir = tmp_path / "q"
    a = k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=4096)
    try:
        taken = [a.enqueue(b"a%d" % i) for i in range(3)]
        _replace(qdir / SHARED_FILE, how)
        with pytest.raises(k7core.LockFileLostError, match=SHARED_FILE) as exc:
            k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=4096)
        assert "close every writer" in (exc.value.hint or "")
        assert isinstance(exc.value, k7core.QueueLockedError)
        with pytest.raises(k7core.LockFileLostError, match=SHARED_FILE):
            a.sync()
        with pytest.raises(k7core.LockFileLostError):  # and every write after it
            a.enqueue(b"more")
        with pytest.raises(k7core.LockFileLostError):
            a.close()
    finally:
        a.close()
    assert a.closed
    # every writer gone: the next one recovers the log and goes on after it
    with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=4096) as b:
        off = b.enqueue(b"b")
    with k7core.Queue(qdir, readonly=True) as ro:
        got = read_records(ro, 0)
    assert got == [*zip(taken, [b"a0", b"a1", b"a2"], strict=True), (off, b"b")]


def test_state_file_lost_found_at_a_roll(tmp_path: Path) -> None:
    """The live writer's check at a roll: the append that rolls raises, nothing is
    written after the loss."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=4096) as a:
        a.enqueue(b"x")
        (qdir / SHARED_FILE).unlink()
        with pytest.raises(k7core.LockFileLostError):
            for _ in range(1000):  # a roll within ~35 of them
                a.enqueue(b"y" * 100)
        end = a.end
        with pytest.raises(k7core.LockFileLostError):
            a.enqueue(b"z")
        assert a.end == end
        with pytest.raises(k7core.LockFileLostError):
            a.close()


@pytest.mark.parametrize("how", ["delete", "replace"])
def test_writer_lock_lost_under_live_writers(tmp_path: Path, how: str) -> None:
    """``k7py-writer.lock`` deleted or replaced: an exclusive writer opening now would take
    the new file's lock while shared writers live. It is refused (they hold
    ``k7py-writers``); another shared writer still joins them (the state is theirs); the
    writer whose lock file is gone stops at its next ``sync()``."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush") as a:
        first = a.enqueue(b"a")
        _replace(qdir / WRITER_LOCK, how)
        with pytest.raises(k7core.LockFileLostError, match=WRITER_LOCK):
            k7core.Queue(qdir, fsync="flush")
        with k7core.Queue(qdir, writers="shared", fsync="flush") as b:
            second = b.enqueue(b"b")
            with pytest.raises(k7core.LockFileLostError, match=WRITER_LOCK):
                a.sync()
            b.sync()
            third = b.enqueue(b"c")
        with pytest.raises(k7core.LockFileLostError):
            a.close()
    assert first < second < third


@pytest.mark.parametrize("how", ["delete", "replace"])
def test_exclusive_writer_lock_lost(tmp_path: Path, how: str) -> None:
    """An exclusive writer whose ``k7py-writer.lock`` is deleted or replaced: a second
    exclusive writer opening now takes the new file's lock, then finds the first present in
    the directory and is refused; the first stops at its next ``sync()``."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush") as a:
        a.enqueue(b"a")
        _replace(qdir / WRITER_LOCK, how)
        with pytest.raises(k7core.LockFileLostError, match=WRITER_LOCK):
            k7core.Queue(qdir, fsync="flush")
        with pytest.raises(k7core.LockFileLostError, match="deleted or replaced"):
            a.sync()
        with pytest.raises(k7core.LockFileLostError):
            a.enqueue(b"b")
        with pytest.raises(k7core.LockFileLostError):
            a.close()


def test_state_of_another_layout(tmp_path: Path) -> None:
    """``k7py-writers`` of another layout (earlier versions named writers by pid: layout 3):
    refused while a writer holds it, made anew by the first writer when none does (which
    also deletes the pid-named spares those versions left)."""
    qdir = tmp_path / "q"
    version_at, old = 16, (3).to_bytes(4, sys.byteorder)  # magic, size, then the version
    with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4) as a:
        first = a.enqueue(b"a")
        fd = os.open(qdir / SHARED_FILE, os.O_RDWR)
        try:
            mine = os.pread(fd, 4, version_at)
            os.pwrite(fd, old, version_at)
            with pytest.raises(k7core.StorageError, match="version") as exc:
                k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4)
            assert "close every writer" in (exc.value.hint or "")
            os.pwrite(fd, mine, version_at)
        finally:
            os.close(fd)
    fd = os.open(qdir / SHARED_FILE, os.O_RDWR)
    try:
        os.pwrite(fd, old, version_at)
    finally:
        os.close(fd)
    (qdir / "k7py-spare-12345.seg").write_bytes(bytes(4096))
    with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4) as b:
        second = b.enqueue(b"b")
        theirs = _spare_of(b)
        assert spares(qdir) == [theirs]  # not the pid-named one
    with k7core.Queue(qdir, readonly=True) as ro:
        assert read_records(ro, 0) == [(first, b"a"), (second, b"b")]


def test_holder_pid_names_the_holder_of_the_lock(tmp_path: Path) -> None:
    """What waits name in their errors: the pid of the writer that holds the append lock."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, writers="shared", fsync="flush") as here, \
            Child("holdlock", str(qdir), "1", program=PROGRAM) as child:
        assert here._writer is not None and here._writer._shared is not None
        shared = here._writer._shared
        assert shared.holder_pid() is None
        assert child.line().startswith(b"O ") and child.line() == b"held", child.stderr()
        assert shared.holder_pid() == child.proc.pid
        child.send("go")
        assert child.line().startswith(b"O ") and child.line() == b"done", child.stderr()
        assert shared.holder_pid() is None
        here.enqueue(b"mine")
        assert shared.holder_pid() is None
