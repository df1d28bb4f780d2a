"""Use after close: every public method and property of every k7core object with a
``close()`` raises ``ClosedError`` once the object is closed (docs/concurrency.md#closing),
and ``close()`` stays idempotent.

The members are found by introspection (every public name of the class, and of the
instance for plain attributes), so a member added later fails here until it is given a call
in ``CALLS`` (and raises ``ClosedError`` after close) or a reason in ``STAY_READABLE``. Each
call gets valid arguments, and a test checks that every call succeeds on the open object, so
the ``ClosedError`` expected after close is never a ``TypeError`` or ``ValueError`` in
disguise. Members that do not raise ``ClosedError`` today are strict ``xfail``s (``KNOWN``),
each with what it does instead.
"""

from __future__ import annotations

import array
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import k7core
from tests._queuehelp import check_listed, close_cases, expect_known, fill, public_names

# ---------------------------------------------------------------------- the objects


@dataclass
class Opened:
    """A queue (writer or read-only) with messages, an open group and a message in flight."""

    q: k7core.Queue
    g: k7core.ConsumerGroup
    msg: k7core.Message
    end: int


@pytest.fixture(params=["writer", "readonly"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    path = tmp_path / "q"
    with k7core.Queue(path, fsync="flush", segment_size=1 << 20) as w:
        fill(w, 10)
    if request.param == "writer":
        q = k7core.Queue(path, fsync="flush", segment_size=1 << 20)
    else:
        q = k7core.Queue(path, readonly=True)
    g = q.consumer_group("g")
    (msg,) = g.poll(max_batch=1, timeout=0)
    try:
        yield Opened(q, g, msg, q.end)
    finally:
        q.close()


Call = Callable[[Opened], object]

#: A call with valid arguments for each public member that must raise ``ClosedError`` after
#: close (a property: reading it).
CALLS: dict[str, dict[str, Call]] = {
    "Queue": {
        "enqueue": lambda o: o.q.enqueue(b"x"),
        "enqueue_many": lambda o: o.q.enqueue_many([b"x", b"y"]),
        "enqueue_columnar": lambda o: o.q.enqueue_columnar(b"xy", array.array("q", [0, 1, 2])),
        "check_message_size": lambda o: o.q.check_message_size(1),
        "sync": lambda o: o.q.sync(),
        "enforce_retention": lambda o: o.q.enforce_retention(),
        "delete_before": lambda o: o.q.delete_before(0),
        "wait": lambda o: o.q.wait(-1, 0),
        "end": lambda o: o.q.end,
        "consumer_group": lambda o: o.q.consumer_group("h").close(),
        "read_columnar": lambda o: o.q.read_columnar(0),
        "earliest": lambda o: o.q.earliest(),
        "count_messages": lambda o: o.q.count_messages(0, o.end),
        "stats": lambda o: o.q.stats(),
    },
    "ConsumerGroup": {
        "poll": lambda o: o.g.poll(max_batch=1, timeout=0),
        "ack": lambda o: o.g.ack(o.msg),
        "ack_many": lambda o: o.g.ack_many([o.msg]),
        "nack": lambda o: o.g.nack(o.msg),
        "seek": lambda o: o.g.seek(0),
        "position": lambda o: o.g.position,
        "lag": lambda o: o.g.lag,
        "stats": lambda o: o.g.stats(),
    },
}

#: On a ``readonly=True`` queue these raise ``ReadOnlyError`` while it is open (and must
#: raise ``ClosedError`` once it is closed: the closed state is checked first).
WRITES = {"enqueue", "enqueue_many", "enqueue_columnar", "sync", "enforce_retention",
          "delete_before"}

#: ``Queue``'s option properties: the fields of ``Queue.options`` (checked below).
OPTIONS = ("segment_size", "fsync", "commit_interval", "readonly", "retention",
           "retention_bytes", "retention_age", "remove_when_empty", "file_mode", "writers",
           "lock_timeout")

#: Public members that stay readable after close, each with the reason.
STAY_READABLE: dict[str, dict[str, str]] = {
    "Queue": {
        "close": "idempotent (test_close_is_idempotent)",
        "closed": "tells whether the queue is closed (docs/concurrency.md#closing)",
        "path": "the directory given to the constructor: plain data, nothing is read",
        "options": "the options the queue was opened with: immutable plain data",
        **dict.fromkeys(OPTIONS, "an option the queue was opened with: immutable plain data"),
    },
    "ConsumerGroup": {
        "close": "idempotent (test_close_is_idempotent)",
        "closed": "documented to remain readable (docs/concurrency.md#closing)",
        "committed": "documented to remain readable (docs/concurrency.md#closing)",
        "in_flight": "documented to remain readable (docs/concurrency.md#closing)",
        "queue_path": "the queue's directory: plain data fixed at open, nothing is read",
        "name": "the group's name (an attribute): plain data given at open",
        "path": "the cursor file's path (an attribute): plain data fixed at open",
        "cursor_fsync": "an option the group was opened with (an attribute): plain data",
        "on_data_loss": "an option the group was opened with (an attribute): plain data",
    },
}

#: What the members that do not raise ``ClosedError`` after close do instead:
#: ``(kind, name, mode or None for both)`` -> (the exception raised, or ``None`` when the
#: call succeeds; the reason). Each is a strict xfail: fixing it turns the xfail into a
#: failure that says to remove the entry.
KNOWN: dict[tuple[str, str, str | None], tuple[type[BaseException] | None, str]] = {}


#: The class of each kind, and how it is closed: by its own ``close()``, and a group also by
#: its queue's (which closes its groups first).
CLASSES: dict[str, tuple[type, list[str]]] = {
    "Queue": (k7core.Queue, ["close"]),
    "ConsumerGroup": (k7core.ConsumerGroup, ["close", "queue.close"]),
}


def closable_classes() -> set[type]:
    """The public classes of k7core's public modules that have a ``close()``."""
    found: set[type] = set()
    for name in ("k7core", "k7core.metrics", "k7core.spark"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # an extra that is not installed: its module has no objects here
            continue
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj) and callable(getattr(obj, "close", None)):
                found.add(obj)
    return found


def _target(o: Opened, kind: str) -> k7core.Queue | k7core.ConsumerGroup:
    return o.q if kind == "Queue" else o.g


# ---------------------------------------------------------------------- the tests


def test_every_closable_class_is_in_the_matrix() -> None:
    assert closable_classes() == {cls for cls, _ in CLASSES.values()}
    assert set(CALLS) == set(STAY_READABLE) == set(CLASSES)


def test_the_tables_name_real_members(opened: Opened) -> None:
    for kind, (cls, _) in CLASSES.items():
        names = set(public_names(cls)) | set(vars(_target(opened, kind)))
        assert set(CALLS[kind]) <= names, set(CALLS[kind]) - names
        assert set(STAY_READABLE[kind]) <= names, set(STAY_READABLE[kind]) - names
        assert not set(CALLS[kind]) & set(STAY_READABLE[kind])
    assert {f.name for f in dataclasses.fields(opened.q.options)} == set(OPTIONS)
    for kind, name, _mode in KNOWN:
        assert name in CALLS[kind], (kind, name)


def test_plain_attributes_are_listed(opened: Opened) -> None:
    """Public instance attributes (not in the class) cannot check the closed state: each
    must be listed as staying readable."""
    for kind in CLASSES:
        attrs = {n for n in vars(_target(opened, kind)) if not n.startswith("_")}
        assert attrs <= set(STAY_READABLE[kind]), attrs - set(STAY_READABLE[kind])


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in CALLS for n in CALLS[k]])
def test_calls_work_while_open(opened: Opened, kind: str, name: str) -> None:
    """The calls of the table are valid: on the open object each succeeds (a read-only
    queue refuses the writes with ReadOnlyError)."""
    call = CALLS[kind][name]
    if kind == "Queue" and opened.q.readonly and name in WRITES:
        with pytest.raises(k7core.ReadOnlyError):
            call(opened)
    else:
        call(opened)


@pytest.mark.parametrize(("kind", "name", "closer"), close_cases(CLASSES))
def test_use_after_close(
    opened: Opened, kind: str, name: str, closer: str, request: pytest.FixtureRequest
) -> None:
    obj = _target(opened, kind)
    readable = STAY_READABLE[kind].get(name)
    call = CALLS[kind].get(name)
    check_listed(kind, name, readable, call)
    mode = "readonly" if opened.q.readonly else "writer"
    expect_known(request, KNOWN.get((kind, name, mode)) or KNOWN.get((kind, name, None)))
    if closer == "queue.close":
        opened.q.close()  # closes its groups first
    else:
        obj.close()
    if readable:
        getattr(obj, name)  # no error
        assert obj.closed is True
        return
    assert call is not None
    with pytest.raises(k7core.ClosedError):
        call(opened)


def test_close_is_idempotent(opened: Opened) -> None:
    opened.g.close()
    opened.g.close()
    opened.q.close()
    opened.q.close()
    assert opened.q.closed and opened.g.closed
    with k7core.Queue(opened.q.path, readonly=True) as q:
        h = q.consumer_group("h")
    h.close()  # closed by its queue already
    h.close()
    assert h.closed
