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
from contextlib import ExitStack
from pathlib import Path

import pytest

import k7core
from k7core._format import SHARED_FILE, SHARED_WRITERS, WRITER_LOCK
from k7core.metrics import K7Collector
from tests._childproc import Child
from tests._queuehelp import read_records
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


def test_dead_writers_are_forgotten_while_one_lives(tmp_path: Path) -> None:
    """Writers of 4 MiB segments join and are SIGKILLed, a few at a time, while a writer of
    this process stays open: more of them than the table has slots. Each join frees the
    slots (and removes the spares) of the writers that died before it, so every join
    succeeds, ``writer_pids`` names the live ones only, and no dead writer's spare stays."""
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
        with k7core.Queue(qdir, writers="shared", fsync="flush", segment_size=MIB4) as late:
            theirs = _spare_of(late)
            assert spares(qdir) == sorted([*mine, theirs])
            offs = [late.enqueue(b"late"), here.enqueue(b"here")]
        assert spares(qdir) == mine
    with k7core.Queue(qdir, readonly=True) as ro:
        log = read_records(ro, 0)
    assert [p for _, p in log] == [b"first", b"late", b"here"]
    assert [o for o, _ in log[1:]] == offs


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


def test_exclusive_writer_lock_lost(tmp_path: Path) -> None:
    """An exclusive writer whose ``k7py-writer.lock`` is deleted stops at its next
    ``sync()`` (a second exclusive writer could have opened on the new file)."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush") as a:
        a.enqueue(b"a")
        (qdir / WRITER_LOCK).unlink()
        with pytest.raises(k7core.LockFileLostError, match="deleted or replaced"):
            a.sync()
        with pytest.raises(k7core.LockFileLostError):
            a.enqueue(b"b")
        with pytest.raises(k7core.LockFileLostError):
            a.close()
