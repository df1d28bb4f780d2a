"""Use after close for k7async's public objects, through the public API only: every public
method and property of an ``AsyncQueue`` (once ``open_queue``'s context has exited), of a
producer channel (once ``producer_channel``'s context has exited) and of a ``MessageStream``
(after ``aclose()``, or once ``consumer_group_channel``'s context has exited) raises
``k7core.ClosedError``, and closing again is harmless. The sync matrix is
``tests/k7core/test_closed.py``; this one works the same way (members by introspection, a table
of valid calls checked on the open objects, a reason for each member that stays readable,
strict xfails in ``KNOWN`` for what raises something else today).

Every test runs under asyncio and under trio.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream

import k7async
import k7core
from tests._queuehelp import check_listed, close_cases, expect_known, fill, public_names

pytestmark = pytest.mark.anyio

#: What ``producer_channel`` yields (docs/async.md: a ``MemoryObjectSendStream[bytes]``).
ProducerChannel = MemoryObjectSendStream


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------------- the objects

SEGMENT = 1 << 20


@dataclass
class Opened:
    """The object of one kind, and what its calls need."""

    aq_: k7async.AsyncQueue | None = None
    send_: MemoryObjectSendStream[bytes] | None = None
    msgs_: k7async.MessageStream | None = None
    msg_: k7core.Message | None = None  # received from ``msgs`` (auto_ack=False), not acked

    @property
    def aq(self) -> k7async.AsyncQueue:
        assert self.aq_ is not None
        return self.aq_

    @property
    def send(self) -> MemoryObjectSendStream[bytes]:
        assert self.send_ is not None
        return self.send_

    @property
    def msgs(self) -> k7async.MessageStream:
        assert self.msgs_ is not None
        return self.msgs_

    @property
    def msg(self) -> k7core.Message:
        assert self.msg_ is not None
        return self.msg_

    def target(self, kind: str) -> object:
        return {"AsyncQueue": self.aq_, "producer channel": self.send_,
                "MessageStream": self.msgs_}[kind]


Action = Callable[[Opened], Awaitable[None]]


async def run(kind: str, path: Path, closer: str | None, action: Action) -> None:
    """Open the object of ``kind`` on a queue of 10 messages and run ``action`` on it: while
    it is open (``closer`` None), or once it is closed: ``"exit"`` leaves its context (an
    ``AsyncQueue``: ``open_queue``'s, which closes the queue too), ``"aclose"`` calls its
    ``aclose()`` (a ``MessageStream``)."""
    with k7core.Queue(path, fsync="flush", segment_size=SEGMENT) as q:
        fill(q, 10)
    if kind == "AsyncQueue":
        async with k7async.open_queue(path, fsync="flush", segment_size=SEGMENT) as aq:
            o = Opened(aq_=aq)
            if closer is None:
                return await action(o)
        return await action(o)
    with k7core.Queue(path, fsync="flush", segment_size=SEGMENT) as q:
        if kind == "producer channel":
            async with k7async.producer_channel(q) as send:
                o = Opened(send_=send)
                assert isinstance(send, ProducerChannel)  # k7async's paced subclass
                if closer is None:
                    return await action(o)
            return await action(o)
        async with k7async.consumer_group_channel(q, "g", auto_ack=False) as msgs:
            o = Opened(msgs_=msgs, msg_=await msgs.receive())
            if closer is None:
                return await action(o)
            if closer == "aclose":
                await msgs.aclose()
                return await action(o)
        return await action(o)


Call = Callable[[Opened], Awaitable[object]]


async def _producer_channel(o: Opened) -> None:
    async with o.aq.producer_channel() as send:
        await send.send(b"x")


async def _consumer_group_channel(o: Opened) -> None:
    async with o.aq.consumer_group_channel("h"):
        pass


async def _send_nowait(o: Opened) -> None:
    o.send.send_nowait(b"x")


async def _clone(o: Opened) -> None:
    o.send.clone().close()


async def _receive_nowait(o: Opened) -> None:
    o.msgs.receive_nowait()


async def _receive_batch_nowait(o: Opened) -> None:
    o.msgs.receive_batch_nowait()


#: The class of each kind, and how it is closed: by leaving its context (``exit``), and a
#: ``MessageStream`` also by its ``aclose()``.
CLASSES: dict[str, tuple[type, list[str]]] = {
    "AsyncQueue": (k7async.AsyncQueue, ["exit"]),
    "producer channel": (ProducerChannel, ["exit"]),
    "MessageStream": (k7async.MessageStream, ["exit", "aclose"]),
}

#: A call with valid arguments for each public member that must raise ``ClosedError`` after
#: close (a property: reading it).
CALLS: dict[str, dict[str, Call]] = {
    "AsyncQueue": {
        "enqueue": lambda o: o.aq.enqueue(b"x"),
        "enqueue_many": lambda o: o.aq.enqueue_many([b"x", b"y"]),
        "producer_channel": _producer_channel,
        "consumer_group_channel": _consumer_group_channel,
    },
    "producer channel": {
        "send": lambda o: o.send.send(b"x"),
        "send_nowait": _send_nowait,
        "clone": _clone,
    },
    "MessageStream": {
        "receive": lambda o: o.msgs.receive(),
        "receive_nowait": _receive_nowait,
        "receive_batch": lambda o: o.msgs.receive_batch(),
        "receive_batch_nowait": _receive_batch_nowait,
        "ack": lambda o: o.msgs.ack(o.msg),
        "nack": lambda o: o.msgs.nack(o.msg),
    },
}

_TYPED = "anyio's typed attributes (metadata of the stream, nothing is read or written)"

#: Public members that stay usable after close, each with the reason.
STAY_READABLE: dict[str, dict[str, str]] = {
    "AsyncQueue": {
        "closed": "tells whether the AsyncQueue is closed",
        "path": "the queue's directory: plain data",
        "fsync": "an option the queue was opened with: plain data",
        "queue": "a reference to the k7core.Queue (its own matrix is tests/k7core/test_closed.py)",
        "writer": "a reference to the writer thread's object: its counters stay readable",
    },
    "producer channel": {
        "close": "idempotent: closing again is harmless",
        "aclose": "idempotent: closing again is harmless",
        "statistics": "anyio's buffer counters, readable after close on every memory stream",
        "extra": _TYPED,
        "extra_attributes": _TYPED,
    },
    "MessageStream": {
        "aclose": "idempotent: closing again is harmless",
        "group": "the group's name: plain data",
        "auto_ack": "an option the stream was opened with: plain data",
        "extra": _TYPED,
        "extra_attributes": _TYPED,
    },
}

#: What the members that do not raise ``ClosedError`` after close do instead: ``(kind,
#: name)`` -> (the exception raised, or ``None`` when the call succeeds; the reason).
KNOWN: dict[tuple[str, str], tuple[type[BaseException] | None, str]] = {}


# ---------------------------------------------------------------------- the tests


def test_the_tables_name_real_members() -> None:
    assert set(CALLS) == set(STAY_READABLE) == set(CLASSES)
    for kind, (cls, _) in CLASSES.items():
        names = set(public_names(cls))
        assert set(CALLS[kind]) <= names, set(CALLS[kind]) - names
        assert set(STAY_READABLE[kind]) <= names, set(STAY_READABLE[kind]) - names
        assert not set(CALLS[kind]) & set(STAY_READABLE[kind])
    for kind, name in KNOWN:
        assert name in CALLS[kind], (kind, name)


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in CALLS for n in CALLS[k]])
async def test_calls_work_while_open(tmp_path: Path, kind: str, name: str) -> None:
    """The calls of the table are valid: on the open object each succeeds."""

    async def action(o: Opened) -> None:
        await CALLS[kind][name](o)

    await run(kind, tmp_path / "q", None, action)


@pytest.mark.parametrize(("kind", "name", "closer"), close_cases(CLASSES))
async def test_use_after_close(
    tmp_path: Path, kind: str, name: str, closer: str, request: pytest.FixtureRequest
) -> None:
    readable = STAY_READABLE[kind].get(name)
    call = CALLS[kind].get(name)
    check_listed(kind, name, readable, call)
    expect_known(request, KNOWN.get((kind, name)))

    async def action(o: Opened) -> None:
        obj = o.target(kind)
        if readable:
            member = getattr(obj, name)  # no error
            if name in ("close", "aclose", "statistics"):  # closing again is harmless
                result = member()
                if name == "aclose":
                    await result
            return
        assert call is not None
        with pytest.raises(k7core.ClosedError) as caught:
            await call(o)
        if kind != "AsyncQueue":  # a stream: also what code written for anyio streams catches
            assert isinstance(caught.value, anyio.ClosedResourceError)
            assert isinstance(caught.value, k7async.StreamClosedError)

    await run(kind, tmp_path / "q", closer, action)
