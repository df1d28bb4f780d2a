"""The fast paths (``_fast``) run the cffi module's kernel through the table that
``k7core._kernel`` binds at import, and refuse to run before (or with a table of another
build). Checked in a fresh interpreter that loads ``_fast`` without importing k7core."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from k7core._native import _fast, _k7

UNBOUND = textwrap.dedent(
    """
    import importlib.util, sys

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    fast = load("k7core._native._fast", sys.argv[1])
    k7 = load("k7core._native._k7", sys.argv[2])
    assert "k7core" not in sys.modules
    for make in (lambda: fast.Appender(0), lambda: fast.Fetcher(0, 0, tuple)):
        try:
            make()
        except RuntimeError as exc:
            assert "not bound" in str(exc), exc
        else:
            raise AssertionError("created unbound")
    table = k7.lib.k7_api_table()
    other = k7.ffi.new("k7_api *", table[0])
    other.writer_size += 8  # a k7_writer of another layout
    for bad in (0, int(k7.ffi.cast("uintptr_t", other))):
        try:
            fast.bind(bad)
        except ValueError as exc:
            assert "rebuild" in str(exc), exc
        else:
            raise AssertionError("bound a foreign table")
    fast.bind(int(k7.ffi.cast("uintptr_t", table)))
    fast.bind(int(k7.ffi.cast("uintptr_t", table)))  # again: the same table is fine
    try:
        fast.bind(int(k7.ffi.cast("uintptr_t", k7.ffi.new("k7_api *", table[0]))))
    except RuntimeError as exc:
        assert "already bound" in str(exc), exc
    else:
        raise AssertionError("rebound")
    w = k7.ffi.new("k7_writer *")
    fast.Appender(int(k7.ffi.cast("uintptr_t", w)))
    print("ok")
    """
)


def test_fast_paths_refuse_to_run_unbound() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", UNBOUND, str(_fast.__file__), str(_k7.__file__)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stdout + proc.stderr
