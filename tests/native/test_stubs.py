"""The type stubs of the compiled modules stay true: ``_k7.pyi`` is what ``_build.py``
generates from ``k7.h`` and names exactly what the built ``lib`` holds; mypy's stubtest
finds nothing in ``_fast.pyi`` (or ``_k7.pyi``) that the modules lack, or the reverse."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
from pathlib import Path

from k7core._native._k7 import lib

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "k7core" / "_native"


def test_k7_stub_is_generated_from_the_header() -> None:
    stub = runpy.run_path(str(NATIVE / "_build.py"))["stub"]()
    assert (NATIVE / "_k7.pyi").read_text() == stub, (
        "k7.h changed: run `python k7core/_native/_build.py --stub`"
    )


def test_k7_stub_names_what_lib_holds() -> None:
    tree = ast.parse((NATIVE / "_k7.pyi").read_text())
    (lib_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Lib"]
    declared = {
        n.name if isinstance(n, ast.FunctionDef) else n.target.id  # type: ignore[union-attr]
        for n in lib_class.body
        if isinstance(n, ast.FunctionDef | ast.AnnAssign)
    }
    assert declared == set(dir(lib))


def test_stubtest_finds_the_stubs_true() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", "pyproject.toml",
         "k7core._native._fast", "k7core._native._k7"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
