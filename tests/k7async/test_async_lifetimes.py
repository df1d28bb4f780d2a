"""Lifetimes through k7async's faces (docs/concurrency.md, "Lifetimes"): a stream whose queue
is closed underneath it reports ClosedError and keeps what it delivered readable; a stream
on a queue nobody else holds keeps it open. The k7core cases are
tests/k7core/test_lifetimes.py; the stress run tests/k7core/test_lifetime_stress.py.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import anyio
import pytest

import k7async
import k7core

pytestmark = pytest.mark.anyio

DEADLINE = 30.0


def _close_when_idle(q: k7core.Queue) -> None:
    """Close ``q`` once its group's reader thread is between two polls (ConcurrentUseError
    while it is inside one), within ``DEADLINE``."""
    end = time.monotonic() + DEADLINE
    while True:
        try:
            q.close()
            return
        except k7core.ConcurrentUseError:
            if time.monotonic() > end:
                raise


async def test_a_stream_whose_queue_is_closed_underneath_raises_closed(tmp_path: Path) -> None:
    q = k7core.Queue(tmp_path / "q", fsync="flush", segment_size=1 << 20)
    q.enqueue_many([b"a", b"b"])
    async with k7async.consumer_group_channel(q, "g", auto_ack=False, max_batch=1) as stream:
        first = await stream.receive()
        await anyio.to_thread.run_sync(_close_when_idle, q)
        with pytest.raises(k7core.ClosedError), anyio.fail_after(DEADLINE):
            while True:  # what was fetched before the close may still come first
                await stream.receive()
    assert bytes(first.payload) == b"a"  # a payload view keeps its segment mapped


async def test_a_stream_keeps_the_queue_only_it_holds_open(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path / "q", segment_size=1 << 20) as w:
        w.enqueue_many([b"a", b"b", b"c"])
    async with k7async.consumer_group_channel(
        k7core.Queue(tmp_path / "q", readonly=True), "g", max_batch=1,
    ) as stream:
        gc.collect()
        got = [bytes((await stream.receive()).payload) for _ in range(3)]
    assert got == [b"a", b"b", b"c"]
