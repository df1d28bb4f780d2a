"""The ``k7`` command line on bad input: the core's checks, worded the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import k7, qdir

__all__ = ["qdir"]  # the fixture


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
