"""One local SparkSession for the Spark tests (``pytest -m spark`` runs them alone)."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.k7core.spark._stream_child import StreamChild

pytest.importorskip("pyspark", reason="the spark extra is not installed")

KILL_TEST = "test_killed_mid_batch_restarts_exactly_once_into_parquet_and_k7"


@pytest.fixture(scope="session")
def stream_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamChild]:
    """A streaming query in a child process (``_stream_child.py``), killed at the latest at
    the end of the session."""
    child = StreamChild.launch(tmp_path_factory.mktemp("stream-child"))
    try:
        yield child
    finally:
        if child.process.poll() is None:
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    if any(item.name == KILL_TEST for item in request.session.items):
        request.getfixturevalue("stream_child")  # its JVM starts while other tests run
    os.environ["TZ"] = "UTC"
    from k7core.spark import local_session

    warehouse = tempfile.mkdtemp(prefix="k7-spark-warehouse-")
    session = local_session("k7core-tests", sql_warehouse_dir=warehouse)
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k7core/spark" in str(item.fspath):
            item.add_marker(pytest.mark.spark)
