"""A queue written by the real k7 (the JVM library) opens and reads here
(docs/format.md#compatibility-with-k7).

The fixture (``../shared/fixtures/k7-jvm/basic``, see its ``manifest.json``) holds 3,000
messages in four 64 KiB segments written with ``:sync``; group ``workers`` acked exactly the
first 1,000 messages, group ``analytics`` acked nothing. The ``jvm_basic`` fixture gives a
writable copy; the original is never opened.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

import k7core
from tests._queuehelp import drain_to_end, replay, seg_bases, seg_files

SEGMENT_SIZE = 65536


def _payload(i: int) -> bytes:
    """The manifest's payload rule, independently of its message list."""
    return (f"msg-{i}-" + "x" * (i % 97)).encode()


def _open(d: Path, mode: str) -> k7core.Queue:
    if mode == "readonly":
        return k7core.Queue(d, readonly=True)
    return k7core.Queue(d, segment_size=SEGMENT_SIZE, fsync="flush")


def _expected(manifest: dict[str, Any]) -> list[tuple[int, bytes]]:
    return [(int(off), p.encode()) for off, p in manifest["messages"]]


def _log_end(manifest: dict[str, Any]) -> int:
    last = manifest["segments"][-1]
    return int(last["base_offset"]) + int(last["write_pos"])


def test_manifest_is_what_the_tests_assume(jvm_basic: tuple[Path, dict[str, Any]]) -> None:
    d, manifest = jvm_basic
    assert manifest["message_count"] == 3000 == len(manifest["messages"])
    assert manifest["segment_size"] == SEGMENT_SIZE
    assert [p for _, p in _expected(manifest)] == [_payload(i) for i in range(3000)]
    names = seg_files(d)
    assert names == [s["file"] for s in manifest["segments"]]
    assert not any(n.startswith("k7py-") for n in os.listdir(d))  # no position file: JVM-made


@pytest.mark.parametrize("mode", ["writer", "readonly"])
def test_every_message_reads_back(jvm_basic: tuple[Path, dict[str, Any]], mode: str) -> None:
    d, manifest = jvm_basic
    with _open(d, mode) as q:
        assert q.end == _log_end(manifest)
        got = replay(q, max_batch=500)
    assert len(got) == 3000
    assert got == _expected(manifest)


@pytest.mark.parametrize("mode", ["writer", "readonly"])
def test_groups_resume_from_their_jvm_cursors(
    jvm_basic: tuple[Path, dict[str, Any]], mode: str
) -> None:
    d, manifest = jvm_basic
    expected = _expected(manifest)
    with _open(d, mode) as q:
        for name in ("workers", "analytics"):
            committed = manifest["groups"][name]["committed_offset"]
            check = manifest["k7_reopen_check"][name]
            with q.consumer_group(name) as g:
                assert g.committed == committed
                assert g.position == committed
                got = drain_to_end(g, q, max_batch=500)
                assert len(got) == check["delivered_count"]
                assert got[0][0] == check["first_offset"]
                first = check["first_message_index"]
                assert got[0][1] == _payload(first)
                assert got == expected[first:]
                # nothing was acked: the cursor on disk is untouched
                assert g.committed == committed


def test_ack_after_jvm_cursor_is_stored_big_endian(jvm_basic: tuple[Path, dict[str, Any]]) -> None:
    d, manifest = jvm_basic
    expected = _expected(manifest)
    with _open(d, "writer") as q, q.consumer_group("workers", cursor_fsync="sync") as g:
        batch = g.poll(max_batch=10, timeout=1.0)
        assert [m.offset for m in batch] == [o for o, _ in expected[1000:1010]]
        for m in batch:
            g.ack(m)
        assert g.committed == expected[1010][0]
    raw = (d / "cursor-workers.k7").read_bytes()
    assert len(raw) == 4096
    assert int.from_bytes(raw[:8], "big", signed=True) == expected[1010][0]


def test_enqueue_continues_after_jvm_data(jvm_basic: tuple[Path, dict[str, Any]]) -> None:
    d, manifest = jvm_basic
    end = _log_end(manifest)
    expected_last = _expected(manifest)[-1]
    assert end == expected_last[0] + ((10 + len(expected_last[1]) + 7) & ~7)
    new = [b"py-%d-" % i + b"y" * (i * 37 % 1500) for i in range(120)]  # rolls a segment
    with _open(d, "writer") as q:
        offs = [q.enqueue(p) for p in new]
        assert offs[0] == end
        assert offs == sorted(offs) and all(o % 8 == 0 for o in offs)
        got = replay(q, max_batch=500)
    bases = seg_bases(d)
    assert len(bases) > len(manifest["segments"]), "the new messages should roll a segment"
    assert bases[: len(manifest["segments"])] == [s["base_offset"] for s in manifest["segments"]]
    want = [*_expected(manifest), *zip(offs, new, strict=True)]
    assert got == want
    assert got[2999] == expected_last
    # both ways of opening see the JVM data followed by the new messages after a reopen
    for mode in ("readonly", "writer"):
        with _open(d, mode) as q:
            assert q.end == offs[-1] + ((10 + len(new[-1]) + 7) & ~7)
            assert replay(q, "verify-" + mode, max_batch=500) == want
            with q.consumer_group("workers") as g:
                assert g.committed == manifest["groups"]["workers"]["committed_offset"]
                assert drain_to_end(g, q, max_batch=500) == want[1000:]


def test_clean_fixture_logs_no_torn_tail(
    jvm_basic: tuple[Path, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    d, _ = jvm_basic
    before = {n: (d / n).read_bytes() for n in os.listdir(d) if n.startswith("seg-")}
    with caplog.at_level(logging.DEBUG, logger="k7core"):
        with _open(d, "writer") as q:
            assert len(replay(q, max_batch=500)) == 3000
        with _open(d, "readonly") as q:
            assert len(replay(q, max_batch=500)) == 3000
    problems = [
        r for r in caplog.records if r.name.startswith("k7core") and r.levelno >= logging.WARNING
    ]
    assert problems == []
    assert not any(n.startswith("k7py-torn-") for n in os.listdir(d))
    # opening, recovering and reading changed no segment byte
    after = {n: (d / n).read_bytes() for n in os.listdir(d) if n.startswith("seg-")}
    assert after == before
