"""The error tree, and each public module's ``__all__`` both ways.

Every name in ``__all__`` exists, is public and, for a class or function of the packages,
reports a public module as its home (as anyio's do). Everything users are meant to use is in
some public module's ``__all__``: the packages' classes and functions that a public module
holds under a public name, every error class, and every public class that a public function
or method takes or returns."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import k7async
import k7core
from k7core.beanstalk import ProtocolError
from k7core.spark import K7DataLossError, K7OptionError

PACKAGES = ("k7core", "k7async")
ALL_PUBLIC = ["k7core", "k7core.jobs", "k7core.jobs.metrics", "k7core.spark",
              "k7core.workers", "k7core.workers.metrics", "k7core.outbox",
              "k7core.metrics", "k7core.beanstalk", "k7core.beanstalk.protocol",
              "k7core.beanstalk.calls", "k7async", "k7async.beanstalk", "k7async.server",
              "k7async.server.metrics", "k7core.topics", "k7core.topics.metrics"]


def test_errors_are_grouped() -> None:
    """One parent per kind, to catch a kind at once; the earlier parents stay."""
    tree: dict[type, list[type]] = {
        k7core.LockedError: [k7core.QueueLockedError, k7core.GroupBusyError,
                             k7core.LockTimeoutError, k7async.SinkBusyError],
        k7core.IntegrityError: [k7core.CorruptFrameError, k7core.CursorError,
                                k7core.DataLossError, K7DataLossError],
        ValueError: [k7core.CursorError, k7core.InvalidNameError, k7core.MessageTooLargeError,
                     K7OptionError, ProtocolError],
        k7core.DataLossError: [K7DataLossError],
        OSError: [k7core.StorageError],
        RuntimeError: [k7core.ConcurrentUseError],
    }
    for parent, children in tree.items():
        for child in children:
            assert issubclass(child, parent), (child, parent)
    for kind in (k7core.LockedError, k7core.IntegrityError):
        assert issubclass(kind, k7core.K7Error) and not issubclass(kind, ValueError)
    assert not issubclass(k7core.StorageError, k7core.IntegrityError | k7core.LockedError)


def test_a_locked_queue_is_a_locked_error(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with k7core.Queue(path, segment_size=4096), pytest.raises(k7core.LockedError) as info:
        k7core.Queue(path, segment_size=4096)
    assert type(info.value) is k7core.QueueLockedError
    assert "k7core.QueueLockedError: " in "".join(traceback.format_exception(info.value))


def _home(obj: Any) -> str:
    return str(getattr(obj, "__module__", None) or "")


def _ours(obj: Any) -> bool:
    """A class or function that the packages define."""
    is_code = inspect.isclass(obj) or inspect.isfunction(obj)
    return is_code and _home(obj).split(".")[0] in PACKAGES


def _module(name: str) -> ModuleType:
    mod = importlib.import_module(name)
    for n in mod.__all__:
        getattr(mod, n, None)  # names loaded on first use (k7core.spark's streaming half)
    return mod


def _exported() -> set[int]:
    """The ids of everything some public module exports."""
    return {id(getattr(_module(m), n, None)) for m in ALL_PUBLIC for n in _module(m).__all__}


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_all_names_exist_and_are_public(name: str) -> None:
    mod = _module(name)
    assert len(set(mod.__all__)) == len(mod.__all__), "a name twice in __all__"
    for n in mod.__all__:
        assert not n.startswith("_"), n
        assert hasattr(mod, n), n


@pytest.mark.parametrize(
    "name", ["k7core", "k7core.jobs", "k7core.jobs.metrics", "k7core.spark", "k7core.metrics",
             "k7core.beanstalk", "k7core.beanstalk.calls", "k7core.workers", "k7async",
             "k7async.beanstalk", "k7core.topics", "k7core.topics.metrics"]
)
def test_exports_report_their_public_module(name: str) -> None:
    mod = _module(name)
    wrong = {n: _home(getattr(mod, n)) for n in mod.__all__
             if _ours(getattr(mod, n)) and _home(getattr(mod, n)) not in ALL_PUBLIC}
    assert not wrong, f"set their __module__ to {name!r} in its __init__: {wrong}"


@pytest.mark.parametrize("name", ALL_PUBLIC)
def test_namespace_holds_no_unexported_names(name: str) -> None:
    """A public name in the module for a class or function of the packages is in
    ``__all__``, or is another public module's (k7core.Queue in k7core.metrics)."""
    mod = _module(name)
    stray = sorted(
        n for n, v in vars(mod).items()
        if not n.startswith("_") and n not in mod.__all__ and _ours(v)
        and not (_home(v) in ALL_PUBLIC and _home(v) != name)
    )
    assert not stray, f"export these from {name} or import them under a private name: {stray}"


def _subclasses(cls: type) -> Iterator[type]:
    subs: list[type] = cls.__subclasses__()
    for sub in subs:
        yield sub
        yield from _subclasses(sub)


def test_every_error_is_exported() -> None:
    """Users catch them: every ``K7Error`` of the packages is in a public module's
    ``__all__``. (Not errors of other kinds: ``MissingExtraError`` is caught as the
    ``ModuleNotFoundError`` it is, the command line's end as a message and an exit code.)"""
    exported = _exported()
    missing = sorted(
        f"{_home(c)}.{c.__qualname__}" for c in {k7core.K7Error, *_subclasses(k7core.K7Error)}
        if _ours(c) and id(c) not in exported
    )
    assert not missing, missing


def _named_in(fn: Any, ours: dict[str, type]) -> Iterator[Any]:
    """What the annotations of ``fn`` name: each identifier of each annotation (kept as text
    by ``from __future__ import annotations``), looked up in the function's module, else
    among the packages' classes (for names imported under TYPE_CHECKING)."""
    for text in inspect.get_annotations(fn).values():
        for ident in re.findall(r"[A-Za-z_]\w*", str(text)):
            yield fn.__globals__.get(ident, ours.get(ident))


def _annotated(obj: Any) -> Iterator[tuple[str, Any]]:
    """(name, function): ``obj`` itself if it is a function; for a class, its own public
    methods and properties (not ``__init__``: a class users get from a call, such as
    ``ConsumerGroup``, is built from parts they never hold)."""
    if inspect.isfunction(obj):
        yield obj.__qualname__, obj
        return
    for n, member in vars(obj).items():
        if n.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(fn):
            yield f"{obj.__qualname__}.{n}", fn


@pytest.mark.parametrize(
    "name", ["k7core", "k7core.jobs", "k7core.jobs.metrics", "k7core.spark", "k7core.metrics",
             "k7core.beanstalk", "k7core.beanstalk.calls", "k7core.workers", "k7async",
             "k7async.beanstalk", "k7core.topics", "k7core.topics.metrics"]
)
def test_what_public_calls_take_and_return_is_exported(name: str) -> None:
    """Users hold what a public function or method returns and build what it takes: every
    public class of the packages named in those annotations is exported."""
    exported = _exported()
    ours = {
        v.__name__: v for m in list(sys.modules.values())
        if m is not None and m.__name__.split(".")[0] in PACKAGES
        for v in vars(m).values() if _ours(v) and inspect.isclass(v)
    }
    mod = _module(name)
    missing = sorted(
        f"{where}: {_home(c)}.{c.__qualname__}"
        for value in (getattr(mod, n) for n in mod.__all__) if _ours(value)
        for where, fn in _annotated(value)
        for c in _named_in(fn, ours)
        if _ours(c) and inspect.isclass(c) and not c.__name__.startswith("_")
        and id(c) not in exported
    )
    assert not missing, missing
