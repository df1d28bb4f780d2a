"""pytest plugin for ``sanitize_python.sh`` (``-p sanitized_plugin``): makes sure the run
tests the instrumented copy of the kernel, not the editable install.

At start-up it imports both compiled modules and fails the session unless each one's file
lies under ``K7_SANITIZED_ROOT`` and calls into the ASan and UBSan runtimes, and unless
libasan is loaded in the process; at the end it prints which files were tested.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

MODULES = ("k7core._native._k7", "k7core._native._fast")


def _files() -> dict[str, Path]:
    return {name: Path(sys.modules[name].__file__ or "").resolve() for name in MODULES}


def pytest_configure(config: pytest.Config) -> None:
    """Import the kernel now, so that every test gets these modules, and check them."""
    for name in MODULES:
        importlib.import_module(name)
    root = Path(os.environ["K7_SANITIZED_ROOT"]).resolve()
    for name, path in _files().items():
        if not path.is_relative_to(root):
            raise pytest.UsageError(f"{name} is {path}, not the sanitized build under {root}")
        image = path.read_bytes()
        if b"__asan_report" not in image or b"__ubsan_handle" not in image:
            raise pytest.UsageError(f"{path} is not built with ASan and UBSan")
    if "libasan" not in Path("/proc/self/maps").read_text():
        raise pytest.UsageError("libasan is not loaded (LD_PRELOAD)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the sanitized modules the tests ran against."""
    for name, path in _files().items():
        terminalreporter.write_line(f"k7-sanitized {name} {path}")
