"""Shared fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests._queuehelp import ROOT

FIXTURES = ROOT.parent / "shared" / "fixtures" / "k7-jvm"


@pytest.fixture
def jvm_basic(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A writable copy of the queue written by the JVM k7, and its manifest."""
    src = FIXTURES / "basic"
    if not src.is_dir():
        pytest.skip(f"k7-jvm fixtures not found at {src}: they come from ../shared, the "
                    "shared/ folder beside the repository")
    manifest = json.loads((src / "manifest.json").read_text())
    dst = tmp_path / "jvm-queue"
    shutil.copytree(src / manifest["queue_dir"], dst)
    for p in [dst, *dst.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst, manifest
