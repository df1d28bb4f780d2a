"""The helpers the tests share: one copy of each (not a test module).

Import them as ``from tests._queuehelp import ...`` (the repository's root is on ``sys.path``
through pytest's ``pythonpath`` setting; the older spelling ``from _queuehelp import ...``
works too, ``tests/`` being on the path through its conftest). The child programs
(``tests/_children.py``, ``tests/core/_soak_children.py``) import their message format from
here too, so parent and child agree on the bytes of message ``i``.

The frame and segment helpers (``frame_size``, ``encode_frame``, ``crc32c``, ``segments``, ...)
and ``stored_cursor`` restate the format (docs/format.md) independently of k7core, for the
tests that check the format itself (test_format.py, recovery's validator, the k7 port); the
cursor and position-file helpers otherwise use k7core's codecs (``k7core._format``, the one
source of the format).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import crc32c as _crc32c
import pytest

import k7core
from k7core._format import (
    POSITION_FILE,
    POSITION_FILE_SIZE,
    cursor_name,
    decode_cursor,
    encode_cursor,
)
from k7core._kernel import ffi

#: The repository's root: the directory that holds ``k7core``, ``k7async`` and ``tests``.
ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------- the on-disk format

#: Frame header: magic (1), flags (1), big-endian u32 length (4), big-endian u32 CRC32C (4).
HEADER = 10
MAGIC = 0x4B
FLAG_COMMITTED = 0x01
#: Frames start on 8-byte boundaries.
ALIGN = 8
SEG_RE = re.compile(r"^seg-(\d{20})\.k7$")


def frame_size(n: int) -> int:
    """The size on disk of a frame carrying an ``n``-byte payload (header, payload, padding
    to 8 bytes)."""
    return (HEADER + n + ALIGN - 1) // ALIGN * ALIGN


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, by the ``crc32c`` package (not k7core's kernel)."""
    return int(_crc32c.crc32c(data))


def encode_frame(data: bytes) -> bytes:
    """One frame as docs/format.md describes it: magic, flags, length and CRC32C of the
    payload (big-endian u32 each), the payload, zero padding to 8 bytes."""
    raw = bytes([MAGIC, FLAG_COMMITTED]) + struct.pack(">II", len(data), crc32c(data)) + data
    return raw + bytes(frame_size(len(data)) - len(raw))


def seg_name(base: int) -> str:
    """The file name of the segment whose first frame is at global offset ``base``."""
    return f"seg-{base:020d}.k7"


def segments(d: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(base offset, path)`` of every segment file (``seg-<20 digits>.k7``) of ``d``, by
    base. Any other name of the form ``seg-*.k7`` fails: k7 would take it for a segment."""
    out = []
    for n in os.listdir(d):
        if m := SEG_RE.match(n):
            out.append((int(m.group(1)), Path(d) / n))
        else:
            assert not fnmatch.fnmatch(n, "seg-*.k7"), f"{n} looks like a segment to k7"
    return sorted(out)


def seg_bases(d: str | os.PathLike[str]) -> list[int]:
    """The base offsets of the segment files of ``d`` (see :func:`segments`), sorted."""
    return [b for b, _ in segments(d)]


def seg_paths(d: str | os.PathLike[str]) -> list[Path]:
    """The segment files of ``d`` (see :func:`segments`), by base offset."""
    return [p for _, p in segments(d)]


def seg_files(d: str | os.PathLike[str]) -> list[str]:
    """The names of the files of ``d`` that start with ``seg-`` (segment names or not),
    sorted."""
    return sorted(n for n in os.listdir(d) if n.startswith("seg-"))


def read_cursor(d: str | os.PathLike[str], group: str) -> int:
    """The committed offset stored in the cursor file of ``group`` (k7core's codec)."""
    return decode_cursor((Path(d) / cursor_name(group)).read_bytes())


def stored_cursor(d: str | os.PathLike[str], group: str) -> int:
    """The same, decoded here independently of k7core (for the tests that check the format
    itself): a big-endian int64 at byte 0 of ``cursor-<group>.k7``."""
    with open(Path(d) / f"cursor-{group}.k7", "rb") as f:
        return int(struct.unpack(">q", f.read(8))[0])


def write_cursor(d: str | os.PathLike[str], group: str, value: int) -> None:
    """Overwrite the committed offset in the cursor file of ``group`` by hand (the file must
    exist)."""
    with open(Path(d) / cursor_name(group), "r+b") as f:
        f.write(encode_cursor(value))


def waiters(d: str | os.PathLike[str]) -> int:
    """The shared count of readers blocked in ``poll`` / ``wait`` (``k7_pos.waiters`` in
    the position file)."""
    with open(Path(d) / POSITION_FILE, "rb") as f:
        return int(ffi.from_buffer("k7_pos *", f.read(POSITION_FILE_SIZE)).waiters)


def snapshot(d: str | os.PathLike[str]) -> dict[str, tuple[int, int, str]]:
    """Every entry of ``d``: size, modification time and SHA-256 of the content. Equal
    snapshots mean nothing was written."""
    out: dict[str, tuple[int, int, str]] = {}
    for p in sorted(Path(d).iterdir()):
        st = p.stat()
        out[p.name] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def file_contents(d: str | os.PathLike[str]) -> dict[str, bytes]:
    """The content of every regular file of ``d``, by name."""
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


# ---------------------------------------------------------------------- messages

_FILL = (b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 40)[:2200]


def payload(i: int, lo: int = 0, hi: int = 200) -> bytes:
    """Message ``i``: ``m<i:08d>-`` then a filler whose length (``lo..hi``) and content
    depend on ``i``; so every message identifies itself and any torn or mixed-up byte shows."""
    n = lo + (i * 7919) % (hi - lo + 1)
    k = i % 64
    return b"m%08d-" % i + _FILL[k : k + n]


def message(i: int, size: int = 100) -> bytes:
    """Message ``i`` of exactly ``size`` bytes (at least 10): ``payload(i)``'s form."""
    assert size >= 10, size
    return payload(i, size - 10, size - 10)


def index_of(data: bytes | memoryview) -> int:
    """The index ``i`` a ``payload(i)`` / ``message(i, size)`` names."""
    head = bytes(data[:10])
    assert head[:1] == b"m" and head[9:10] == b"-", head
    return int(head[1:9])


def fill(q: k7core.Queue, n: int, size: int = 100, start: int = 0) -> list[int]:
    """Enqueue ``message(i, size)`` for ``i`` in ``start .. start+n-1`` in one
    ``enqueue_many``; return the offsets."""
    return q.enqueue_many([message(i, size) for i in range(start, start + n)])


def write_queue(
    d: str | os.PathLike[str],
    payloads: Sequence[bytes],
    *,
    segment_size: int,
    fsync: str = "flush",
    batch: bool = False,
) -> list[int]:
    """Open (create) the queue at ``d``, enqueue ``payloads`` (one ``enqueue`` each, or one
    ``enqueue_many`` with ``batch=True``), close it; return the offsets."""
    with k7core.Queue(d, segment_size=segment_size, fsync=fsync) as q:
        if batch:
            return q.enqueue_many(payloads)
        return [q.enqueue(p) for p in payloads]


# ---------------------------------------------------------------------- reading

Record = tuple[int, bytes]


def records(msgs: Iterable[k7core.Message]) -> list[Record]:
    """``(offset, payload bytes)`` of each message."""
    return [(m.offset, bytes(m.payload)) for m in msgs]


def payloads(msgs: Iterable[k7core.Message]) -> list[bytes]:
    """The payload bytes of each message."""
    return [bytes(m.payload) for m in msgs]


def read_records(
    q: k7core.Queue, start: int = 0, max_messages: int = 65536
) -> list[Record]:
    """Every ``(offset, payload)`` of the log from ``start`` by ``read_columnar`` (no consumer
    group), ``max_messages`` per call. Call it once nothing writes any more."""
    out: list[Record] = []
    offset = start
    while len(batch := q.read_columnar(offset, max_messages)):
        out.extend((batch.offsets[i], bytes(batch.payload(i))) for i in range(len(batch)))
        offset = batch.next
    return out


def read_all(q: k7core.Queue, start: int = 0) -> list[bytes]:
    """Every payload of the log from ``start`` (default 0), in order, by ``read_columnar``.
    Call it once nothing writes any more."""
    return [p for _, p in read_records(q, start)]


def read_dir(d: str | os.PathLike[str]) -> list[bytes]:
    """Every payload of the queue at ``d`` from its earliest offset, opened read-only."""
    with k7core.Queue(d, readonly=True) as q:
        return read_all(q, q.earliest())


Ack = Literal["batch", "each"] | None


def drain(
    g: k7core.ConsumerGroup,
    *,
    ack: Ack = None,
    max_batch: int = 256,
    timeout: float = 0.0,
    max_polls: int = 100_000,
) -> list[k7core.Message]:
    """Poll ``g`` until a poll comes back empty; return every message received.

    ``ack``: ``"batch"`` acks each batch with one ``ack_many``; ``"each"`` acks message by
    message and checks that every ``ack`` returns True; ``None`` acks nothing. A group that
    never meets an empty poll within ``max_polls`` polls fails."""
    out: list[k7core.Message] = []
    for _ in range(max_polls):
        batch = g.poll(max_batch=max_batch, timeout=timeout)
        if not batch:
            return out
        if ack == "batch":
            g.ack_many(batch)
        elif ack == "each":
            for m in batch:
                assert g.ack(m) is True, m
        out.extend(batch)
    raise AssertionError(f"no empty poll in {max_polls} polls")


def consume(q: k7core.Queue, group: str, *, max_batch: int = 256) -> list[k7core.Message]:
    """Open consumer group ``group``, :func:`drain` it acking each batch, check that it
    reached the visible end of ``q``, close it; return the messages (their payload views
    stay valid while referenced)."""
    with q.consumer_group(group) as g:
        got = drain(g, ack="batch", max_batch=max_batch)
        assert g.position == q.end, f"group {group!r} stopped at {g.position} below {q.end}"
        return got


def drain_to_end(
    g: k7core.ConsumerGroup,
    q: k7core.Queue,
    *,
    max_batch: int = 256,
    max_polls: int = 100_000,
) -> list[Record]:
    """Poll ``g`` (without waiting, without acking) until its position reaches the visible
    end of ``q``; return ``(offset, payload)`` of every message. Unlike :func:`drain`, an
    empty poll below the end (the reader stepping to the next segment) polls again; a group
    that never reaches the end within ``max_polls`` polls fails."""
    out: list[Record] = []
    for _ in range(max_polls):
        batch = g.poll(max_batch=max_batch, timeout=0)
        if not batch and g.position >= q.end:
            return out
        out.extend(records(batch))
    raise AssertionError(f"group {g.name!r} never reached the end of the log ({q.end})")


def replay(q: k7core.Queue, group: str = "verify", *, max_batch: int = 256) -> list[Record]:
    """Every ``(offset, payload)`` of the log read through consumer group ``group``, from
    offset 0 (``seek(0)``, which also commits 0), to the end; the group is closed after."""
    with q.consumer_group(group) as g:
        g.seek(0)
        assert g.committed == 0
        return drain_to_end(g, q, max_batch=max_batch)


# ---------------------------------------------------------------------- waiting


def poll_until(cond: Callable[[], object], timeout: float) -> bool:
    """Check ``cond`` until it is true (True) or ``timeout`` seconds have passed (False).

    For state that nothing signals to this thread or process (another thread asleep in a
    call, a waiter count in a shared file): the loop reads the real state each time, it is
    not a synchronisation sleep."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)
    return True


def wait_until(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """:func:`poll_until`, failing the test with ``what`` past ``timeout``."""
    assert poll_until(cond, timeout), f"timed out after {timeout} s waiting for {what}"



def child_env() -> dict[str, str]:
    """This process's environment with the repository's root first on ``PYTHONPATH``, for
    child processes that import ``k7core`` or ``tests.*``."""
    root, path = str(ROOT), os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root if not path else root + os.pathsep + path)


def run_python(code: str, *args: str, timeout: float = 120) -> str:
    """Run ``code`` with ``python -c`` in a child process (``args``: its ``sys.argv[1:]``;
    environment: :func:`child_env`); return its stdout. Fails with the child's output unless
    it exits with status 0."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=child_env())
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout

# ---------------------------------------------------------------------- checking a log


def check_log(
    d: str | os.PathLike[str], *, fsync: str, segment_size: int
) -> tuple[int | None, list[int], int]:
    """Recover the queue at ``d`` as its writer would and check that it holds exactly
    ``payload(j), payload(j+1), ...`` from its earliest offset, frame after frame (no gap,
    duplicate, reorder or torn payload). Returns ``j`` (None when retention left no message),
    the offsets of the messages, and the end of the log."""
    offsets: list[int] = []
    with k7core.Queue(d, fsync=fsync, segment_size=segment_size) as q:
        earliest = q.earliest()
        first = None
        for off, got in read_records(q, earliest):
            if first is None:
                first = index_of(got)
            i = first + len(offsets)
            assert got == payload(i), f"message {i}: {got[:24]!r} != {payload(i)[:24]!r}"
            offsets.append(off)
        expect = earliest
        for k, o in enumerate(offsets):
            # one contiguous logical log: a segment is sealed where the next frame did not
            # fit, and the next segment's base is that position
            assert o == expect, f"message {(first or 0) + k} at {o}, expected {expect}"
            expect = o + frame_size(len(payload((first or 0) + k)))
        return first, offsets, q.end


# ---------------------------------------------------------------------- the command line

#: The ``k7`` console script installed beside this interpreter.
K7 = Path(sys.executable).parent / "k7"
K7_TIMEOUT = 120
#: The segment size of :func:`closed_queue`'s queue.
CLI_SEG = 4096


def k7(*args: str | os.PathLike[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run the ``k7`` console script in a subprocess; its exit status is not checked."""
    if not K7.exists():
        pytest.fail(f"the console script {K7} is not installed (pip install -e '.[test]')")
    return subprocess.run([str(K7), *map(str, args)], input=stdin, capture_output=True,
                          timeout=K7_TIMEOUT, check=False)


def cli_message(i: int) -> bytes:
    """Message ``i`` of the command-line tests: readable text, ``i % 50`` dots."""
    return b"message %d " % i + b"." * (i % 50)


def closed_queue(d: str | os.PathLike[str]) -> Path:
    """A closed queue of 200 ``cli_message`` over several ``CLI_SEG``-byte segments, groups
    a (60 acked) and b (nothing acked)."""
    with k7core.Queue(d, segment_size=CLI_SEG, fsync="flush") as q:
        q.enqueue_many([cli_message(i) for i in range(200)])
        with q.consumer_group("a") as a:
            a.ack_many(a.poll(max_batch=60))
        q.consumer_group("b").close()
    return Path(d)


def offsets_of(d: str | os.PathLike[str]) -> list[int]:
    """The offsets of every message of the queue at ``d``, opened read-only."""
    with k7core.Queue(d, readonly=True) as q:
        return [o for o, _ in read_records(q)]


# ---------------------------------------------------------------------- use-after-close matrices


def public_names(cls: type) -> list[str]:
    """Every public name of ``cls`` (methods and properties, inherited ones included)."""
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def close_cases(classes: Mapping[str, tuple[type, Sequence[str]]]) -> list[object]:
    """The cases of a use-after-close matrix: ``(kind, member, closer)`` for every public
    member of each kind's class and each way of closing it (``classes``: kind -> (class,
    closers)); the first closer is the default and adds nothing to the test id."""
    out: list[object] = []
    for kind, (cls, closers) in classes.items():
        for name in public_names(cls):
            for k, closer in enumerate(closers):
                suffix = f"-by-{closer}" if k else ""
                out.append(pytest.param(kind, name, closer, id=f"{kind}.{name}{suffix}"))
    return out


def check_listed(kind: str, name: str, readable: str | None, call: object) -> None:
    """A public member must have a call in the matrix or a reason to stay readable."""
    assert readable or call is not None, (
        f"{kind}.{name} is public but the matrix has no call for it: add one to CALLS (and"
        " make it raise ClosedError after close) or a reason to STAY_READABLE"
    )


def expect_known(
    request: pytest.FixtureRequest, known: tuple[type[BaseException] | None, str] | None
) -> None:
    """Mark the running test a strict xfail when ``known`` says what the member does
    instead of raising ``ClosedError``: the exception it raises (``None``: it succeeds, so
    ``pytest.raises`` fails) and why."""
    if known is not None:
        raised, reason = known
        request.applymarker(pytest.mark.xfail(
            strict=True, reason=reason,
            raises=raised if raised is not None else pytest.fail.Exception,
        ))
