"""The kernel's readers under AddressSanitizer and UndefinedBehaviorSanitizer.

``tests/native/sanitize.sh`` compiles ``k7.c`` with ``-fsanitize=address,undefined`` into
the fuzz driver ``fuzz_kernel.c`` and runs it over random and mutated segment images (see
the driver's header). ``K7_FUZZ_ITERATIONS`` sets how many per seed (default 50,000, two
seeds); any sanitizer report or broken invariant fails the test with its output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("sanitize.sh")
ITERATIONS = int(os.environ.get("K7_FUZZ_ITERATIONS", "50000"))


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None, reason="no C compiler")
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
