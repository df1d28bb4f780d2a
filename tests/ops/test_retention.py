"""Retention ("consumed", bytes, age), DataLossError / on_data_loss, crashes mid-retention,
readers in other processes that are behind, and remove_when_empty."""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path

import pytest

import k7core
from tests._childproc import Child
from tests._queuehelp import fill, message, payload, read_records, seg_bases, seg_name

SEG = 4096
FRAME = 112  # a 100-byte payload


def test_consumed_deletes_only_what_every_group_committed(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention="consumed") as q:
        a, b = q.consumer_group("a"), q.consumer_group("b")
        offs = fill(q, 36 * 5)  # 36 frames per segment: 5 full segments, rolled 4 times
        assert seg_bases(tmp_path) == [36 * FRAME * k for k in range(5)]  # nobody acked yet
        a.ack_many(a.poll(max_batch=36 * 4))
        b.ack_many(b.poll(max_batch=36 * 2 + 5))  # b is 5 frames into the third segment
        assert q.enforce_retention() == [0, 36 * FRAME]
        assert seg_bases(tmp_path) == [36 * FRAME * k for k in range(2, 5)]
        st = q.stats()
        assert st.earliest_offset == 2 * 36 * FRAME and st.retention_deleted_segments == 2
        assert st.retention_deleted_bytes == 2 * SEG
        assert q.enforce_retention() == []
        b.ack_many(b.poll(max_batch=200))
        fill(q, 36)  # a roll: retention runs there too
        assert seg_bases(tmp_path)[0] == 4 * 36 * FRAME  # a is at the end of segment 3
        assert [p for _, p in read_records(q, q.earliest())][:1] == [message(144)]
        assert len(offs) == 180


def test_consumed_without_any_group_deletes_nothing(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention="consumed") as q:
        fill(q, 200)
        assert q.enforce_retention() == [] and len(seg_bases(tmp_path)) == 6


def test_byte_limit_deletes_unconsumed_oldest_first_and_readers_get_data_loss(
    tmp_path: Path,
) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush",
                      retention_bytes=3 * SEG) as q:
        g = q.consumer_group("slow")
        j = q.consumer_group("jumper", on_data_loss="earliest")
        first = g.poll(max_batch=1, timeout=0)
        assert first == []
        fill(q, 36 * 6)  # 6 full segments + a new one after the last roll? no: 6 segments
        bases = seg_bases(tmp_path)
        assert len(bases) == 3 and sum(os.path.getsize(tmp_path / seg_name(b))
                                       for b in bases) <= 3 * SEG
        assert bases[-1] == 5 * 36 * FRAME  # the segment being written is kept
        with pytest.raises(k7core.DataLossError) as ei:
            g.poll(max_batch=10, timeout=0)
        assert ei.value.offset == 0 and ei.value.earliest == bases[0]
        assert "retention" in str(ei.value) and ei.value.hint
        assert g.committed == 0  # nothing moved
        g.seek(ei.value.earliest)
        assert g.poll(max_batch=1)[0].offset == bases[0]
        msgs = j.poll(max_batch=5, timeout=0)
        assert [m.offset for m in msgs] == [bases[0] + FRAME * i for i in range(5)]
        st = j.stats()
        assert st.data_loss_jumps == 1 and st.skipped_bytes == bases[0]
        assert st.earliest_offset == bases[0] and j.committed == bases[0]
        # a new group starts at the earliest offset, not at a deleted 0
        with q.consumer_group("late") as late:
            assert late.committed == bases[0] and late.poll(max_batch=1)[0].offset == bases[0]
    # the limit can drop below one segment: only the current one stays
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention_bytes=0) as q:
        assert seg_bases(tmp_path) == bases[-1:]  # applied at open
        assert q.stats().retention_deleted_segments == len(bases) - 1
        off = q.enqueue(b"after")
        assert read_records(q, q.earliest())[-1] == (off, b"after")
        fill(q, 36 * 2)
        assert len(seg_bases(tmp_path)) == 1  # and at every roll


def test_age_limit(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention_age=600) as q:
        fill(q, 36 * 4)
        bases = seg_bases(tmp_path)
        assert len(bases) == 4 and q.enforce_retention() == []
        old = time.time() - 3600
        for b in bases[:2]:
            os.utime(tmp_path / seg_name(b), (old, old))
        assert q.enforce_retention() == bases[:2]
        for b in bases[2:]:  # the segment being written is never deleted
            os.utime(tmp_path / seg_name(b), (old, old))
        assert q.enforce_retention() == [bases[2]] and seg_bases(tmp_path) == bases[-1:]


def test_reopen_after_retention(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention_bytes=2 * SEG) as q:
        q.consumer_group("g").close()  # created at 0, before retention deleted anything
        offs = fill(q, 36 * 4 + 3)
    bases = seg_bases(tmp_path)
    assert bases == [3 * 36 * FRAME, 4 * 36 * FRAME]
    for kw in ({"readonly": True}, {"segment_size": SEG, "fsync": "flush"}):
        with open(tmp_path / "cursor-g.k7", "r+b") as f:
            f.write(bytes(8))  # committed 0 again (the jump below commits the earliest)
        with k7core.Queue(tmp_path, **kw) as q:
            assert q.earliest() == bases[0] and q.stats().earliest_offset == bases[0]
            got = read_records(q, q.earliest())
            assert [o for o, _ in got] == offs[36 * 3 :]
            with pytest.raises(k7core.DataLossError), q.consumer_group("g") as g:
                g.poll(timeout=0)
            with q.consumer_group("g", on_data_loss="earliest") as g:
                assert g.poll(max_batch=1)[0].offset == bases[0]
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        assert q.enqueue(b"x") == offs[-1] + FRAME


def test_bad_retention_arguments(tmp_path: Path) -> None:
    for kw in ({"retention": "all"}, {"retention_bytes": -1}, {"retention_age": -1.0}):
        with pytest.raises(ValueError):
            k7core.Queue(tmp_path, **kw)
    with pytest.raises(TypeError, match="retention_bytes must be an int"):
        k7core.Queue(tmp_path, retention_bytes=1.5)  # type: ignore[arg-type]
    with k7core.Queue(tmp_path, fsync="flush", segment_size=SEG) as q, pytest.raises(ValueError):
        q.consumer_group("g", on_data_loss="skip")
    with k7core.Queue(tmp_path, readonly=True) as q, pytest.raises(k7core.ReadOnlyError):
        q.enforce_retention()


# ------------------------------------------------------------------ two processes


@pytest.mark.parametrize("deleted", [1, 2])
def test_readonly_reader_behind_keeps_its_mapped_segment(tmp_path: Path, deleted: int) -> None:
    """A reader in another process holds segment 0 mapped when the writer deletes it: it
    reads on to its end, then crosses to segment 1, or gets DataLossError if that was
    deleted too."""
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        n = 0
        while len(seg_bases(tmp_path)) < 3 or n % 7:
            q.enqueue(payload(n))
            n += 1
        before = seg_bases(tmp_path)
        with Child("lag-reader", str(tmp_path), "r") as child:
            assert child.line() == b"first 0"  # the reader has mapped segment 0
            assert q.delete_before(before[deleted]) == before[:deleted]
            assert seg_bases(tmp_path) == before[deleted:]
            child.send("go")
            line = child.line().decode().split()
            assert child.wait() == 0, child.stderr()
    if deleted == 1:
        assert line == ["read", str(n), str(n - 1)], line
    else:
        assert line == ["dataloss", str(before[1]), str(before[2])], line


# ------------------------------------------------------------------ crashes


def check_log(d: Path, reported: dict[int, int]) -> tuple[int, int]:
    """Reopen as writer: the log must be the contiguous run of messages ``k .. last``,
    starting at the first remaining segment; every reported offset still in the log holds
    its message. Returns (first index, last index)."""
    with k7core.Queue(d, segment_size=SEG, fsync="flush") as q:
        bases = seg_bases(d)
        assert q.earliest() == bases[0] == q.stats().earliest_offset
        got = read_records(q, bases[0])
        if not got:
            return 0, -1
        assert got[0][0] == bases[0]
        first = int(got[0][1][1:9])
        for k, (off, data) in enumerate(got):
            assert data == payload(first + k), (off, data[:12])
            if first + k in reported:
                assert reported[first + k] == off
        for i, off in reported.items():  # "flush" survives a SIGKILL: nothing reported lost
            if off >= bases[0]:
                assert first <= i < first + len(got)
        return first, first + len(got) - 1


def test_sigkill_during_retention_leaves_a_consistent_log(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("K7_CRASH_SEED", "7")))
    reported: dict[int, int] = {}
    last = -1
    for rnd in range(12):
        # alternate a large and a small limit: the small one deletes several segments at
        # open, the large one one per roll; the kill lands anywhere, between deletions too
        limit = (8 if rnd % 2 == 0 else 2) * SEG
        with Child("retain", str(tmp_path), str(SEG), str(limit)) as child:
            assert child.line() == b"opening"
            kill_after = rng.choice([0, 0, 1, rng.randint(1, 400)])
            for _ in range(kill_after):
                child.line()
            lines = child.kill_and_drain()
        for ln in lines:
            parts = ln.split()
            if parts[0] == b"ready":
                assert int(parts[2]) == last + 1, (rnd, ln)
            elif parts[0] != b"opening":
                reported[int(parts[0])] = int(parts[1])
        first, last = check_log(tmp_path, reported)
        assert len(seg_bases(tmp_path)) <= max(8, 2) + 1
    assert last > 100 and first > 0  # it wrote a lot and retention deleted the start


def test_every_prefix_of_a_deletion_reopens_consistently(tmp_path: Path) -> None:
    """The states a crash between oldest-first unlinks can leave, made by hand."""
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush") as q:
        q.enqueue_many([payload(i) for i in range(300)])
    bases = seg_bases(tmp_path)
    assert len(bases) >= 6
    for k in range(1, len(bases)):
        os.unlink(tmp_path / seg_name(bases[k - 1]))
        _, last = check_log(tmp_path, {})
        assert last == 299 and seg_bases(tmp_path)[0] == bases[k]


# ------------------------------------------------------------------ remove_when_empty


def test_remove_when_empty(tmp_path: Path) -> None:
    d = tmp_path / "q"
    with k7core.Queue(d, segment_size=SEG, fsync="flush", remove_when_empty=True) as q:
        fill(q, 100)
        with q.consumer_group("a") as a, q.consumer_group("b") as b:
            a.ack_many(a.poll(max_batch=100))
            b.ack_many(b.poll(max_batch=99))
    assert d.exists() and len(seg_bases(d)) == 3  # b has one message left
    with k7core.Queue(d, segment_size=SEG, fsync="flush", remove_when_empty=True) as q:
        with q.consumer_group("b") as b:
            b.ack_many(b.poll(max_batch=10))
        ro = k7core.Queue(d, readonly=True)
        held = ro.consumer_group("a")  # owned by someone else at close: keep everything
    assert d.exists()
    held.close()
    ro.close()
    with k7core.Queue(d, segment_size=SEG, fsync="flush", remove_when_empty=True):
        pass
    assert not d.exists()
    # no group: removed only when the log holds no message
    with k7core.Queue(d, segment_size=SEG, fsync="flush", remove_when_empty=True):
        pass
    assert not d.exists()
    with k7core.Queue(d, segment_size=SEG, fsync="flush", remove_when_empty=True) as q:
        q.enqueue(b"x")
    assert seg_bases(d) == [0]


def test_a_failed_deletion_never_fails_a_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with k7core.Queue(tmp_path, segment_size=SEG, fsync="flush", retention_age=3600) as q:
        fill(q, 36 * 3)
        first = tmp_path / "seg-00000000000000000000.k7"
        first.rename(tmp_path / "moved")
        first.mkdir()  # unlink() of a directory fails (EISDIR), even for root
        old = time.time() - 7200
        os.utime(first, (old, old))  # the age limit applies to it
        with caplog.at_level(logging.WARNING, "k7core"):
            offs = fill(q, 36 * 2)  # rolls: retention runs, fails, the writes go on
        assert offs[-1] == (36 * 5 - 1) * FRAME
        assert "retention could not delete seg-00000000000000000000.k7" in caplog.text
        assert q.stats().retention_deleted_segments == 0 and first.is_dir()
        first.rmdir()
        sealed = [36 * FRAME * k for k in range(1, 4)]
        for b in sealed:
            os.utime(tmp_path / seg_name(b), (old, old))
        assert q.enforce_retention() == sealed  # not the current
