"""What the ``k7`` command line tells a first-time user: hints in its own terms (commands and
flags, never the Python API's ``readonly=True``, ``seek(N)`` or ``segment_size``), refusals
that say what to do, a note under a ``?`` lag, thousands separators in counts."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import CLI_SEG, k7, offsets_of, seg_bases, seg_paths

PYTHON_WORDS = ("readonly=True", "readonly Queue", "segment_size", "seek(", "on_data_loss")


def said(r: subprocess.CompletedProcess[bytes]) -> str:
    return (r.stdout + r.stderr).decode()


def no_python_api(text: str) -> None:
    assert not [w for w in PYTHON_WORDS if w in text], text


# ---------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("extra", [[], ["--follow"], ["--group", "a"]])
def test_tail_from_past_the_end_is_refused(qdir: Path, extra: list[str]) -> None:
    with k7core.Queue(qdir, readonly=True) as q:
        end = q.end
    r = k7("tail", qdir, "--from", "99999999", *extra)
    assert r.returncode == 2 and r.stdout == b"", said(r)
    err = r.stderr.decode()
    assert f"offset 99999999 is past the end of the log ({end})" in err, err
    assert "--from latest --follow" in err
    r = k7("tail", qdir, "--from", str(end))  # the end itself: nothing yet, not an error
    assert r.returncode == 0 and r.stdout == b"", said(r)


@pytest.mark.parametrize("make", ["missing", "empty directory"])
def test_produce_where_there_is_no_queue_suggests_create(tmp_path: Path, make: str) -> None:
    d = tmp_path / "new"
    if make == "empty directory":
        d.mkdir()
    r = k7("produce", d, stdin=b"x\n")
    assert r.returncode == 3, said(r)
    assert "add --create to create a new queue there" in r.stderr.decode()
    assert k7("produce", d, "--create", stdin=b"x\n").returncode == 0


def test_group_seek_takes_a_negative_number_as_the_offset(qdir: Path) -> None:
    r = k7("group", qdir, "seek", "a", "-8")
    assert r.returncode == 2, said(r)
    assert "No such option" not in said(r)
    assert "Invalid value for OFFSET: an offset is >= 0" in r.stderr.decode()


# ---------------------------------------------------------------------------------- hints


def test_a_locked_queue_names_the_reading_commands(qdir: Path) -> None:
    with k7core.Queue(qdir, segment_size=CLI_SEG):
        r = k7("produce", qdir, stdin=b"x\n")
    assert r.returncode == 3 and "QueueLockedError" in said(r)
    assert "`k7 info`, `k7 tail` and `k7 verify` read a queue while it is written" in said(r)
    no_python_api(said(r))


def test_a_message_too_large_names_the_segment_size_flag(qdir: Path) -> None:
    r = k7("produce", qdir, stdin=b"x" * (2 * CLI_SEG) + b"\n")
    assert r.returncode == 3 and "MessageTooLargeError" in said(r)
    assert "a larger --segment-size" in said(r)
    no_python_api(said(r))


def test_a_bad_cursor_names_the_group_seek_command(qdir: Path) -> None:
    offs = offsets_of(qdir)
    with open(qdir / "cursor-a.k7", "r+b") as f:
        f.write((offs[60] + 4).to_bytes(8, "big"))
    with k7core.Queue(qdir, readonly=True) as q:
        end = q.end
    r = k7("tail", qdir, "--group", "a")
    assert r.returncode == 3 and "CursorError" in said(r), said(r)
    text = " ".join(said(r).split())  # rich wraps long lines
    assert f"`k7 group {qdir} seek a {offs[61]}` to continue from the next frame" in text
    assert f"`k7 group {qdir} seek a {end}` to continue with new messages" in text
    assert f"`k7 group {qdir} seek a earliest` to replay the log" in text
    no_python_api(said(r))


def test_a_missing_segment_names_tail_from(qdir: Path) -> None:
    segs, bases = seg_paths(qdir), seg_bases(qdir)
    segs[1].unlink()
    nxt = bases[2]
    r = k7("tail", qdir)
    assert r.returncode == 3 and "is missing" in said(r), said(r)
    assert f"`k7 tail {qdir} --from {nxt}` (the next segment)" in " ".join(said(r).split())
    no_python_api(said(r))


def test_deleted_messages_warn_without_the_python_hint(qdir: Path) -> None:
    segs, bases = seg_paths(qdir), seg_bases(qdir)
    segs[0].unlink()
    earliest = bases[1]
    r = k7("tail", qdir, "--group", "b", "--max", "1")
    assert r.returncode == 0, said(r)
    assert f"jumping to {earliest}" in " ".join(r.stderr.decode().split())
    no_python_api(said(r))


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i``: even root may not open ``path`` for writing (EPERM)."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not on the PATH")
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if r.returncode:
        pytest.skip(f"chattr +i is refused here: {r.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_cursor_that_cannot_be_written_names_the_reading_commands(qdir: Path) -> None:
    with immutable(qdir / "cursor-a.k7"):
        r = k7("tail", qdir, "--group", "a")
    assert r.returncode == 3 and "StorageError" in said(r), said(r)
    text = " ".join(said(r).split())
    assert "`k7 tail --group` and `k7 group seek` write the group's cursor file" in text
    no_python_api(text)


# ---------------------------------------------------------------------------------- output


def test_a_lag_too_large_to_count_is_explained(tmp_path: Path) -> None:
    d = tmp_path / "big"
    with k7core.Queue(d, segment_size=8 << 20, fsync="flush") as q:
        q.consumer_group("far").close()
        q.enqueue_many([b"x" * 4096] * (k7core.LAG_COUNT_LIMIT // 4096 + 16))
        with q.consumer_group("near") as g:
            g.seek(q.end - 2 * k7core.frame_size(4096))
    commands: list[list[str | Path]] = [["info", d], ["group", d, "list"]]
    for args in commands:
        out = " ".join(k7(*args).stdout.decode().split())
        assert "│ far │" in out and "│ ? │" in out and "│ 2 │" in out, out
        assert ("?: lag messages not counted: they are counted (a scan of their frames) only "
                "when the lag is at most 4.0 MiB (4,194,304 bytes)") in out, out
    r = k7("info", d, "--json")
    lags = {g["name"]: g["lag_messages"] for g in json.loads(r.stdout)["groups"]}
    assert lags == {"far": None, "near": 2}
    out = k7("info", tmp_path / "big", "--json").stdout.decode()
    assert "not counted" not in out


def test_no_note_when_every_lag_is_counted(qdir: Path) -> None:
    assert "not counted" not in k7("info", qdir).stdout.decode()


def test_counts_have_thousands_separators_but_not_offsets_or_json(qdir: Path) -> None:
    r = k7("produce", qdir, "--batch", "500", stdin=b"m\n" * 1500)
    assert "produced 1,500 message(s)" in r.stderr.decode(), said(r)
    with k7core.Queue(qdir, readonly=True) as q:
        st = q.stats()
    log = st.next_offset - st.earliest_offset
    assert log >= 10_000
    out = k7("info", qdir).stdout.decode()
    assert f" {log:,} " in out and f" {st.next_offset} " in out, out  # offsets as they are
    lag_a = {g.name: g.lag_bytes for g in st.groups}["a"]
    assert f" {lag_a:,} " in out and "1,640" in out  # 140 + 1,500 messages behind
    assert "ok: 1,700 frames" in k7("verify", qdir).stdout.decode()
    assert json.loads(k7("group", qdir, "list", "--json").stdout)[0]["lag_bytes"] == lag_a
