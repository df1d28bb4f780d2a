"""Bad input gets a clear error (a K7Error, or a TypeError / ValueError that says what to
do), never a raw OverflowError, MemoryError or UnicodeEncodeError, and never silent
acceptance; and the inputs that look odd but are valid (no timeout, an infinite one) work."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest

import k7core
from k7core import MAX_BATCH
from k7core._format import decode_cursor, encode_cursor
from tests._queuehelp import wait_until

# ---------------------------------------------------------------- options


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"segment_size": True}, TypeError),
    ({"segment_size": 4096.0}, TypeError),
    ({"commit_interval": math.nan}, ValueError),
    ({"commit_interval": True}, TypeError),
    ({"commit_interval": "0.1"}, TypeError),
    ({"retention_bytes": True}, TypeError),
    ({"retention_bytes": 1.5}, TypeError),
    ({"retention_bytes": -1}, ValueError),
    ({"retention_age": math.nan}, ValueError),
    ({"retention_age": False}, TypeError),
    ({"retention_age": -1.0}, ValueError),
    ({"file_mode": True}, TypeError),
    ({"file_mode": 0o1600}, ValueError),
    ({"lock_timeout": 0}, ValueError),  # a wait on another process is always bounded
    ({"lock_timeout": math.inf}, ValueError),
    ({"lock_timeout": None}, TypeError),
    ({"lock_timeout": math.nan}, ValueError),
    ({"lock_timeout": True}, TypeError),
])
def test_queue_rejects_bools_nan_and_wrong_types(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        k7core.Queue(tmp_path / "q", **kwargs)
    assert not (tmp_path / "q").exists()  # refused before anything was created


def test_queue_accepts_infinite_retention_age(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", retention_age=math.inf, retention_bytes=0) as q:
        assert q.retention_age == math.inf and q.retention_bytes == 0


# ---------------------------------------------------------------- timeouts


@pytest.mark.parametrize("timeout", [None, math.inf, 1e300])
def test_poll_without_a_limit_waits_for_a_message(tmp_path: Path, timeout: float | None) -> None:
    """``timeout=None`` (as ``queue.Queue.get``), ``inf`` and a huge number wait until a
    message arrives: the kernel's int64-nanosecond wait is taken in bounded slices."""
    with k7core.Queue(tmp_path / "q", fsync="flush") as q, q.consumer_group("g") as g:
        got: list[k7core.Message] = []
        t = threading.Thread(target=lambda: got.extend(g.poll(max_batch=4, timeout=timeout)))
        t.start()
        wait_until(lambda: q._log.pub.waiters == 1)  # asleep in the kernel, nothing visible
        off = q.enqueue(b"late")
        t.join(10)
        assert not t.is_alive()
        assert [(m.offset, bytes(m.payload)) for m in got] == [(off, b"late")]


@pytest.mark.parametrize("timeout", [None, math.inf, 1e300])
def test_queue_wait_without_a_limit(tmp_path: Path, timeout: float | None) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        ends: list[int] = []
        t = threading.Thread(target=lambda: ends.append(q.wait(0, timeout)))
        t.start()
        wait_until(lambda: q._log.pub.waiters == 1)
        q.enqueue(b"x")
        t.join(10)
        assert ends == [q.end]


BAD_TIMEOUTS: list[tuple[object, type[Exception]]] = [
    (math.nan, ValueError), (-1, ValueError), (-0.5, ValueError), (-math.inf, ValueError),
    (True, TypeError), ("1", TypeError), (b"", TypeError),
]


@pytest.mark.parametrize(("timeout", "error"), BAD_TIMEOUTS)
def test_bad_timeouts_are_rejected_even_with_messages_waiting(
    tmp_path: Path, timeout: object, error: type[Exception]
) -> None:
    """Checked on poll's fast path too (in C, at no cost for ordinary timeouts), with the
    same message as on the slow path; nothing is delivered by the refused call."""
    with k7core.Queue(tmp_path / "q", fsync="flush") as q, q.consumer_group("g") as g:
        for visible in (False, True):
            with pytest.raises(error, match="timeout must be") as info:
                g.poll(max_batch=4, timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(error, match="timeout must be") as again:
                q.wait(0, timeout)  # type: ignore[arg-type]
            assert str(info.value) == str(again.value)
            if not visible:
                q.enqueue_many([b"a", b"b"])
        assert [bytes(m.payload) for m in g.poll(max_batch=4, timeout=0)] == [b"a", b"b"]


# ---------------------------------------------------------------- batch sizes


@pytest.mark.parametrize(("max_batch", "error"), [
    (2**40, ValueError), (MAX_BATCH + 1, ValueError), (0, ValueError), (-3, ValueError),
    (True, TypeError), (2.0, TypeError), (None, TypeError),
])
def test_poll_and_read_columnar_bound_the_batch(
    tmp_path: Path, max_batch: object, error: type[Exception]
) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q, q.consumer_group("g") as g:
        q.enqueue_many([b"a", b"b"])
        with pytest.raises(error, match="max_batch"):
            g.poll(max_batch=max_batch, timeout=0)  # type: ignore[arg-type]
        with pytest.raises(error, match="max_messages"):
            q.read_columnar(0, max_messages=max_batch)  # type: ignore[arg-type]
        assert len(g.poll(max_batch=MAX_BATCH, timeout=0)) == 2  # the maximum is fine
        assert len(q.read_columnar(0, MAX_BATCH)) == 2


# ---------------------------------------------------------------- messages


@pytest.mark.parametrize("items", [b"abc", bytearray(b"abc"), memoryview(b"abc"), "abc", 5])
def test_enqueue_many_needs_an_iterable_of_messages(tmp_path: Path, items: object) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        with pytest.raises(TypeError, match="needs an iterable of bytes-like messages") as info:
            q.enqueue_many(items)  # type: ignore[arg-type]
        assert type(items).__name__ in str(info.value)
        assert q.end == 0
        assert q.enqueue_many(iter([b"abc"])) == [0]  # any iterable of messages is fine


# ---------------------------------------------------------------- names


def test_segment_base_beyond_int64_is_a_storage_error(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush") as q:
        q.enqueue(b"x")
    for name in ("seg-99999999999999999999.k7", f"seg-{2**63:020d}.k7"):
        (qdir / name).write_bytes(b"")
        for readonly in (False, True):
            with pytest.raises(k7core.StorageError, match="does not fit in 64 bits") as info:
                k7core.Queue(qdir, readonly=readonly)
            assert info.value.path == str(qdir / name) and name in str(info.value)
        (qdir / name).unlink()
    (qdir / f"seg-{2**63 - 1:020d}.k7").write_bytes(b"")  # the largest base is a base
    k7core.Queue(qdir, readonly=True).close()


@pytest.mark.parametrize("name", ["\ud800x", "a\udcff", "\udfff"])
def test_group_name_that_is_not_utf8_is_an_invalid_name(tmp_path: Path, name: str) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        with pytest.raises(k7core.InvalidNameError, match="not valid Unicode"):
            q.consumer_group(name)
        assert [p.name for p in (tmp_path / "q").iterdir() if "cursor" in p.name] == []


# ---------------------------------------------------------------- offsets


def _queue_of(qdir: Path, n: int, **kwargs: Any) -> list[int]:
    with k7core.Queue(qdir, segment_size=1024, fsync="flush", **kwargs) as q:
        return q.enqueue_many([b"m%03d" % i for i in range(n)])


def test_seek_refuses_an_offset_inside_a_frame(tmp_path: Path) -> None:
    """seek(3) was accepted and the next poll raised "corrupt frame"."""
    offs = _queue_of(tmp_path / "q", 100)
    with k7core.Queue(tmp_path / "q") as q, q.consumer_group("g") as g:
        for bad, before, after in ((3, offs[0], offs[1]), (offs[60] + 8, offs[60], offs[61])):
            with pytest.raises(k7core.CursorError) as info:
                g.seek(bad)
            err = info.value
            assert isinstance(err, ValueError)
            assert (err.offset, err.boundary, err.end) == (bad, after, q.end)
            assert f"it starts at {before}, the next one at {after}" in str(err)
            assert f"seek({after})" in str(err) and g.committed == 0  # nothing moved
        g.seek(offs[61])
        assert [m.offset for m in g.poll(max_batch=2, timeout=0)] == offs[61:63]


def test_seek_refuses_an_offset_past_the_end(tmp_path: Path) -> None:
    """seek(10**9) was accepted and the group then never received new messages."""
    _queue_of(tmp_path / "q", 10)
    with k7core.Queue(tmp_path / "q", fsync="flush") as q, q.consumer_group("g") as g:
        end = q.end
        for bad in (end + 8, 10**9, 2**64, 2**100):
            with pytest.raises(k7core.CursorError, match=f"beyond the end of the log .{end}."):
                g.seek(bad)
        for bad in (-8, -(2**64)):
            with pytest.raises(k7core.CursorError, match="negative"):
                g.seek(bad)
        g.seek(end)  # exactly the end is valid: the group gets what comes next
        off = q.enqueue(b"new")
        assert [m.offset for m in g.poll(max_batch=5, timeout=0)] == [off]
        assert g.lag == q.end - off


@pytest.mark.parametrize("offset", [True, False, 8.0, "8", None])
def test_seek_wants_an_int(tmp_path: Path, offset: object) -> None:
    _queue_of(tmp_path / "q", 3)
    with k7core.Queue(tmp_path / "q") as q, q.consumer_group("g") as g, pytest.raises(
        TypeError, match="offset must be an int"
    ):
        g.seek(offset)  # type: ignore[arg-type]


def test_ack_and_nack_of_offsets_beyond_int64(tmp_path: Path) -> None:
    """ack(2**70) raised OverflowError: no such offset is in flight."""
    offs = _queue_of(tmp_path / "q", 3)
    with k7core.Queue(tmp_path / "q") as q, q.consumer_group("g") as g:
        msgs = g.poll(max_batch=3, timeout=0)
        for huge in (2**70, -(2**70), 2**63):
            assert g.ack(huge) is False and g.nack(huge) is False
            assert g.ack_many([huge]) == 0
        for flag in (True, False):
            for call in (g.ack, g.nack, lambda m: g.ack_many([m])):
                with pytest.raises(TypeError, match="not bool"):
                    call(flag)
        assert g.in_flight == 3
        assert g.ack_many(msgs) == 3 and g.committed == q.end and offs == [m.offset for m in msgs]


def test_seek_before_the_earliest_segment(tmp_path: Path) -> None:
    """Allowed (seek(0) replays whatever is left): poll then reports the deleted part as
    the group's on_data_loss says."""
    qdir = tmp_path / "q"
    offs = _queue_of(qdir, 200)
    with k7core.Queue(qdir, segment_size=1024, retention_bytes=0) as q:
        earliest = q.earliest()
        assert earliest > offs[0]
        with q.consumer_group("g") as g:
            g.seek(0)
            with pytest.raises(k7core.DataLossError) as info:
                g.poll(timeout=0)
            assert info.value.earliest == earliest
        with q.consumer_group("h", on_data_loss="earliest") as h:
            h.seek(offs[1])
            assert h.poll(max_batch=1, timeout=0)[0].offset == earliest


def test_seek_to_what_an_async_writer_wrote_but_not_yet_published(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", fsync="async", commit_interval=10) as q:
        q.sync()
        with q.consumer_group("g") as g:
            offs = q.enqueue_many([b"a", b"b"])
            g.seek(offs[1])  # the writer knows it is a frame boundary
            with pytest.raises(k7core.CursorError, match="inside a frame"):
                g.seek(offs[1] + 8)
            q.sync()
            assert [bytes(m.payload) for m in g.poll(timeout=0)] == [b"b"]


@pytest.mark.parametrize("value", [-8, -(2**63), 2**63 - 1, 0, 4096])
def test_one_cursor_codec_agrees_with_the_kernel(tmp_path: Path, value: int) -> None:
    """What Python tools read from a cursor file (stats, the CLI, Spark) is what the
    group's kernel reads: a big-endian signed int64 at byte 0."""
    _queue_of(tmp_path / "q", 3)
    cursor = tmp_path / "q" / "cursor-g.k7"
    with k7core.Queue(tmp_path / "q") as q:
        q.consumer_group("g").close()
        with open(cursor, "r+b") as f:
            f.write(encode_cursor(value))
        with q.consumer_group("g") as g:
            assert g.committed == value == decode_cursor(cursor.read_bytes())
        assert [gi.committed for gi in q.stats().groups] == [value]


# ---------------------------------------------------------------- after a corrupt frame


def _poll_all(g: k7core.ConsumerGroup, out: list[int]) -> list[int]:
    while batch := g.poll(max_batch=64, timeout=0):
        out += [m.offset for m in batch]
    return out


@pytest.mark.parametrize("damage", ["payload", "length", "last"])
def test_corrupt_frame_hint_names_the_next_valid_frame(tmp_path: Path, damage: str) -> None:
    """The hint used to name the next segment: following it threw away the good frames in
    between. It names the next valid frame now (the search ``k7 verify`` resynchronises
    with), an offset ``seek`` accepts even when the damaged header misleads a header walk."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, segment_size=4096, fsync="flush") as q:
        offs = q.enqueue_many([b"message %03d" % i for i in range(300)])
        end = q.end
        bases = [sg.base for sg in q.stats().segments]
    # in a sealed segment; or the log's last frame, kept as it is by a readonly reader
    k = 299 if damage == "last" else 100
    base = bases[-1] if damage == "last" else bases[0]
    assert base <= offs[k] < (end if damage == "last" else bases[1])
    with open(qdir / f"seg-{base:020d}.k7", "r+b") as f:
        if damage == "length":  # magic intact, a length that leads the walk astray
            f.seek(offs[k] - base + 2)
            f.write((3000).to_bytes(4, "big"))
        else:
            f.seek(offs[k] - base + 10)
            f.write(b"X")
    resume = end if damage == "last" else offs[k + 1]
    with k7core.Queue(qdir, readonly=damage == "last") as q, q.consumer_group("g") as g:
        got: list[int] = []
        with pytest.raises(k7core.CorruptFrameError) as info:
            _poll_all(g, got)
        assert got == offs[:k] and info.value.offset == offs[k]
        assert f"seek to {resume} " in str(info.value)
        with pytest.raises(k7core.CorruptFrameError) as bulk:
            q.read_columnar(offs[k])
        assert bulk.value.hint == info.value.hint  # one reader, one hint
        g.seek(resume)  # accepted
        assert _poll_all(g, []) == offs[k + 1:]
        with pytest.raises(k7core.CursorError, match="damaged at or before it") as refused:
            g.seek(offs[k] + 8)  # past the damage, but not where a frame starts
        assert refused.value.boundary == resume


def test_read_columnar_and_wait_check_their_offsets(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", segment_size=4096, fsync="flush") as q:
        q.enqueue_many([b"a", b"b"])
        for bad, error in ((2**70, ValueError), (-8, ValueError), (True, TypeError),
                           (1.0, TypeError), ("0", TypeError)):
            with pytest.raises(error, match="offset"):
                q.read_columnar(bad)  # type: ignore[arg-type]
        for bad, error in ((2**70, ValueError), (True, TypeError), (0.5, TypeError)):
            with pytest.raises(error, match="after"):
                q.wait(bad, 0)  # type: ignore[arg-type]
        assert q.wait(-1, 0) == q.end and len(q.read_columnar(0)) == 2
