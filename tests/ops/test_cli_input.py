"""The ``k7`` command line on bad input: the core's checks, worded the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

import k7core
from tests._queuehelp import CLI_SEG, k7, offsets_of


@pytest.mark.parametrize("command", [["info"], ["verify"], ["tail"], ["group", "{}", "list"]])
def test_segment_base_beyond_int64(qdir: Path, command: list[str]) -> None:
    name = "seg-99999999999999999999.k7"
    (qdir / name).write_bytes(b"")
    args = [str(qdir) if c == "{}" else c for c in command] + ([] if "{}" in command else [qdir])
    r = k7(*args)
    assert r.returncode == 3, (r.stdout, r.stderr)
    err = r.stderr.decode()
    assert "StorageError" in err and name in err and "does not fit in 64 bits" in err
    assert "Traceback" not in err


def test_group_seek_checks_the_offset_as_the_library_does(qdir: Path) -> None:
    offs = offsets_of(qdir)
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("b") as g:
        end = q.end
        with pytest.raises(k7core.CursorError) as info:
            g.seek(offs[5] + 8)
    r = k7("group", qdir, "seek", "b", str(offs[5] + 8))
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.decode().split())  # click wraps nothing, but be safe
    hint = info.value.hint
    assert hint and str(info.value).removesuffix(f" ({hint})") in err  # hint said below
    assert f"it starts at {offs[5]}, the next one at {offs[6]}" in err
    assert f"`k7 group {qdir} seek b {offs[6]}` to continue from the next frame" in err
    assert "seek(" not in err
    for bad, words in ((end + 8, f"beyond the end of the log ({end})"),
                       (2**64, "beyond the end of the log")):
        r = k7("group", qdir, "seek", "b", str(bad))
        assert r.returncode == 2 and words in r.stderr.decode(), r.stderr
    assert k7("group", qdir, "seek", "b", str(end)).returncode == 0  # the end is valid


def test_group_seek_before_the_earliest_offset(qdir: Path) -> None:
    """Allowed, as in the library; the command says what the group's next poll does."""
    with k7core.Queue(qdir, segment_size=CLI_SEG, retention_bytes=0) as q:
        earliest = q.earliest()
    assert earliest > 0
    r = k7("group", qdir, "seek", "b", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "group 'b': committed 0 -> 0"
    assert f"before the earliest offset {earliest}" in r.stderr.decode()
