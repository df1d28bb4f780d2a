"""What the README promises about running the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests._queuehelp import ROOT


def test_the_summary_says_why_a_test_was_skipped(tmp_path: Path) -> None:
    """The project's pytest settings print each skip reason (``-rs``): a run without
    ``../shared`` says that the JVM fixtures were not found instead of skipping silently."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_it():\n    pytest.skip('the fixtures are elsewhere')\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "test_skips.py"],
        cwd=tmp_path,
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIPPED [1] test_skips.py:4: the fixtures are elsewhere" in r.stdout, r.stdout
