"""Fixtures for the k7async tests: every async test runs under asyncio and under trio."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import k7core
from tests.k7async._asynchelp import GatedQueue


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[k7core.Queue]:
    """A writable queue; "flush" so that what is written is visible at once."""
    with k7core.Queue(tmp_path / "q", fsync="flush", segment_size=1 << 20) as q:
        yield q


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[GatedQueue]:
    with GatedQueue(tmp_path / "gated", fsync="flush", segment_size=1 << 20) as q:
        yield q


