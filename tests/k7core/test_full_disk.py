"""A real full filesystem (a small loop-mounted ext4 image, or a small tmpfs): segment
creation fails with ENOSPC at rolls and at open, and nothing is lost or handed out twice.

A roll that fails leaves no file behind, so smaller messages still written into the current
segment keep offsets no later segment claims; after a reopen, and after space comes back and
rolls succeed again (with retention on), every offset ever returned is read back with its
payload, by the consumer that was acking along and by a new group reading from the earliest.

Mounting needs root (the suite runs as root in CI); elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import array
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import drain, message, read_records, records, seg_files

SEGMENT = 64 << 10


def _mount(kind: str, size_mb: int) -> tuple[Path, Path | None]:
    top = Path(tempfile.mkdtemp(prefix=f"k7-full-{kind}-"))
    mnt = top / "mnt"
    mnt.mkdir()
    image = None
    if kind == "ext4":
        image = top / "fs.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        cmds = [["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                ["mount", "-o", "loop", str(image), str(mnt)]]
    else:
        cmds = [["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt)]]
    for cmd in cmds:
        try:
            subprocess.run(cmd, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            shutil.rmtree(top)
            detail = exc.stderr.decode().strip() if isinstance(
                exc, subprocess.CalledProcessError) else str(exc)
            pytest.skip(f"cannot mount a small {kind} ({' '.join(cmd[:2])}): {detail}")
    return mnt, image


@pytest.fixture(params=["ext4", "tmpfs"])
def small_fs(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A mounted filesystem of a few MiB, unmounted and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mnt, _ = _mount(str(request.param), 24)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
        shutil.rmtree(mnt.parent, ignore_errors=True)


def _fill_disk(mnt: Path, leave: int) -> Path:
    """Take every free byte of ``mnt`` but ``leave`` with one file; return it."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for _ in range(10):  # a writer's spare segment may be taking blocks meanwhile
            st = os.statvfs(mnt)
            want = os.fstat(fd).st_size + st.f_bavail * st.f_frsize - leave
            try:
                os.posix_fallocate(fd, 0, max(4096, want))
                return filler
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    raise AssertionError(f"could not fill {mnt}")


class Log:
    """What the writer returned: offsets strictly increasing, each with its payload."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []
        self.failed = 0

    def put(self, q: k7core.Queue, payload: bytes) -> bool:
        try:
            off = q.enqueue(payload)
        except k7core.StorageError as exc:
            assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
            self.failed += 1
            return False
        assert not self.sent or off > self.sent[-1][0], "an offset was handed out twice"
        self.sent.append((off, payload))
        return True


def _drain(g: k7core.ConsumerGroup, q: k7core.Queue) -> list[tuple[int, bytes]]:
    q.sync()  # "async": what was enqueued becomes visible now
    got = records(drain(g, ack="batch"))
    assert g.position >= q.end, f"group stuck at {g.position} below end {q.end}"
    return got


@pytest.mark.parametrize("fsync", ["flush", "sync", "async"])
def test_rolls_on_a_full_disk_lose_nothing(small_fs: Path, fsync: str) -> None:
    qdir = small_fs / "q"
    log = Log()
    consumed: list[tuple[int, bytes]] = []
    opts = {"segment_size": SEGMENT, "fsync": fsync, "retention": "consumed"}
    with k7core.Queue(qdir, **opts) as q, q.consumer_group("g") as g:  # type: ignore[arg-type]
        filler = _fill_disk(small_fs, SEGMENT // 2)
        i = 0
        # big messages until rolls fail, then small ones that still fit the segment
        while log.failed < 3:
            log.put(q, message(i, 3000))
            i += 1
        small = 0
        while log.put(q, message(i, 100)):
            i += 1
            small += 1
        assert small > 10, "nothing was written after the failed rolls"
        consumed += _drain(g, q)
        files = seg_files(qdir)
    assert not any(p.name.startswith("k7py-spare") for p in qdir.iterdir())
    # reopen, still full: the writer goes on after the last returned offset
    with k7core.Queue(qdir, **opts) as q, q.consumer_group("g") as g:  # type: ignore[arg-type]
        assert seg_files(qdir) == files
        assert q.end == log.sent[-1][0] + k7core.frame_size(100)
        for _ in range(5):
            log.put(q, message(i, 10))
            i += 1
        consumed += _drain(g, q)
    # space comes back: rolls succeed, retention deletes what the group consumed
    filler.unlink()
    with k7core.Queue(qdir, **opts) as q, q.consumer_group("g") as g:  # type: ignore[arg-type]
        for _ in range(200):
            assert log.put(q, message(i, 1500))
            i += 1
            if i % 50 == 0:
                consumed += _drain(g, q)
        consumed += _drain(g, q)
        earliest = q.earliest()
        assert earliest > 0, "retention deleted nothing"
        with q.consumer_group("audit") as audit:
            audited = _drain(audit, q)
    assert consumed == log.sent, "the acking group did not get every returned message once"
    assert audited == [(o, p) for o, p in log.sent if o >= earliest]
    with k7core.Queue(qdir, readonly=True) as q:
        assert len(read_records(q, earliest)) == len(audited)


def test_spare_segments_on_a_full_disk(small_fs: Path) -> None:
    """Segments of 4 MiB are prepared in the background (the spare): a spare that cannot be
    preallocated leaves no file, and the roll after it fails cleanly too."""
    qdir = small_fs / "q"
    log = Log()
    seg = 4 << 20
    with k7core.Queue(qdir, segment_size=seg, fsync="flush") as q:
        _fill_disk(small_fs, seg // 2)
        i = 0
        while log.failed < 2:
            log.put(q, message(i, 60_000))
            i += 1
        while log.put(q, message(i, 100)):
            i += 1
    names = sorted(p.name for p in qdir.iterdir())
    assert not any("spare" in n for n in names), names
    with k7core.Queue(qdir, segment_size=seg, fsync="flush") as q:
        assert read_records(q) == log.sent


def test_first_segment_that_does_not_fit_leaves_nothing(small_fs: Path) -> None:
    before = shutil.disk_usage(small_fs).used
    qdir = small_fs / "q"
    with pytest.raises(k7core.StorageError, match="preallocate") as info:
        k7core.Queue(qdir, segment_size=64 << 20)
    assert info.value.errno == errno.ENOSPC
    assert seg_files(qdir) == []
    assert shutil.disk_usage(small_fs).used <= before + (64 << 10)  # the small files only
    with k7core.Queue(qdir, segment_size=SEGMENT) as q:  # a smaller one fits
        assert q.enqueue(b"x") == 0


def test_absurd_segment_size_is_refused_up_front(small_fs: Path) -> None:
    """On the small filesystem: an implementation that tried would fill only that one."""
    for size in (2**40, 2**31):
        with pytest.raises(ValueError, match="at most 2147483640"):
            k7core.Queue(small_fs / "q", segment_size=size)
    assert not (small_fs / "q").exists()


def test_stray_last_segment_from_a_failed_roll_is_not_taken_as_the_end(tmp_path: Path) -> None:
    """A directory left by an older writer: a roll created ``seg-B`` and failed, the writer
    went on in the segment before it past ``B``. The next open must not restart at ``B``."""
    qdir = tmp_path / "q"
    with k7core.Queue(qdir, segment_size=4096, fsync="flush") as q:
        offs = q.enqueue_many([message(i, 100) for i in range(20)])
    assert seg_files(qdir) == ["seg-00000000000000000000.k7"]
    stray = offs[10]
    with open(qdir / f"seg-{stray:020d}.k7", "wb") as f:
        f.truncate(4096)  # what a half-done creation leaves: zeros
    with k7core.Queue(qdir, segment_size=4096, fsync="flush") as q:
        assert q.end == offs[-1] + k7core.frame_size(100)
        nxt = q.enqueue(b"after")
        assert nxt == q.end - k7core.frame_size(5) and nxt > offs[-1]
        events = [e.kind for e in q.stats().recovery_events]
        assert "stray-segment-removed" in events
    assert seg_files(qdir) == ["seg-00000000000000000000.k7"]
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("g") as g:
        got = [m.offset for m in g.poll(max_batch=100, timeout=0)]
        assert got == [*offs, nxt]


@pytest.mark.parametrize("how", ["enqueue_many", "enqueue_columnar"])
def test_a_batch_cut_by_a_full_disk_says_what_it_wrote(small_fs: Path, how: str) -> None:
    """A batch that spans segments is written up to the roll the full disk refuses: the
    error lists the offsets of the messages written (``.written``) and says to retry only
    the others, so a retry never doubles them."""
    qdir = small_fs / "q"
    items = [message(i, 200) for i in range(2000)]  # several segments' worth
    with k7core.Queue(qdir, segment_size=SEGMENT, fsync="flush") as q:
        q.enqueue(b"first")
        _fill_disk(small_fs, 4096)
        with pytest.raises(k7core.StorageError) as info:
            if how == "enqueue_many":
                q.enqueue_many(items)
            else:
                ends = array.array("q", [0])
                for it in items:
                    ends.append(ends[-1] + len(it))
                q.enqueue_columnar(b"".join(items), ends)
        written = info.value.written
        assert 0 < len(written) < len(items)
        assert f"the first {len(written)} of the {len(items)} messages" in str(info.value)
        with q.consumer_group("g") as g:
            got = g.poll(max_batch=len(items) + 1, timeout=0)
        assert [bytes(m.payload) for m in got] == [b"first", *items[:len(written)]]
        assert [m.offset for m in got[1:]] == list(written)


@pytest.mark.parametrize("writers", ["exclusive", "shared"])
@pytest.mark.parametrize("policy", ["consumed", "bytes", "age"])
def test_roll_on_a_full_disk_frees_what_retention_allows_first(
    small_fs: Path, policy: str, writers: str
) -> None:
    """The disk is full when the segment being written fills, and retention may delete a
    sealed segment (consumed since the last roll, over the byte limit with the new segment
    counted, or aged since): the roll deletes it first and succeeds, so appends go on."""
    qdir = small_fs / "q"
    policies: dict[str, dict[str, object]] = {
        "consumed": {"retention": "consumed"}, "bytes": {"retention_bytes": 2 * SEGMENT},
        "age": {"retention_age": 3600.0},
    }
    opts = {"segment_size": SEGMENT, "fsync": "flush", "writers": writers, **policies[policy]}
    log = Log()
    with k7core.Queue(qdir, **opts) as q, q.consumer_group("g") as g:  # type: ignore[arg-type]
        i = 0
        while len(seg_files(qdir)) < 2:  # one sealed segment that no policy deletes yet
            assert log.put(q, message(i, 1000))
            i += 1
        first = qdir / seg_files(qdir)[0]
        _fill_disk(small_fs, SEGMENT // 2)
        if policy == "consumed":
            _drain(g, q)
        elif policy == "age":
            old = first.stat().st_mtime - 7200
            os.utime(first, (old, old))
        for _ in range(SEGMENT // 1000 + 2):  # one roll: past the end of the segment written
            assert log.put(q, message(i, 1000)), f"append {i} failed on the full disk"
            i += 1
        assert not first.exists()
        assert len(seg_files(qdir)) == 2
        assert q.earliest() > 0
    with k7core.Queue(qdir, readonly=True) as q:
        assert read_records(q, q.earliest()) == [r for r in log.sent if r[0] >= q.earliest()]
