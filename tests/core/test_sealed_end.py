"""Directories written the way k7 on the JVM writes them (``_jvmlike``): a sealed segment
ends where the next one begins, whatever bytes follow that point in its file; sparse segment
files with one zero byte at the end are not mistaken for a torn tail."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import k7core
from k7core.cli import cli
from tests._queuehelp import consume, encode_frame, read_records, records, seg_bases, seg_name
from tests.core import _jvmlike

SEGMENT = 4096


def _bytes_after_seal(qdir: Path) -> dict[int, int]:
    """For every sealed segment: how many non-zero bytes its file holds past its seal."""
    bases = seg_bases(qdir)
    out = {}
    for base, nxt in itertools.pairwise(bases):
        tail = (qdir / seg_name(base)).read_bytes()[nxt - base :]
        out[base] = len(tail.rstrip(b"\0"))
    return out


@pytest.fixture
def torn_then_jvm(tmp_path: Path) -> tuple[Path, list[tuple[int, bytes]]]:
    """k7py writes 30 messages and dies in the middle of a long frame (a torn tail); k7 on
    the JVM opens the directory, recovers without zeroing, appends 1,000 messages (rolling)
    and rolls twice more. Stale bytes of the torn frame stay after the sealed end."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, segment_size=SEGMENT, fsync="flush") as q:
        sent = [(q.enqueue(b"py-%d" % i), b"py-%d" % i) for i in range(30)]
        end = q.end
    torn = encode_frame(b"T" * 3500)[: 10 + 3200]  # header + 3,200 of 3,500 bytes
    with open(qdir / "seg-00000000000000000000.k7", "r+b") as f:
        f.seek(end)
        f.write(torn)
    # three long ones first: the JVM's first segment fills (and is sealed) inside the torn
    # frame's bytes
    payloads = [b"jvm-%04d-" % i + b"j" * (40 + 900 * (i < 3 or i % 2)) for i in range(1000)]
    sent += list(zip(_jvmlike.append(qdir, payloads, SEGMENT), payloads, strict=True))
    _jvmlike.roll(qdir, SEGMENT)
    _jvmlike.roll(qdir, SEGMENT)
    assert sum(_bytes_after_seal(qdir).values()) > 0, "the fixture has no stale bytes"
    return qdir, sent


@pytest.mark.parametrize("mode", ["readonly", "writer"])
def test_reader_stops_at_the_sealed_end(
    torn_then_jvm: tuple[Path, list[tuple[int, bytes]]], mode: str
) -> None:
    qdir, sent = torn_then_jvm
    with k7core.Queue(qdir, readonly=mode == "readonly", segment_size=SEGMENT,
                      fsync="flush") as q:
        assert records(consume(q, "check", max_batch=500)) == sent
        assert read_records(q, max_messages=100) == sent
        if mode == "writer":
            off = q.enqueue(b"after")
            assert off == q.end - k7core.frame_size(5) and off > sent[-1][0]


def test_a_valid_frame_past_the_sealed_end_is_never_delivered(
    torn_then_jvm: tuple[Path, list[tuple[int, bytes]]],
) -> None:
    """Stale bytes can hold a whole valid frame (a JVM writer crashed after writing it but
    before its position moved on); it is not part of the log."""
    qdir, sent = torn_then_jvm
    bases = seg_bases(qdir)
    base, nxt = bases[1], bases[2]
    with open(qdir / seg_name(base), "r+b") as f:
        f.seek(nxt - base)
        f.write(encode_frame(b"ghost"))
    with k7core.Queue(qdir, readonly=True) as q:
        got = records(consume(q, "check", max_batch=500))
        assert b"ghost" not in [p for _, p in got]
        assert got == sent


def test_verify_reports_bytes_past_the_seal_without_failing(
    torn_then_jvm: tuple[Path, list[tuple[int, bytes]]],
) -> None:
    qdir, sent = torn_then_jvm
    result = CliRunner().invoke(cli, ["verify", str(qdir)])
    assert result.exit_code == 0, result.output
    assert "after its sealed end" in result.output and "never read" in result.output
    assert f"ok: {len(sent):,} frames" in result.output


@pytest.mark.parametrize("segment_size", [64 << 10, 64 << 20])
def test_writer_opening_a_sparse_jvm_segment_cuts_nothing(
    tmp_path: Path, segment_size: int
) -> None:
    """The JVM creates a segment as a sparse file with one zero byte at its end: that
    all-zero data block is not a torn tail (no event, no side file, no warning)."""
    qdir = tmp_path / "q"
    payloads = [b"m%d" % i for i in range(3)]
    offs = _jvmlike.append(qdir, payloads, segment_size)
    path = qdir / "seg-00000000000000000000.k7"
    assert os.stat(path).st_blocks * 512 < segment_size // 2, "the segment is not sparse"
    with k7core.Queue(qdir, segment_size=segment_size, fsync="flush") as q:
        assert [e.kind for e in q.stats().recovery_events] == []
        assert q.enqueue(b"next") == q.end - k7core.frame_size(4)
        assert read_records(q, max_messages=100)[:3] == list(zip(offs, payloads, strict=True))
    assert [p.name for p in qdir.iterdir() if p.name.startswith("k7py-torn")] == []
