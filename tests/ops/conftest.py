"""Fixtures of the command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._queuehelp import closed_queue


@pytest.fixture
def qdir(tmp_path: Path) -> Path:
    """A closed queue of 200 messages over several 4 KiB segments (``closed_queue``)."""
    return closed_queue(tmp_path / "q")
