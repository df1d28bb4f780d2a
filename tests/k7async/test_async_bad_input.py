"""Bad input to k7async gets the same errors as the same input to k7core."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest

import k7async
import k7core
from tests.k7async._asynchelp import k7async_threads

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("method", "arg", "words"), [
    *(("enqueue", data, "bytes-like") for data in ("str", 5, None, [b"a"])),
    *(("enqueue_many", items, "iterable of bytes-like messages") for items in (b"abc", "s", 5)),
])
async def test_writes_refuse_what_the_sync_ones_refuse(
    tmp_path: Path, method: str, arg: object, words: str
) -> None:
    with k7core.Queue(tmp_path / "q", fsync="flush") as q:
        with pytest.raises(TypeError) as sync_err:
            getattr(q, method)(arg)
        async with k7async.open_queue(q) as aq:
            with pytest.raises(TypeError) as async_err:
                await getattr(aq, method)(arg)
        assert str(async_err.value) == str(sync_err.value)
        assert words in str(sync_err.value)
        assert q.end == 0


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"timeout": math.nan}, ValueError),
    ({"timeout": True}, TypeError),
    ({"timeout": math.inf}, ValueError),  # bounded: the reader thread stops between polls
    ({"timeout": None}, TypeError),
    ({"max_batch": True}, TypeError),
    ({"max_batch": 2**40}, ValueError),
])
async def test_consumer_channel_checks_its_numbers(
    queue: k7core.Queue, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with anyio.fail_after(10), pytest.raises(error, match=next(iter(kwargs))):
        async with k7async.consumer_group_channel(queue, "g", **kwargs):  # type: ignore[arg-type]
            pass
    assert k7async_threads() == []


async def test_stream_ack_and_nack_check_the_offset_in_the_caller(queue: k7core.Queue) -> None:
    """``ack(True)`` is refused where it is called (it used to fail the reader thread);
    an int beyond 64 bits is no offset in flight, as for the group's own ack."""
    queue.enqueue_many([b"a", b"b"])
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g", auto_ack=False) as stream:
            got = [await stream.receive() for _ in range(2)]
            for post in (stream.ack, stream.nack):
                with pytest.raises(TypeError, match="not bool"):
                    await post(True)
                await post(2**70)
            for msg in got:
                await stream.ack(msg)
            queue.enqueue(b"c")
            assert bytes((await stream.receive()).payload) == b"c"  # the thread goes on
    with queue.consumer_group("g") as g:
        assert g.committed == got[1].offset + k7core.frame_size(1)


async def test_ack_on_an_auto_ack_stream_is_refused(queue: k7core.Queue) -> None:
    queue.enqueue(b"a")
    with anyio.fail_after(10):
        async with k7async.consumer_group_channel(queue, "g") as stream:
            msg = await stream.receive()
            for post in (stream.ack, stream.nack):
                with pytest.raises(k7async.AutoAckError, match="auto_ack=False") as info:
                    await post(msg)
                assert isinstance(info.value, k7core.K7Error)
    with queue.consumer_group("g") as g:  # auto-acked on hand-over, nothing else
        assert g.committed == queue.end
