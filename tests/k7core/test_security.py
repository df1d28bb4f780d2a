"""Files of a queue: created owner-only (or with ``file_mode``), never opened through a
symbolic link. See docs/security.md."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core


@pytest.fixture
def umask() -> Iterator[int]:
    old = os.umask(0o022)
    try:
        yield 0o022
    finally:
        os.umask(old)


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.lstat().st_mode) for p in directory.iterdir()}


@pytest.mark.parametrize("fsync", ["flush", "sync"])
def test_files_are_created_owner_only(tmp_path: Path, umask: int, fsync: str) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync=fsync, segment_size=4096) as q:
        q.enqueue_many([b"x" * 100] * 100)  # several segments
        with q.consumer_group("g") as g:
            g.ack_many(g.poll(max_batch=10, timeout=0))
    modes = _modes(qdir)
    assert len([n for n in modes if n.startswith("seg-")]) > 1
    assert {"cursor-g.k7", "k7py-position", "k7py-writer.lock"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_file_mode_shares_with_a_group(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        qdir = tmp_path / "q"
        with k7core.Queue(qdir, fsync="flush", segment_size=4096, file_mode=0o660) as q:
            q.enqueue_many([b"y" * 100] * 100)
            q.consumer_group("g").close()
    finally:
        os.umask(old)
    assert set(_modes(qdir).values()) == {0o660}


@pytest.mark.parametrize(("mode", "error"), [
    (0o644 & ~0o200, ValueError), (0o1777, ValueError), (-1, ValueError), ("0o600", TypeError),
])
def test_bad_file_mode(tmp_path: Path, mode: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="file_mode"):
        k7core.Queue(tmp_path / "q", file_mode=mode)  # type: ignore[arg-type]


def test_cursor_symlink_is_refused(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    victim = tmp_path / "victim"
    victim.write_bytes(b"do not touch")
    k7core.Queue(qdir, fsync="flush", segment_size=4096).close()
    (qdir / "cursor-g.k7").symlink_to(victim)
    with k7core.Queue(qdir, fsync="flush", segment_size=4096) as q:
        with pytest.raises(k7core.StorageError, match="symbolic link") as info:
            q.consumer_group("g")
        assert info.value.path == str(qdir / "cursor-g.k7")
    assert victim.read_bytes() == b"do not touch"


def test_segment_symlink_is_refused(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, fsync="flush", segment_size=4096) as q:
        q.enqueue(b"z")
    victim = tmp_path / "victim"
    seg = qdir / "seg-00000000000000000000.k7"
    seg.rename(victim)
    seg.symlink_to(victim)
    with pytest.raises(k7core.StorageError, match="symbolic link"):
        k7core.Queue(qdir, fsync="flush", segment_size=4096)
    with pytest.raises(k7core.StorageError, match="symbolic link"):
        k7core.Queue(qdir, readonly=True)
