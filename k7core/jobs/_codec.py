"""The job store's encodings: one journal record per journaled mutation, and snapshots.

Every integer and float is little-endian; ``f64`` is an IEEE double (wall-clock seconds, or
seconds of delay); strings are UTF-8 (tube names are ASCII).

Journal records: one k7 frame each, the first byte the operation. The store gives the job of a
PUT the id *offset of its frame + 1* (never 0, never reused), so a PUT does not carry its id.

    PUT      1  u32 priority, f64 delay, f64 ttr, f64 ready_at (0: not delayed),
                f64 created_at, u8 tube length, u16 key length (0xFFFF: no key),
                u32 dependency count (44 bytes so far); then the tube, the key, the
                dependency ids (u64 each), and the body: the rest of the record
    DELETE   2  u64 id
    RELEASE  3  u64 id, u32 priority, f64 delay, f64 ready_at (0: ready now),
                u8 1 if an error text follows; the error text: the rest of the record
    BURY     4  u64 id, u32 priority, u8 1 if an error text follows; the error text
    KICK     5  u64 id
    READY    6  u64 id (a delayed or buried job made ready by reserve-job; no counter)
    PUT_WITH 7  u8 flags (1: a mark follows, 2: remember the key, 4: a group follows), the
                mark if flag 1 (u16 name length, the name, u64 position), the group if
                flag 4 (u16 length, the name), then a whole PUT record (its operation byte
                included); the job's id is this record's offset + 1
    MARK     8  u64 position, then the mark's name: the rest of the record (a put with a
                mark that stored nothing: its key was taken)
    FORGET   9  u8 tube length, the tube, then per key: u16 length, the key (to the end)
    FORGET_GROUP 10  u8 tube length, the tube, then the group's name: the rest of the record
    PAD     11  zeros to the end of the record: nothing to apply; written by a repair so
                that the journal's next offset, and so the next job id, lies past every id
                that may have been handed out (``_damage``)

A store written before PUT_WITH, MARK, FORGET, FORGET_GROUP and PAD existed has none of
them: its journal replays as it did.

Reservations, touches, time-to-run expiries, delays coming due and pauses are not journaled
(as in beanstalkd's binlog); replaying a journal therefore leaves every job that was reserved
ready (or where its last record left it), and the store calls ``advance(now)`` after replay.

Snapshot (``dump_snapshot`` yields it in chunks; the fixed-size rows come first, in one
block, so loading reads them with ``struct.iter_unpack``):

    header   8s magic b"K7JOBSNP", u32 version (3), u64 position (the journal offset the
             snapshot covers, given by the store), u32 tube count, then per tube: u8 name
             length, the name; u64 job count
    rows     per job, 69 bytes: u64 id, u32 tube index, u8 state (0 ready, 1 delayed,
             2 buried, 3 waiting; a reserved job is saved ready), u32 priority, f64 delay,
             f64 ttr, f64 ready_at, f64 created_at, u32 reserves, timeouts, releases, buries,
             kicks. Jobs that are not buried come in id order, then the buried ones tube by
             tube, oldest buried first (the order kick takes them).
    lengths  per job, u32 body length, in the order of the rows
    bodies   every body, in the order of the rows
    extras   u64 count, then per job that has a key, dependencies or error texts: u64 id,
             u16 key length (0xFFFF: no key), u32 dependency count, u8 error count; the key,
             the dependency ids (u64 each), each error text (u16 length, the text)
    marks    u64 count, then per mark: u16 name length, the name, u64 position
    kept     u64 count of tubes with remembered keys, then per tube: u8 name length, the
             name, u64 key count, then per key: u16 length, the key, u64 the id it had
    groups   u64 count of job groups, then per group: u8 tube length, the tube, u16 name
             length, the name, u64 done count, u64 live job count, the live ids (u64 each)
    trailer  u32 CRC32C (Castagnoli, ``k7core.crc32c``: the C kernel's, hardware where the
             CPU has it) of every byte before it.

Version 1 (written before marks and remembered keys) has no ``marks``, ``kept`` and
``groups``; version 2 (before job groups) no ``groups``: both still load, with none.

Not in a snapshot: reservations (their jobs are ready), pauses, tube references, and the
counters beanstalkd keeps since its start (total-jobs, job-timeouts, cmd-delete...).
"""

from __future__ import annotations

import gc
import struct
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, pairwise

from .._kernel import crc32c
from ._errors import CorruptJobDataError
from ._machine import MAX_U32, SNAPSHOT_STATES, JobMachine, JobState, PutPlan

OP_PUT = 1
OP_DELETE = 2
OP_RELEASE = 3
OP_BURY = 4
OP_KICK = 5
OP_READY = 6
OP_PUT_WITH = 7
OP_MARK = 8
OP_FORGET = 9
OP_FORGET_GROUP = 10
OP_PAD = 11
PUT_MARK = 1
"""PUT_WITH's flag: a mark follows."""
PUT_REMEMBER = 2
"""PUT_WITH's flag: remember the key."""
PUT_GROUP = 4
"""PUT_WITH's flag: a group follows."""

_NO_KEY = 0xFFFF
_PUT = struct.Struct("<BIddddBHI")
_ID = struct.Struct("<BQ")
_RELEASE = struct.Struct("<BQIddB")
_BURY = struct.Struct("<BQIB")
_DELETE_HEAD = bytes([OP_DELETE])
_KICK_HEAD = bytes([OP_KICK])
_READY_HEAD = bytes([OP_READY])

MAGIC = b"K7JOBSNP"
VERSION = 3
VERSIONS = (1, 2, VERSION)
"""The snapshot versions this code reads."""
_HEADER = struct.Struct("<8sIQI")
_COUNT = struct.Struct("<Q")
_ROW = struct.Struct("<QIBIddddIIIII")
_EXTRA = struct.Struct("<QHIB")
_CRC = struct.Struct("<I")
_U16 = struct.Struct("<H")
_STATE_CODES = {state: i for i, state in enumerate(SNAPSHOT_STATES)} | {JobState.RESERVED: 0}
_CHUNK_ITEMS = 16384  # rows, bodies or extras per chunk


# --- journal records -----------------------------------------------------------------------


def encode_put(
    tube: str, priority: int, delay: float, ttr: float, ready_at: float, created_at: float,
    key: str | None, dep_ids: tuple[int, ...], body: bytes,
) -> bytes:
    """The PUT record of a checked put (``encode_put(*plan)``)."""
    if key is None and not dep_ids:  # (a checked tube name is ASCII: its length in bytes)
        return _PUT.pack(OP_PUT, priority, delay, ttr, ready_at, created_at, len(tube),
                         _NO_KEY, 0) + tube.encode() + body
    name = tube.encode("ascii")
    raw_key = b"" if key is None else key.encode()
    return b"".join((
        _PUT.pack(OP_PUT, priority, delay, ttr, ready_at, created_at, len(name),
                  _NO_KEY if key is None else len(raw_key), len(dep_ids)),
        name, raw_key, struct.pack(f"<{len(dep_ids)}Q", *dep_ids), body,
    ))


def encode_put_with(plan: PutPlan, mark: tuple[str, int] | None, remember: bool,
                    group: str | None = None) -> bytes:
    """The PUT_WITH record of a checked put with a mark, ``remember=True`` or a group."""
    head = bytes([OP_PUT_WITH, (PUT_MARK if mark is not None else 0)
                  | (PUT_REMEMBER if remember else 0) | (PUT_GROUP if group is not None else 0)])
    if mark is not None:
        head += _text(mark[0]) + _COUNT.pack(mark[1])
    if group is not None:
        head += _text(group)
    return head + encode_put(*plan)


def encode_mark(name: str, position: int) -> bytes:
    """The MARK record of a put with a mark that stored nothing."""
    return _ID.pack(OP_MARK, position) + name.encode()


def encode_forget(tube: str, keys: Iterable[str]) -> bytes:
    """The FORGET record of remembered ``keys`` of ``tube``."""
    parts = [bytes([OP_FORGET, len(tube)]), tube.encode("ascii")]
    for key in keys:
        raw = key.encode()
        parts += (_U16.pack(len(raw)), raw)
    return b"".join(parts)


def encode_forget_group(tube: str, group: str) -> bytes:
    """The FORGET_GROUP record of group ``group`` of ``tube``."""
    return bytes([OP_FORGET_GROUP, len(tube)]) + tube.encode("ascii") + group.encode()


def encode_delete(job_id: int) -> bytes:
    """The DELETE record of job ``job_id``."""
    return _DELETE_HEAD + job_id.to_bytes(8, "little")


def encode_release(
    job_id: int, priority: int, delay: float, ready_at: float, error: str | None,
) -> bytes:
    """The RELEASE record of a checked release (``encode_release(*plan)``)."""
    head = _RELEASE.pack(OP_RELEASE, job_id, priority, delay, ready_at, error is not None)
    return head if error is None else head + error.encode()


def encode_bury(job_id: int, priority: int, error: str | None) -> bytes:
    """The BURY record of a checked bury (``encode_bury(*plan)``)."""
    head = _BURY.pack(OP_BURY, job_id, priority, error is not None)
    return head if error is None else head + error.encode()


def encode_kick(job_id: int) -> bytes:
    """The KICK record of one job moved to ready by ``kick`` or ``kick_job``."""
    return _KICK_HEAD + job_id.to_bytes(8, "little")


def encode_ready(job_id: int) -> bytes:
    """The READY record of a delayed or buried job that reserve-job takes."""
    return _READY_HEAD + job_id.to_bytes(8, "little")


def encode_pad(length: int) -> bytes:
    """A PAD record of ``length`` bytes (at least 1)."""
    return bytes([OP_PAD]) + bytes(length - 1)


def replay(machine: JobMachine, record: bytes | bytearray | memoryview, offset: int) -> None:
    """Apply one journal record, read at journal ``offset``, to ``machine`` (a PUT makes job
    ``offset + 1``). CorruptJobDataError if the record cannot be decoded."""
    try:
        _replay(machine, record, offset)
    except (struct.error, IndexError, ValueError) as exc:  # UnicodeDecodeError too
        raise CorruptJobDataError(f"job journal record at offset {offset} cannot be decoded "
                                  f"({exc})", offset=offset,
                                  hint="the journal is damaged or from a newer version") from exc


def replay_batch(
    machine: JobMachine, view: memoryview, starts: Sequence[int], lengths: Sequence[int],
    offsets: Sequence[int], end: int,
) -> bool:
    """Apply the records of one read batch (record ``i`` is ``view[starts[i]:][:lengths[i]]``
    at journal offset ``offsets[i]``) that lie below ``end``; False once one does not.

    The same as :func:`replay` per record, with the plain PUT (no key, no dependencies) decoded
    inline: replaying the journal at open is mostly PUTs, and a call less per record counts.
    """
    unpack, size = _PUT.unpack_from, _PUT.size
    tubes: dict[bytes, str] = {}
    puts: list[tuple[int, str, int, float, float, float, float, bytes]] = []
    add = puts.append
    more = True
    for i in range(len(offsets)):
        offset = offsets[i]
        if offset >= end:
            more = False
            break
        start = starts[i]
        stop = start + lengths[i]
        if view[start] == OP_PUT and stop - start >= size:
            (_, priority, delay, ttr, ready_at, created_at, tube_len, key_len,
             dep_count) = unpack(view, start)
            if key_len == _NO_KEY and not dep_count:
                pos = start + size + tube_len
                raw = bytes(view[start + size:pos])
                tube = tubes.get(raw)
                if tube is None and raw.isascii():
                    tube = tubes[raw] = raw.decode("ascii")
                if tube is not None and pos <= stop:
                    add((offset + 1, tube, priority, delay, ttr, ready_at, created_at,
                         bytes(view[pos:stop])))
                    continue
        if puts:  # in order: the puts before this record first
            machine.apply_puts(puts)
            puts.clear()
        replay(machine, view[start:stop], offset)
    if puts:
        machine.apply_puts(puts)
    return more


def _decode_put(record: bytes | bytearray | memoryview) -> PutPlan:
    """The plan of a PUT record."""
    (op, priority, delay, ttr, ready_at, created_at, tube_len, key_len,
     dep_count) = _PUT.unpack_from(record)
    if op != OP_PUT:
        raise ValueError(f"a PUT record starts with operation {op}")
    pos = _PUT.size
    tube = str(record[pos:pos + tube_len], "ascii")
    pos += tube_len
    key = None
    if key_len != _NO_KEY:
        key = str(record[pos:pos + key_len], "utf-8")
        pos += key_len
    dep_ids: tuple[int, ...] = ()
    if dep_count:
        dep_ids = struct.unpack_from(f"<{dep_count}Q", record, pos)
        pos += 8 * dep_count
    if len(record) < pos or len(tube) != tube_len:
        raise ValueError("PUT record cut short")
    return (tube, priority, delay, ttr, ready_at, created_at, key, dep_ids,
            bytes(record[pos:]))


def _decode_text(record: bytes | bytearray | memoryview, pos: int) -> tuple[str, int]:
    """The text (u16 length, UTF-8) at ``pos`` of ``record``, and the position after it."""
    (n,) = _U16.unpack_from(record, pos)
    raw = record[pos + 2:pos + 2 + n]
    if len(raw) != n:
        raise ValueError("a text runs past the end of its record")
    return str(raw, "utf-8"), pos + 2 + n


def _replay_put_with(
    machine: JobMachine, record: bytes | bytearray | memoryview, offset: int,
) -> None:
    flags = record[1]
    if flags & ~(PUT_MARK | PUT_REMEMBER | PUT_GROUP):
        raise ValueError(f"unknown PUT_WITH flags {flags}")
    pos = 2
    mark = None
    if flags & PUT_MARK:
        name, pos = _decode_text(record, pos)
        (position,) = _COUNT.unpack_from(record, pos)
        mark = (name, position)
        pos += _COUNT.size
    group = None
    if flags & PUT_GROUP:
        group, pos = _decode_text(record, pos)
    plan = _decode_put(record[pos:])
    remember = bool(flags & PUT_REMEMBER)
    if remember and plan[6] is None:
        raise ValueError("PUT_WITH remembers the key of a put without one")
    machine.apply_put_with(offset + 1, plan, mark, remember, group)


def _replay(machine: JobMachine, record: bytes | bytearray | memoryview, offset: int) -> None:
    op = record[0]
    if op == OP_PUT:
        machine.apply_put(offset + 1, _decode_put(record))
    elif op == OP_PUT_WITH:
        _replay_put_with(machine, record, offset)
    elif op == OP_MARK:
        _, position = _ID.unpack_from(record)
        machine.apply_mark(str(record[_ID.size:], "utf-8"), position)
    elif op == OP_FORGET:
        tube_len = record[1]
        tube = str(record[2:2 + tube_len], "ascii")
        pos = 2 + tube_len
        if len(tube) != tube_len:
            raise ValueError("FORGET record cut short")
        keys = []
        while pos < len(record):
            key, pos = _decode_text(record, pos)
            keys.append(key)
        machine.apply_forget(tube, keys)
    elif op == OP_FORGET_GROUP:
        tube_len = record[1]
        tube = str(record[2:2 + tube_len], "ascii")
        if len(tube) != tube_len:
            raise ValueError("FORGET_GROUP record cut short")
        machine.apply_forget_group(tube, str(record[2 + tube_len:], "utf-8"))
    elif op in (OP_DELETE, OP_KICK, OP_READY):
        _, job_id = _ID.unpack(record)
        if op == OP_DELETE:
            machine.apply_delete(job_id)
        elif op == OP_KICK:
            machine.apply_kick(job_id)
        else:
            machine.apply_ready(job_id)
    elif op == OP_RELEASE:
        _, job_id, priority, delay, ready_at, has_error = _RELEASE.unpack_from(record)
        error = str(record[_RELEASE.size:], "utf-8") if has_error else None
        machine.apply_release(job_id, priority, delay, ready_at, error)
    elif op == OP_BURY:
        _, job_id, priority, has_error = _BURY.unpack_from(record)
        error = str(record[_BURY.size:], "utf-8") if has_error else None
        machine.apply_bury(job_id, priority, error)
    elif op == OP_PAD:
        pass
    else:
        raise ValueError(f"unknown operation {op}")


# --- snapshots -----------------------------------------------------------------------------


def dump_snapshot(machine: JobMachine, position: int = 0) -> Iterator[bytes]:
    """The snapshot of ``machine``, in chunks; ``position`` (the journal offset it covers)
    is stored in it. The machine is read when the first chunk is asked for: no mutation may
    run until then (the store takes the first chunk under its lock)."""
    tubes = {name: i for i, name in enumerate(machine.tubes())}
    rows: list[bytes] = []
    lengths = array("I")
    bodies: list[bytes] = []
    extras: list[bytes] = []
    pack = _ROW.pack
    codes = _STATE_CODES
    top = MAX_U32
    for job in machine.jobs():
        ready_at = 0.0 if job.state is JobState.RESERVED else job.ready_at
        counters = (job.reserves, job.timeouts, job.releases, job.buries, job.kicks)
        try:
            row = pack(job.id, tubes[job.tube], codes[job.state], job.priority, job.delay,
                       job.ttr, ready_at, job.created_at, *counters)
        except struct.error:  # a counter past 2**32-1 (beanstalkd's u32): saved as the max
            row = pack(job.id, tubes[job.tube], codes[job.state], job.priority, job.delay,
                       job.ttr, ready_at, job.created_at, *(min(c, top) for c in counters))
        rows.append(row)
        lengths.append(len(job.body))
        bodies.append(job.body)
        if job.key is not None or job.depends_on or job.errors:
            extras.append(_extra(job.id, job.key, job.depends_on, job.errors))
    head = [_HEADER.pack(MAGIC, VERSION, position, len(tubes))]
    for name in tubes:
        raw = name.encode("ascii")
        head.append(bytes([len(raw)]) + raw)
    head.append(_COUNT.pack(len(rows)))
    if sys.byteorder == "big":
        lengths.byteswap()
    marks = machine.marks()
    tail = [_COUNT.pack(len(marks))]
    for name, at in marks.items():
        tail += (_text(name), _COUNT.pack(at))
    kept = machine.remembered_keys()
    tail.append(_COUNT.pack(len(kept)))
    for tube, keys in kept.items():
        tail += (bytes([len(tube)]), tube.encode("ascii"), _COUNT.pack(len(keys)))
        tail += [_text(key) + _COUNT.pack(job_id) for key, job_id in keys.items()]
    groups = machine.group_records()
    tail.append(_COUNT.pack(len(groups)))
    for tube, name, done, ids in groups:
        tail += (bytes([len(tube)]), tube.encode("ascii"), _text(name),
                 _COUNT.pack(done), _COUNT.pack(len(ids)), struct.pack(f"<{len(ids)}Q", *ids))
    crc = 0
    for part in (head, rows, [lengths.tobytes()], bodies, [_COUNT.pack(len(extras)), *extras],
                 tail):
        for i in range(0, len(part), _CHUNK_ITEMS):
            chunk = b"".join(part[i:i + _CHUNK_ITEMS])
            crc = crc32c(chunk, crc)
            yield chunk
    yield _CRC.pack(crc)


def _extra(job_id: int, key: str | None, deps: tuple[int, ...], errors: tuple[str, ...]) -> bytes:
    raw_key = b"" if key is None else key.encode()
    parts = [_EXTRA.pack(job_id, _NO_KEY if key is None else len(raw_key), len(deps),
                         len(errors)), raw_key, struct.pack(f"<{len(deps)}Q", *deps)]
    parts += map(_text, errors)
    return b"".join(parts)


def _text(text: str) -> bytes:
    """``text`` as u16 length and UTF-8 (:func:`_decode_text` reads it)."""
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _joined(data: bytes | bytearray | memoryview | Iterable[bytes]) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    return b"".join(data)


def _corrupt(why: str, offset: int | None = None) -> CorruptJobDataError:
    return CorruptJobDataError(f"job snapshot {why}", offset=offset,
                               hint="the snapshot is damaged or from a newer version: "
                                    "use an older snapshot and the journal")


def _check_header(data: bytes) -> tuple[int, int]:
    """The version of the snapshot and the position it covers, after checking its magic
    and version."""
    if len(data) < _HEADER.size + _CRC.size or data[:8] != MAGIC:
        raise _corrupt("does not start with the job snapshot magic", 0)
    _, version, position, _ = _HEADER.unpack_from(data)
    if version not in VERSIONS:
        raise _corrupt(f"has version {version}, this k7core reads versions "
                       f"{', '.join(map(str, VERSIONS))}", 8)
    return int(version), int(position)


def snapshot_position(data: bytes | bytearray | memoryview) -> int:
    """The journal position stored in a snapshot (its header only: call it after
    :func:`load_snapshot` accepted the snapshot)."""
    return _check_header(bytes(data[:_HEADER.size + _CRC.size]))[1]


def load_snapshot(data: bytes | bytearray | memoryview | Iterable[bytes]) -> JobMachine:
    """A new machine holding the jobs of a snapshot (bytes, or the chunks
    :func:`dump_snapshot` yielded). CorruptJobDataError if its CRC32C, magic, version or
    structure is wrong. The garbage collector is off meanwhile (a million records would
    trigger a dozen full collections)."""
    raw = _joined(data)
    version, _ = _check_header(raw)
    end = len(raw) - _CRC.size
    (stored,) = _CRC.unpack_from(raw, end)
    if crc32c(memoryview(raw)[:end]) != stored:
        raise _corrupt("fails its CRC32C check", end)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(raw, end, version)
    except (struct.error, IndexError, ValueError, KeyError) as exc:
        raise _corrupt(f"cannot be decoded ({exc})") from exc
    finally:
        if collecting:
            gc.enable()


def _load(raw: bytes, end: int, version: int) -> JobMachine:
    _, _, _, tube_count = _HEADER.unpack_from(raw)
    pos = _HEADER.size
    names = []
    for _ in range(tube_count):
        n = raw[pos]
        names.append(raw[pos + 1:pos + 1 + n].decode("ascii"))
        pos += 1 + n
    (count,) = _COUNT.unpack_from(raw, pos)
    pos += _COUNT.size
    machine = JobMachine()
    at = pos + count * _ROW.size
    rows = _ROW.iter_unpack(memoryview(raw)[pos:at])
    lengths = array("I", raw[at:at + 4 * count])
    if sys.byteorder == "big":
        lengths.byteswap()
    ends = list(accumulate(lengths, initial=at + 4 * count))
    if len(lengths) != count or ends[-1] > end:
        raise ValueError("the bodies run past the end")
    machine.load_jobs(rows, names, [raw[a:b] for a, b in pairwise(ends)])
    if len(machine) != count:  # two rows held one id: the later one replaced the earlier
        ids = [row[0] for row in _ROW.iter_unpack(memoryview(raw)[pos:at])]
        twice = next(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"its rows hold two jobs with id {twice}")
    pos = ends[-1]
    (count,) = _COUNT.unpack_from(raw, pos)
    pos += _COUNT.size
    for _ in range(count):
        job_id, key_len, dep_count, error_count = _EXTRA.unpack_from(raw, pos)
        pos += _EXTRA.size
        key = None
        if key_len != _NO_KEY:
            key = raw[pos:pos + key_len].decode()
            pos += key_len
        deps: tuple[int, ...] = struct.unpack_from(f"<{dep_count}Q", raw, pos)
        pos += 8 * dep_count
        texts = []
        for _ in range(error_count):
            text, pos = _decode_text(raw, pos)
            texts.append(text)
        machine.load_extra(job_id, key, deps, tuple(texts))
    if version >= 2:
        pos = _load_marks_and_kept(machine, raw, pos)
    if version >= 3:
        pos = _load_groups(machine, raw, pos)
    if pos != end:
        raise ValueError(f"{end - pos} bytes left after the last job")
    machine.finish_load()
    return machine


def _load_marks_and_kept(machine: JobMachine, raw: bytes, pos: int) -> int:
    """Load the ``marks`` and ``kept`` parts at ``pos``; the position after them."""
    (count,) = _COUNT.unpack_from(raw, pos)
    pos += _COUNT.size
    for _ in range(count):
        name, pos = _decode_text(raw, pos)
        (at,) = _COUNT.unpack_from(raw, pos)
        pos += _COUNT.size
        machine.apply_mark(name, at)
    (count,) = _COUNT.unpack_from(raw, pos)
    pos += _COUNT.size
    for _ in range(count):
        n = raw[pos]
        tube = raw[pos + 1:pos + 1 + n].decode("ascii")
        (keys,) = _COUNT.unpack_from(raw, pos + 1 + n)
        pos += 1 + n + _COUNT.size
        for _ in range(keys):
            key, pos = _decode_text(raw, pos)
            (job_id,) = _COUNT.unpack_from(raw, pos)
            pos += _COUNT.size
            machine.apply_remember(tube, key, job_id)
    return pos


def _load_groups(machine: JobMachine, raw: bytes, pos: int) -> int:
    """Load the ``groups`` part at ``pos`` (after the jobs); the position after it."""
    (count,) = _COUNT.unpack_from(raw, pos)
    pos += _COUNT.size
    for _ in range(count):
        n = raw[pos]
        tube = raw[pos + 1:pos + 1 + n].decode("ascii")
        name, pos = _decode_text(raw, pos + 1 + n)
        done, live = struct.unpack_from("<QQ", raw, pos)
        pos += 16
        ids = struct.unpack_from(f"<{live}Q", raw, pos)
        pos += 8 * live
        machine.load_group(tube, name, done, ids)
    return pos
