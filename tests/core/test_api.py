"""Public API details: columnar pair, payload lifetime, close ordering, argument checks."""

from __future__ import annotations

import array
import gc
import logging
import threading
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import drain, fill, payloads, seg_bases


def test_public_names_are_exported() -> None:
    for name in k7core.__all__:
        assert hasattr(k7core, name), name
    assert issubclass(k7core.InvalidNameError, ValueError)
    assert issubclass(k7core.MessageTooLargeError, k7core.K7Error)
    assert k7core.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("width", ["i", "q"])
def test_enqueue_columnar_round_trip(tmp_path: Path, width: str) -> None:
    sent = [b"", b"a", b"bb" * 50, b"ccc" * 300, b"d"]
    data = b"".join(sent)
    offs = array.array(width, [0])
    for p in sent:
        offs.append(offs[-1] + len(p))
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=1024) as q:
        got = q.enqueue_columnar(data, offs)
        assert isinstance(got, array.array) and len(got) == len(sent)
        assert list(got) == sorted(got)
        with q.consumer_group("g") as cg:
            msgs = drain(cg, max_batch=1000)
        assert [m.offset for m in msgs] == list(got)
        assert [bytes(m.payload) for m in msgs] == sent


def test_enqueue_columnar_rejects_bad_offsets(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        with pytest.raises(ValueError):
            q.enqueue_columnar(b"abc", array.array("q", [0, 2, 1]))
        with pytest.raises(ValueError):
            q.enqueue_columnar(b"abc", array.array("q", [0, 4]))
        with pytest.raises(TypeError):
            q.enqueue_columnar(b"abc", array.array("d", [0.0, 3.0]))
        assert q.end == 0  # nothing was written


def test_read_columnar_and_gather(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        offsets = q.enqueue_many([b"x" * i for i in range(50)])
        batch = q.read_columnar(0, 1000)
        assert list(batch.offsets) == offsets
        assert list(batch.lengths) == list(range(50))
        assert bytes(batch.payload(7)) == b"x" * 7
        assert batch.next == q.end
        data, offs = batch.gather()
        assert data == b"".join(b"x" * i for i in range(50))
        assert offs[0] == 0 and offs[-1] == len(data) and len(offs) == 51
        part = q.read_columnar(offsets[10], 5)
        assert list(part.offsets) == offsets[10:15] and part.next == offsets[15]
        assert len(q.read_columnar(q.end, 10)) == 0


def test_payload_view_survives_close_and_is_read_only(tmp_path: Path) -> None:
    q = k7core.Queue(tmp_path / "q", fsync="flush")
    q.enqueue(b"keep me")
    cg = q.consumer_group("g")
    (msg,) = cg.poll(max_batch=1, timeout=0)
    assert msg.payload.readonly
    with pytest.raises(TypeError):
        msg.payload[0] = 0  # read-only: the view refuses the write
    q.close()  # closes the group too; must not raise although a view is held
    assert cg.closed and q.closed
    gc.collect()
    assert bytes(msg.payload) == b"keep me"


def test_close_is_idempotent_and_use_after_close_raises(tmp_path: Path) -> None:
    q = k7core.Queue(tmp_path / "q", fsync="async")
    cg = q.consumer_group("g")
    q.enqueue(b"m")
    q.close()
    q.close()
    cg.close()
    with pytest.raises(k7core.ClosedError):
        q.enqueue(b"x")
    with pytest.raises(k7core.ClosedError):
        q.enqueue_many([b"x"])
    with pytest.raises(k7core.ClosedError):
        cg.poll()
    with pytest.raises(k7core.ClosedError):
        cg.ack(0)
    with pytest.raises(k7core.ClosedError):
        cg.seek(0)
    with pytest.raises(k7core.ClosedError):
        q.consumer_group("h")
    # the locks are released: the queue and the group open again
    with k7core.Queue(tmp_path / "q") as q2, q2.consumer_group("g") as g2:
        assert payloads(drain(g2, max_batch=1000)) == [b"m"]


def test_no_background_thread_left(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with k7core.Queue(tmp_path / "q", fsync="async") as q, q.consumer_group("g") as cg:
        q.enqueue(b"m")
        assert cg.poll(timeout=1.0)
        assert set(threading.enumerate()) - before  # the flusher runs
    assert set(threading.enumerate()) == before


def test_readonly_queue_refuses_writes(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as w:
        w.enqueue(b"one")
        with k7core.Queue(tmp_path / "q", readonly=True) as r:
            with pytest.raises(k7core.ReadOnlyError):
                r.enqueue(b"x")
            with r.consumer_group("g") as cg:
                assert payloads(drain(cg, max_batch=1000)) == [b"one"]
                w.enqueue(b"two")
                assert [bytes(m.payload) for m in cg.poll(timeout=1.0)] == [b"two"]


def test_readonly_on_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(k7core.NotAQueueError):
        k7core.Queue(tmp_path / "nope", readonly=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fsync": "fast"},
        {"segment_size": 10},
        {"segment_size": 4097},
        {"commit_interval": -1.0},
    ],
)
def test_bad_queue_arguments(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        k7core.Queue(tmp_path / "q", **kwargs)  # type: ignore[arg-type]


def test_bad_group_arguments(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q") as q:
        with pytest.raises(ValueError):
            q.consumer_group("g", cursor_fsync="never")
        with q.consumer_group("g") as cg:
            with pytest.raises(ValueError):
                cg.poll(max_batch=0)
            with pytest.raises(ValueError):
                cg.seek(-8)


def test_sync_makes_async_writes_visible_at_once(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="async", commit_interval=5.0) as q:
        off = q.enqueue(b"m")
        q.sync()
        assert q.end > off


def test_fsync_enum_is_accepted(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync=k7core.Fsync.SYNC) as q:
        assert q.fsync == "sync"
        assert q.enqueue(b"x") == 0


def test_batch_crosses_segments_in_one_poll(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=256) as q:
        q.enqueue_many([bytes([i]) * 40 for i in range(20)])
        assert len(list(tmp_path.joinpath("q").glob("seg-*.k7"))) > 3
        with q.consumer_group("g") as cg:
            assert len(cg.poll(max_batch=20, timeout=0)) == 20


def test_one_poll_crosses_750_segments(tmp_path: Path) -> None:
    """A large batch over many small segments (4 KiB, four 1000-byte messages each) comes
    back whole in one poll."""
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=4096) as q:
        offs = fill(q, 3000, size=1000)
        assert len(seg_bases(q.path)) == 750
        with q.consumer_group("g") as cg:
            assert [m.offset for m in cg.poll(max_batch=4096, timeout=0)] == offs


def test_clean_open_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="k7core"):
        for _ in range(2):
            with k7core.Queue(tmp_path / "q", fsync="flush") as q:
                q.enqueue(b"m")
    assert not caplog.records


def test_dropped_group_releases_its_lock_and_cursor(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="async") as q:
        q.enqueue(b"m")
        cg = q.consumer_group("g", cursor_fsync="async")
        (msg,) = cg.poll(timeout=1.0)
        cg.ack(msg)
        del cg, msg
        gc.collect()
        q.enqueue(b"n")
        q.sync()  # the flusher runs a pass without the dropped cursor
        with q.consumer_group("g") as again:  # the lock was released
            assert [bytes(m.payload) for m in again.poll(timeout=1.0)] == [b"n"]


def test_path_that_is_a_file_is_not_a_queue(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(k7core.NotAQueueError):
        k7core.Queue(f)


def test_ack_many_commits_the_frontier_once(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q, q.consumer_group("g") as cg:
        offs = q.enqueue_many([b"a", b"b", b"c", b"d"])
        msgs = cg.poll(max_batch=4, timeout=0)
        assert cg.ack_many([msgs[2], msgs[1]]) == 2
        assert cg.committed == 0 and cg.in_flight == 2  # msgs[0] still holds the frontier
        assert cg.nack(msgs[3])
        assert cg.ack_many([offs[0], offs[0], 12345]) == 1  # duplicates and strangers ignored
        assert cg.committed == offs[3]
        assert cg.ack_many([msgs[3]]) == 1  # acked before its redelivery: not redelivered
        assert cg.committed == q.end and cg.in_flight == 0
        assert cg.poll(max_batch=4, timeout=0) == []
        assert cg.ack_many([]) == 0


def test_queue_wait_for_readers_without_a_group(tmp_path: Path) -> None:
    """``Queue.wait`` returns at once when data is past ``after`` (or the timeout is 0),
    and otherwise sleeps until the writer publishes more."""
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        first = q.enqueue(b"one")
        with k7core.Queue(tmp_path / "q", readonly=True) as ro:
            end = ro.end
            assert ro.wait(first, 10) == end > first  # data is there already
            assert ro.wait(end, 0) == end  # nothing new, no wait
            got: list[int] = []
            waiter = threading.Thread(target=lambda: got.append(ro.wait(end, 60)))
            waiter.start()
            q.enqueue(b"two")
            waiter.join(60)
            assert not waiter.is_alive() and got == [q.end] and q.end > end
            batch = ro.read_columnar(end)
            assert [bytes(batch.payload(i)) for i in range(len(batch))] == [b"two"]
            with pytest.raises(ValueError):
                ro.wait(end, -1)
        with pytest.raises(k7core.ClosedError):
            ro.wait(0, 0)


def test_one_version_for_the_distribution_and_both_packages() -> None:
    import importlib.metadata

    import k7async

    assert k7async.__version__ == k7core.__version__ == importlib.metadata.version("k7py")
