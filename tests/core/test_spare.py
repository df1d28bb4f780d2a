"""The spare segment: the next segment is prepared in the background and renamed at a roll."""

from __future__ import annotations

from pathlib import Path

import pytest

import k7core
from k7core._format import SPARE_MIN_SIZE, SPARE_SEGMENT, segment_name
from k7core._storage import list_segments
from tests._queuehelp import consume, payloads

SEG = SPARE_MIN_SIZE


def list_segments_names(path: Path) -> list[str]:
    return [segment_name(b) for b in list_segments(path)]


def spare_ready(q: k7core.Queue) -> bool:
    """Wait for the background preparation (white-box), then look at the file."""
    assert q._writer is not None
    spare = q._writer._spare
    assert spare is not None
    spare._join()
    return (q.path / SPARE_SEGMENT).stat().st_size == q.segment_size


@pytest.mark.parametrize("fsync", ["flush", "async", "sync"])
def test_rolls_take_the_spare(tmp_path: Path, fsync: str) -> None:
    path = tmp_path / "q"
    sent = [i.to_bytes(4, "big") * 16_384 for i in range(200)]  # 64 KiB each, ~3 segments
    with k7core.Queue(path, segment_size=SEG, fsync=fsync) as q:
        assert spare_ready(q)
        offsets = [q.enqueue(p) for p in sent[:100]] + q.enqueue_many(sent[100:])
        assert len(list_segments_names(path)) >= 3
        assert spare_ready(q)  # the next one is being prepared again
        assert all((path / n).stat().st_size == SEG for n in list_segments_names(path))
        assert offsets == sorted(offsets)
        assert payloads(consume(q, "check", max_batch=1024)) == sent
    assert not (path / SPARE_SEGMENT).exists()  # close removes it
    with k7core.Queue(path, segment_size=SEG, readonly=True) as q:
        assert payloads(consume(q, "again", max_batch=1024)) == sent


def test_a_spare_left_by_a_crash_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with k7core.Queue(path, segment_size=SEG, fsync="flush") as q:
        q.enqueue(b"before")
    (path / SPARE_SEGMENT).write_bytes(b"\xff" * 4096)  # garbage under the spare's name
    with k7core.Queue(path, segment_size=SEG, fsync="flush") as q:
        assert spare_ready(q)
        big = b"z" * (SEG // 2)
        q.enqueue(big)
        q.enqueue(big)  # rolls into the (fresh, all-zero) spare
        q.enqueue(b"after")
        assert payloads(consume(q, "check", max_batch=1024)) == [b"before", big, big, b"after"]
        assert len(list_segments(path)) == 2


def test_small_segments_have_no_spare(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", segment_size=4096) as q:
        for i in range(200):
            q.enqueue(b"%d" % i * 10)
        assert not (tmp_path / "q" / SPARE_SEGMENT).exists()
