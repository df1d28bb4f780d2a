"""Exchange: an exchange kind and its bindings stored in a directory; routing before the
write, into topics and queues.

    <exchange>/k7py-exchange.json   {"k7py": "exchange", "version": 1, "kind": "topic",
                                     "bindings": [Binding.to_json(), ...]}
    <exchange>/k7py-exchange.lock   flock held while the bindings change
    <exchange>/k7py-exchange.gen    a page whose first 8 bytes count the changes: every
                                    opener maps it; bind and unbind add one

Every process that opens the exchange routes by the same file: ``publish`` reads the
change count from the shared page (a memory load, no system call) and re-reads the file
when it moved, so a binding added in one process applies to the next record any process
publishes.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from time import monotonic
from typing import Any, NamedTuple

from .._errors import ClosedError, K7Error
from .._format import Fsync
from .._kernel import ffi
from .._queue import Queue
from .._resource import Resource
from .._stats import list_segment_infos
from .._storage import (
    FILE_MODE,
    open_fd,
    preallocate,
    read_file,
)
from .._storage import Mapping as FileMap
from ._envelope import HeadersArg, Value, check_headers, check_timestamp, value_bytes
from ._errors import TopicDeletedError, TopicError
from ._layout import META_FILE, PARTITION_PREFIX, DirWatch, make_dirs, write_atomic
from ._lockfile import LOCK_TIMEOUT, holding
from ._routing import (
    Binding,
    ExchangeKind,
    HeaderPredicate,
    InvalidBindingError,
    Router,
    parse_header_condition,
)
from ._topic import Topic

EXCHANGE_FILE = "k7py-exchange.json"
EXCHANGE_LOCK = "k7py-exchange.lock"
EXCHANGE_GEN = "k7py-exchange.gen"
GEN_SIZE = 4096
VERSION = 1


class Delivery(NamedTuple):
    """Where ``publish`` wrote a record: the destination's path, the partition (None for a
    queue) and the offset."""

    destination: str
    partition: int | None
    offset: int


def _parse(data: bytes, path: Path) -> tuple[ExchangeKind, tuple[Binding, ...]]:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("k7py") != "exchange":
            raise ValueError("not an exchange's file")
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, this k7py reads {VERSION}")
        kind = ExchangeKind(doc["kind"])
        bindings = tuple(Binding.from_json(b) for b in doc["bindings"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TopicError(
            f"{path} is not a valid exchange file: {exc}", path=path,
            hint="restore it, or create the exchange again and bind its destinations",
        ) from None
    return kind, bindings


def _dump(kind: ExchangeKind, bindings: tuple[Binding, ...]) -> bytes:
    return json.dumps({
        "k7py": "exchange", "version": VERSION, "kind": kind.value,
        "bindings": [b.to_json() for b in bindings],
    }, indent=1).encode() + b"\n"


class Exchange(Resource):
    """A routing exchange (AMQP 0-9-1's kinds: ``direct``, ``topic``, ``fanout``,
    ``headers``) whose bindings live in its directory.

    ``Exchange(path, kind)`` creates it or opens it (then ``kind`` must match; None opens
    an existing one). ``bind`` and ``unbind`` change the stored bindings for every process;
    ``bind_predicate`` adds an in-process binding on the record's headers (TitanMQ's
    content-based exchange). ``publish`` routes a record, then writes it to each matching
    destination: a topic (the record with its key, headers and timestamp; the key places it)
    or a queue (the value alone, as a plain queue's consumers expect). Destinations are
    opened on first use with this exchange's ``fsync`` (topics and queues as shared
    writers) and closed with it. Use an Exchange from one thread at a time.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        kind: str | None = None,
        *,
        fsync: str | Fsync = Fsync.ASYNC,
        file_mode: int = FILE_MODE,
    ) -> None:
        self._closed = True
        self._path = Path(path)
        self._file = self._path / EXCHANGE_FILE
        self._file_mode = file_mode
        self._fsync = fsync
        if kind is not None:
            try:
                kind = ExchangeKind(kind)
            except ValueError:
                raise InvalidBindingError(
                    f"the exchange kind is {kind!r}",
                    hint="use one of 'direct', 'topic', 'fanout', 'headers'",
                ) from None
        if not self._file.exists():
            if kind is None:
                raise TopicError(
                    f"{self._path} is not an exchange (no {EXCHANGE_FILE})", path=self._path,
                    hint="pass kind= to create it",
                )
            make_dirs(self._path, "exchange directory")
            with self._locked():
                if not self._file.exists():
                    write_atomic(self._file, _dump(ExchangeKind(kind), ()), file_mode)
        self._gen_map = self._map_gen()
        self._gen_word: Any = ffi.cast("uint64_t *", self._gen_map.ptr)
        self._gen = -1
        self._predicates: list[tuple[str, HeaderPredicate]] = []
        try:
            self._load()
        except BaseException:
            self._gen_map.close()
            raise
        if kind is not None and kind != self._kind:
            self._gen_map.close()
            raise TopicError(
                f"exchange {self._path} is of kind {self._kind.value!r}, not "
                f"{ExchangeKind(kind).value!r}",
                path=self._path, hint="open it with kind=None or its own kind",
            )
        # No finalizer: each destination has its own (see Topic).
        self._dests: dict[str, Topic | Queue] = {}
        self._queue_dirs: dict[str, DirWatch] = {}  # a bound queue's directory
        self._closed = False

    # ------------------------------------------------------------------ bindings

    @property
    def path(self) -> Path:
        return self._path

    @property
    def kind(self) -> str:
        return self._kind.value

    @property
    def closed(self) -> bool:
        return self._closed

    def bindings(self) -> tuple[Binding, ...]:
        """The stored bindings, as every process sees them now."""
        self._check_open()
        self._refresh()
        return self._bindings

    def bind(
        self,
        destination: str | os.PathLike[str],
        routing_key: str = "",
        *,
        headers: str | Mapping[str, str] | None = None,
        x_match: str = "all",
    ) -> Binding:
        """Bind a topic or queue directory (it must exist). ``routing_key``: the exact key
        (direct) or a pattern (topic); ``headers``: pairs to match (headers kind), as a
        mapping or TitanMQ's ``"region=eu,type=order"``. Binding twice stores one
        binding. Returns it."""
        self._check_open()
        dest = self._destination(destination)
        pairs: tuple[tuple[str, str], ...] = ()
        if isinstance(headers, str):
            pairs = parse_header_condition(headers)
        elif headers is not None:
            if not isinstance(headers, Mapping):
                raise InvalidBindingError(
                    "headers must be a mapping or a 'name=value,...' string"
                )
            pairs = tuple(headers.items())
        b = Binding(dest, routing_key, pairs, x_match)
        with self._locked():
            kind, bindings = _parse(read_file(self._file), self._file)
            if b not in bindings:
                write_atomic(self._file, _dump(kind, (*bindings, b)), self._file_mode)
                self._changed()
        self._refresh()
        return b

    def unbind(self, binding: Binding) -> bool:
        """Remove a stored binding (as ``bind`` or ``bindings`` returned it); False if it
        was not there."""
        self._check_open()
        if not isinstance(binding, Binding):
            raise TypeError(f"unbind takes a Binding, not {type(binding).__name__}")
        with self._locked():
            kind, bindings = _parse(read_file(self._file), self._file)
            if binding not in bindings:
                return False
            rest = tuple(b for b in bindings if b != binding)
            write_atomic(self._file, _dump(kind, rest), self._file_mode)
            self._changed()
        self._refresh()
        return True

    def bind_predicate(
        self, destination: str | os.PathLike[str], predicate: HeaderPredicate
    ) -> None:
        """Route records whose headers satisfy ``predicate`` (called with a read-only
        name -> bytes map) to ``destination`` too — in this process only (a function is not
        stored). An exception from the predicate propagates out of ``publish``, and that
        record is written nowhere."""
        self._check_open()
        if not callable(predicate):
            raise TypeError("predicate must be callable")
        self._predicates.append((self._destination(destination), predicate))
        self._router = Router(self._kind, self._bindings, self._predicates)

    def _destination(self, destination: str | os.PathLike[str]) -> str:
        p = Path(destination).resolve()
        if not p.is_dir():
            raise InvalidBindingError(
                f"destination {p} does not exist",
                hint="create the topic (Topic(path, partitions=N)) or queue first",
            )
        if p.name.startswith(PARTITION_PREFIX) and (p.parent / META_FILE).exists():
            raise InvalidBindingError(
                f"destination {p} is a partition of topic {p.parent}",
                hint="bind the topic: its partitioner places each record",
            )
        return str(p)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return holding(self._path / EXCHANGE_LOCK, self._file_mode, LOCK_TIMEOUT,
                       "the exchange's lock")

    def _map_gen(self) -> FileMap:
        """Map the change count's page (created, with real blocks, by the first opener)."""
        path = self._path / EXCHANGE_GEN
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, self._file_mode)
        try:
            if os.fstat(fd).st_size < GEN_SIZE:
                with self._locked():
                    if os.fstat(fd).st_size < GEN_SIZE:
                        preallocate(fd, GEN_SIZE, path)
            return FileMap(fd, GEN_SIZE, writable=True)
        finally:
            os.close(fd)

    def _changed(self) -> None:
        """Under the lock, after the file is replaced: every opener reloads at its next call."""
        self._gen_word[0] = self._gen_word[0] + 1

    def _refresh(self) -> None:
        if self._gen_word[0] != self._gen:
            self._load()

    def _load(self) -> None:
        gen = int(self._gen_word[0])  # before the read: a change during it reloads again
        self._kind, self._bindings = _parse(read_file(self._file), self._file)
        self._gen = gen
        self._router = Router(self._kind, self._bindings, self._predicates)

    # ------------------------------------------------------------------ publishing

    def route(self, routing_key: str = "", headers: HeadersArg = None) -> list[str]:
        """The destinations a record would go to now (nothing written)."""
        self._check_open()
        self._refresh()
        return self._router.route(routing_key, check_headers(headers) or None)

    def publish(
        self,
        value: Value,
        routing_key: str = "",
        *,
        key: Value | None = None,
        headers: HeadersArg = None,
        timestamp: int | None = None,
    ) -> list[Delivery]:
        """Route the record, then write it to every matching destination (none: nothing
        is written, an empty list). Each destination gets one copy."""
        self._check_open()
        self._refresh()
        hs = check_headers(headers)
        ts = check_timestamp(timestamp)
        routed = self._router.route(routing_key, hs or None)
        for dest in routed:  # every one exists before anything is written
            self._open(dest)
        out = []
        for dest in routed:
            try:
                out.append(self._write(dest, value, key, hs, ts))
            except TopicDeletedError:  # deleted under the cached one: replaced since?
                self._forget(dest)
                out.append(self._write(dest, value, key, hs, ts))
        return out

    def _write(
        self, dest: str, value: Value, key: Value | None, hs: HeadersArg, ts: int | None,
    ) -> Delivery:
        d = self._open(dest)
        if isinstance(d, Topic):
            p, off = d.send(value, key, hs, ts)  # checks its partition's directory
            return Delivery(dest, p, off)
        w = self._queue_dirs[dest]
        if monotonic() >= w.due:
            w.check()
        return Delivery(dest, None, d.enqueue(value_bytes(value)))

    def _open(self, dest: str) -> Topic | Queue:
        d = self._dests.get(dest)
        if d is None:
            path = Path(dest)
            if not path.is_dir():
                raise TopicDeletedError(
                    f"destination {dest} of exchange {self._path} does not exist (deleted?); "
                    "nothing was written", path=dest,
                    hint="create it again, or unbind it",
                )
            args: dict[str, Any] = {"fsync": self._fsync, "file_mode": self._file_mode}
            if (path / META_FILE).exists():
                d = Topic(path, **args)  # its recorded segment size
            else:
                infos = list_segment_infos(path)  # the queue's own segment size
                if infos:
                    args["segment_size"] = infos[-1].size
                d = Queue(path, writers="shared", **args)
                try:
                    self._queue_dirs[dest] = DirWatch(
                        path, 0.0 if d.fsync is Fsync.SYNC else d.commit_interval,
                        f"queue {dest} bound to exchange {self._path}")
                except BaseException:
                    d.close()
                    raise
            self._dests[dest] = d
        return d

    def _forget(self, dest: str) -> None:
        """Drop a destination opened in a directory since deleted (what it held is gone:
        its close may fail, and says so in the log)."""
        d = self._dests.pop(dest, None)
        watch = self._queue_dirs.pop(dest, None)
        if watch is not None:
            watch.close()
        if d is not None:
            with contextlib.suppress(K7Error):
                d.close()

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"exchange {self._path} is closed", path=self._path)

    def close(self) -> None:
        """Close the destinations this exchange opened. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._gen_word = None
        self._gen_map.close()
        for watch in self._queue_dirs.values():
            watch.close()
        self._queue_dirs.clear()
        _close_all(self._dests)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._bindings)} bindings"
        return f"<k7core.topics.Exchange {str(self._path)!r} {self._kind.value} {state}>"


def _close_all(dests: dict[str, Topic | Queue]) -> None:
    first: BaseException | None = None
    for d in dests.values():
        try:
            d.close()
        except K7Error as exc:
            first = first or exc
    dests.clear()
    if first is not None:
        raise first
