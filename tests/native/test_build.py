"""The build of the compiled modules is free of warnings: cffi's ``cdef()`` of ``k7.h`` and
gcc on every C file, with the flags of ``setup.py`` / ``_build.py`` plus ``-Werror``."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sysconfig
import warnings
from pathlib import Path
from typing import Any

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "k7core" / "_native"
CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-Werror", "-fsyntax-only"]


def _builder() -> Any:
    """``_build.py``'s ``ffibuilder``, with every warning of its ``cdef()`` an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return runpy.run_path(str(NATIVE / "_build.py"))["ffibuilder"]


def test_cdef_declares_the_kernel_without_warnings() -> None:
    assert "variable k7_fault_msync" in _builder()._parser._declarations


def _gcc(source: Path, *include: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on the PATH")
    args = ["gcc", *CFLAGS, *(f"-I{d}" for d in include), str(source)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and not r.stderr, r.stderr


@pytest.mark.parametrize("name", ["k7.c", "k7_bus.c", "_fast.c"])
def test_c_file_compiles_without_warnings(name: str) -> None:
    _gcc(NATIVE / name, NATIVE, Path(sysconfig.get_paths()["include"]))


def test_cffi_module_compiles_without_warnings(tmp_path: Path) -> None:
    source = tmp_path / "_k7.c"
    _builder().emit_c_code(str(source))
    _gcc(source, NATIVE, Path(sysconfig.get_paths()["include"]))


def _kernel_functions() -> list[str]:
    return [k.split()[1] for k in _builder()._parser._declarations if k.startswith("function ")]


def test_kernel_is_compiled_once() -> None:
    """k7.c and k7_bus.c are in the cffi module only: _fast names none of their functions
    (neither defines nor imports one; it calls them through the bound k7_api table)."""
    from k7core._native import _fast, _k7

    fast = Path(_fast.__file__ or "").read_bytes()
    cffi_module = Path(_k7.__file__ or "").read_bytes()
    for name in _kernel_functions():
        symbol = b"\0" + name.encode() + b"\0"  # a whole name in a string table
        assert symbol in cffi_module, name
        assert symbol not in fast, name
