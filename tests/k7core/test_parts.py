"""The parts behind ``Queue``: the shared flusher, immutable options, ``delete_before``."""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import read_all


def flusher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("k7-flusher")]


def test_one_flusher_thread_serves_64_async_queues(tmp_path: Path) -> None:
    assert flusher_threads() == []
    queues = [k7core.Queue(tmp_path / f"p{i}", fsync="async", segment_size=4096)
              for i in range(64)]
    try:
        groups = [q.consumer_group("g") for q in queues]  # async cursors: the same thread
        assert len(flusher_threads()) == 1
        for i, q in enumerate(queues):
            q.enqueue(b"m%d" % i)
        for i, g in enumerate(groups):  # made visible by the one background thread
            msgs = g.poll(timeout=10.0)
            assert [bytes(m.payload) for m in msgs] == [b"m%d" % i]
            g.ack(msgs[0])
    finally:
        for q in queues[:-1]:
            q.close()
        assert len(flusher_threads()) == 1  # still serving the last one
        queues[-1].close()
    assert flusher_threads() == []  # the last close joins it


def test_commit_intervals_get_their_own_flusher(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "a", fsync="async", commit_interval=0.001) as a, \
            k7core.Queue(tmp_path / "b", fsync="async", commit_interval=0.002) as b:
        assert len(flusher_threads()) == 2
        a.enqueue(b"x")
        b.enqueue(b"y")
        assert a.wait(0, 10.0) > 0 and b.wait(0, 10.0) > 0
    assert flusher_threads() == []


def test_a_closed_queue_leaves_the_flusher_in_sync(tmp_path: Path) -> None:
    """The last pass for a queue happens at its close, not at the thread's stop."""
    with k7core.Queue(tmp_path / "keep", fsync="async"):
        q = k7core.Queue(tmp_path / "q", fsync="async", commit_interval=10.0)
        q.enqueue(b"late")
        q.close()
        with k7core.Queue(tmp_path / "q", readonly=True) as r:
            assert read_all(r) == [b"late"]


def _child_writes(path: str) -> None:
    with k7core.Queue(path, fsync="async") as q:
        q.enqueue(b"from the child")
        assert q.wait(0, 10.0) > 0  # visible: a flusher runs in the child


def test_forked_child_gets_its_own_flusher(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "parent", fsync="async"):
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_child_writes, args=(str(tmp_path / "child"),))
        p.start()
        p.join(60)
        assert p.exitcode == 0
    with k7core.Queue(tmp_path / "child", readonly=True) as r:
        assert read_all(r) == [b"from the child"]


def test_options_are_immutable(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
        assert q.options.fsync is k7core.Fsync.FLUSH and q.fsync is k7core.Fsync.FLUSH
        with pytest.raises(AttributeError):
            q.fsync = k7core.Fsync.SYNC  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            q.options.segment_size = 8192  # type: ignore[misc]
        assert q.options.durable is False
        assert q.segment_size == 4096


def test_delete_before_drops_whole_sealed_segments_only(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
        offsets = q.enqueue_many([bytes(100)] * 200)  # several segments
        bases = sorted({s.base for s in q.stats().segments})
        assert len(bases) >= 4
        cut = offsets[100]
        expected = [b for b, nxt in itertools.pairwise(bases) if nxt <= cut]
        assert q.delete_before(cut) == expected
        assert q.earliest() == bases[len(expected)] <= cut
        assert q.delete_before(cut) == []  # nothing more below it
        assert q.delete_before(2**62) == bases[len(expected):-1]  # never the current one
        assert [s.base for s in q.stats().segments] == [bases[-1]]
        with q.consumer_group("late", on_data_loss="earliest") as g:
            got = g.poll(max_batch=1000, timeout=0)
            assert got and got[0].offset == bases[-1]
        assert q.stats().retention_deleted_segments == len(bases) - 1


def test_delete_before_checks_its_argument_and_the_queue(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        with pytest.raises(TypeError):
            q.delete_before("1")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            q.delete_before(-1)
        with k7core.Queue(tmp_path / "q", readonly=True) as r, pytest.raises(k7core.ReadOnlyError):
            r.delete_before(0)
    with pytest.raises(k7core.ClosedError):
        q.delete_before(0)


def test_check_message_size(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
        q.check_message_size(4096 - 16)
        with pytest.raises(k7core.MessageTooLargeError):
            q.check_message_size(4096)


def test_remove_when_empty_leaves_other_layers_files(tmp_path: Path) -> None:
    d = tmp_path / "q"
    with k7core.Queue(d, fsync="flush", segment_size=4096, remove_when_empty=True) as q:
        q.enqueue(b"x")
        with q.consumer_group("g") as g:
            g.ack(g.poll(timeout=0)[0])
        (d / "k7py-sink-query.json").write_text("{}")  # a Spark sink record
        (d / "k7py-staging").mkdir()
        (d / "k7py-torn-x.bin").write_bytes(b"t")  # recovery's side file: the queue's own
    assert sorted(p.name for p in d.iterdir()) == ["k7py-sink-query.json", "k7py-staging"]


def test_write_file_atomic_takes_bytes_or_chunks(tmp_path: Path) -> None:
    from k7core._storage import read_file, write_file_atomic

    target = tmp_path / "state"
    write_file_atomic(target, b"one")
    assert read_file(target) == b"one"
    write_file_atomic(target, (bytes([i]) * 1000 for i in range(70)))
    assert read_file(target) == b"".join(bytes([i]) * 1000 for i in range(70))

    def failing() -> Iterator[bytes]:
        yield b"half"
        raise RuntimeError("the producer of the chunks failed")

    with pytest.raises(RuntimeError):
        write_file_atomic(target, failing())
    assert read_file(target) == b"".join(bytes([i]) * 1000 for i in range(70))  # old content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # no temporary left


def test_max_message_size_is_the_largest_that_fits(tmp_path: Path) -> None:
    for size in (4096, 4104, 1 << 20):
        with k7core.Queue(tmp_path / f"q{size}", segment_size=size) as q:
            biggest = q.options.max_message_size
            q.enqueue(b"x" * biggest)
            with pytest.raises(k7core.MessageTooLargeError):
                q.check_message_size(biggest + 1)
