"""The kernel under AddressSanitizer and UndefinedBehaviorSanitizer.

* ``tests/k7core/native/sanitize.sh`` compiles ``k7.c`` with ``-fsanitize=address,undefined`` into
  the fuzz driver ``fuzz_kernel.c`` and runs it over random and mutated segment images (see
  the driver's header). ``K7_FUZZ_ITERATIONS`` sets how many per seed (default 50,000, two
  seeds).
* ``tests/k7core/native/sanitize_python.sh`` builds both compiled modules (``_k7``, the one build of
  ``k7.c``, and ``_fast``, which calls it) with the same sanitizers in a copy of the package and
  runs the Python kernel, recovery, format, API, fault, spare, thread, shared-writer and
  lifetime tests against them (their child processes included: the shared writers, the
  lifetime stress run).

Any sanitizer report, broken invariant or failed test fails these tests with the output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE / "sanitize.sh"
PYTHON_SCRIPT = HERE / "sanitize_python.sh"
ITERATIONS = int(os.environ.get("K7_FUZZ_ITERATIONS", "50000"))
CC = os.environ.get("CC", "gcc")
SANITIZER_REPORTS = ("AddressSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")

needs_cc = pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")


def _libasan() -> str | None:
    """The compiler's ASan runtime, or None when it has none."""
    if shutil.which(CC) is None:
        return None
    out = subprocess.run([CC, "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@needs_cc
@pytest.mark.parametrize("seed", [1, 2])
def test_kernel_fuzz_under_sanitizers(tmp_path: Path, seed: int) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(seed), str(ITERATIONS), str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok, iterations, frames = proc.stdout.split()
    assert ok == "ok" and int(iterations) == ITERATIONS
    assert int(frames) > 0, "the driver never reached a valid frame"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD, /proc (Linux)")
@pytest.mark.skipif(_libasan() is None, reason="no C compiler with libasan")
@pytest.mark.timeout(1800)  # 731 s was seen beside six other test runs on 2 cores
def test_python_kernel_tests_under_sanitizers(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(PYTHON_SCRIPT), str(tmp_path)],
        capture_output=True, text=True, timeout=1700,
        env={**os.environ, "PYTHON": sys.executable},
    )
    output = proc.stdout + proc.stderr
    context = output[-30000:]
    assert proc.returncode == 0, context
    assert not [r for r in SANITIZER_REPORTS if r in output], context
    # the inner run's summary line, e.g. "94 passed in 80.01s": tests ran, none failed
    summary = re.findall(r"^=*\s*((?:\d+ \w+, )*\d+ \w+ in [\d.]+s\b.*)$", proc.stdout, re.M)
    assert summary, context
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary[-1])}
    assert counts.get("passed", 0) > 0, summary[-1]
    assert not counts.keys() & {"failed", "error", "errors", "xpassed"}, summary[-1]
    # ...against the instrumented modules (sanitized_plugin.py checks it, and names them)
    tested = dict(re.findall(r"^k7-sanitized (k7core\._native\.\w+) (\S+)$", proc.stdout, re.M))
    assert set(tested) == {"k7core._native._k7", "k7core._native._fast"}, context
    for path in tested.values():
        assert Path(path).is_relative_to(tmp_path.resolve()), tested
