"""The k7 source reads a group's stored cursor with the core's codec and check: a damaged
cursor (negative, past the end, inside a frame) is a CursorError, as the group's own poll
says, not a silent empty or wrong read. The readers are called directly: no Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import StructType

import k7core
from k7core._format import encode_cursor
from k7core.spark import K7BatchReader, K7StreamReader


def _queue_with_group(path: Path) -> list[int]:
    with k7core.Queue(path, fsync="flush", segment_size=4096) as q:
        offs = q.enqueue_many([b"m%d" % i for i in range(50)])
        with q.consumer_group("g") as g:
            g.seek(offs[10])
        return offs


def _starts(path: Path) -> tuple[int, int]:
    options = {"path": str(path), "group": "g"}
    batch = K7BatchReader(options, StructType())
    return batch.start, K7StreamReader(options, StructType()).initialOffset()["offset"]


def test_a_valid_group_cursor_is_where_both_readers_start(tmp_path: Path) -> None:
    offs = _queue_with_group(tmp_path / "q")
    assert _starts(tmp_path / "q") == (offs[10], offs[10])


@pytest.mark.parametrize("where", ["negative", "beyond", "inside"])
def test_a_damaged_group_cursor_is_a_cursor_error(tmp_path: Path, where: str) -> None:
    path = tmp_path / "q"
    offs = _queue_with_group(path)
    with k7core.Queue(path, readonly=True) as q:
        end = q.end
    bad = {"negative": -8, "beyond": end + 4096, "inside": offs[3] + 8}[where]
    with open(path / "cursor-g.k7", "r+b") as f:
        f.write(encode_cursor(bad))
    with k7core.Queue(path, readonly=True) as q, q.consumer_group("g") as g, pytest.raises(
        k7core.CursorError
    ) as polled:
        g.poll(timeout=0)
    for read in (lambda: K7BatchReader({"path": str(path), "group": "g"}, StructType()),
                 lambda: K7StreamReader({"path": str(path), "group": "g"},
                                        StructType()).initialOffset()):
        with pytest.raises(k7core.CursorError) as info:
            read()
        assert str(info.value) == str(polled.value) and info.value.offset == bad
