"""Threads come and go with the contexts; the public surface is what it says."""

from __future__ import annotations

import threading
import types
from pathlib import Path

import anyio
import pytest

import k7async
import k7core
from tests._queuehelp import read_all
from tests.k7async._asynchelp import k7async_threads

pytestmark = pytest.mark.anyio


async def test_no_thread_leak(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with anyio.fail_after(20):
        for fsync in ("async", "flush", "sync"):
            async with k7async.open_queue(tmp_path / fsync, fsync=fsync) as q:
                await q.enqueue(b"a")
                async with q.producer_channel() as send:
                    await send.send(b"b")
                send2, receive2 = anyio.create_memory_object_stream[bytes](4)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(k7async.sink, q, receive2)
                    await send2.send(b"c")
                    await send2.aclose()
                receive2.close()
                async with q.consumer_group_channel("g", auto_ack=False) as stream:
                    for _ in range(3):
                        await stream.ack(await stream.receive())
                with pytest.raises(k7core.GroupBusyError):  # a failed open leaves no thread
                    async with q.consumer_group_channel("g"), q.consumer_group_channel("g"):
                        pass
                with pytest.raises(TypeError):  # nor does a failed writer
                    await q.enqueue("x")  # type: ignore[arg-type]
                with anyio.CancelScope() as scope:  # nor a cancelled consumer
                    async with q.consumer_group_channel("h") as stream:
                        scope.cancel()
                        await anyio.sleep_forever()
                q.queue.sync()
                assert read_all(q.queue) == [b"a", b"b", b"c"]
    after = set(threading.enumerate())
    assert after - before == set()
    assert k7async_threads() == []


async def test_all_is_complete() -> None:
    for name in k7async.__all__:
        assert getattr(k7async, name) is not None
    public = sorted(n for n in dir(k7async) if not n.startswith("_")
                    and not isinstance(getattr(k7async, n), types.ModuleType))  # k7async.server
    assert public == sorted(k7async.__all__)
    assert issubclass(k7async.SinkBusyError, k7core.K7Error)


def test_public_names_say_k7async() -> None:
    """Reprs and tracebacks show ``k7async.X``, not the private module that defines X."""
    for name in k7async.__all__:
        obj = getattr(k7async, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "k7async", name
    assert repr(k7async.AsyncQueue).startswith("<class 'k7async.AsyncQueue'")


def test_errors_are_k7_errors() -> None:
    for cls in (k7async.SinkBusyError, k7async.AutoAckError):
        assert issubclass(cls, k7core.K7Error)
    assert issubclass(k7async.AutoAckError, RuntimeError)  # what it was before it had a name
