"""The journal records and the snapshot: round trips, the documented layout, damage."""

from __future__ import annotations

import struct

import pytest

from k7core import crc32c
from k7core.jobs import CorruptJobDataError, JobState
from k7core.jobs._codec import (
    MAGIC,
    dump_snapshot,
    encode_bury,
    encode_delete,
    encode_forget,
    encode_forget_group,
    encode_kick,
    encode_mark,
    encode_put,
    encode_put_with,
    encode_ready,
    encode_release,
    load_snapshot,
    replay,
    snapshot_position,
)
from k7core.jobs._machine import JobMachine

NOW = 5000.0


def journaled_machine() -> tuple[JobMachine, list[tuple[int, bytes]]]:
    """A machine with a job in every state, built through the journal records."""
    m = JobMachine()
    journal: list[tuple[int, bytes]] = []

    def put(tube: str, key: str | None = None, delay: float = 0,
            deps: tuple[int | tuple[str, str], ...] = (), body: bytes = b"body") -> int:
        plan = m.check_put(tube, body, 7, delay, 30, key, deps, NOW)
        assert not isinstance(plan, int)
        offset = 100 * len(journal)
        journal.append((offset, encode_put(*plan)))
        m.apply_put(offset + 1, plan)
        return offset + 1

    def log(record: bytes) -> None:
        journal.append((100 * len(journal), record))

    a = put("a", key="ké", body=b"\x00" * 70_000)
    put("a")
    b = put("b", delay=20)
    put("a", deps=(a,))
    put("b", deps=(b, ("a", "ké")), delay=3)
    for error in ("first", None):
        job = m.reserve("w", ["a"], NOW)
        assert job is not None
        plan = m.check_bury(job.id, "w", 99, error)
        log(encode_bury(*plan))
        m.apply_bury(*plan)
    c = put("c")
    m.reserve("w", ["c"], NOW)
    release = m.check_release(c, "w", 3, 4.5, "é" * 10, NOW)
    log(encode_release(*release))
    m.apply_release(*release)
    log(encode_kick(c))
    m.apply_kick(c)
    d = put("c")
    log(encode_delete(d))
    m.apply_delete(d)
    m.reserve("x", ["c"], NOW)  # reserved: ready after a restart
    return m, journal


def states(m: JobMachine) -> dict[int, tuple[object, ...]]:
    return {j.id: (j.tube, j.state, j.priority, j.body, j.ttr, j.delay, j.ready_at,
                   j.created_at, j.key, j.depends_on, j.errors, j.releases, j.buries, j.kicks)
            for j in m.jobs()}


def restarted(m: JobMachine) -> dict[int, tuple[object, ...]]:
    """What reopening gives: reserved jobs ready."""
    out = {}
    for job_id, row in states(m).items():
        if row[1] is JobState.RESERVED:
            row = (row[0], JobState.READY, *row[2:6], 0.0, *row[7:])
        out[job_id] = row
    return out


def test_replaying_the_journal_rebuilds_the_state() -> None:
    m, journal = journaled_machine()
    again = JobMachine()
    for offset, record in journal:
        replay(again, record, offset)
    assert states(again) == restarted(m)
    assert [j.id for j in again.errors("a")] == [j.id for j in m.errors("a")]


def test_replay_accepts_memoryviews() -> None:
    m, journal = journaled_machine()
    again = JobMachine()
    for offset, record in journal:
        replay(again, memoryview(record), offset)
    assert states(again) == restarted(m)


def test_record_layouts() -> None:
    plan = ("tb", 5, 1.5, 60.0, 2.0, 3.0, "k", (9, 10), b"BODY")
    record = encode_put(*plan)
    assert record[0] == 1 and len(record) == 44 + 2 + 1 + 16 + 4
    assert struct.unpack_from("<BIddddBHI", record) == (1, 5, 1.5, 60.0, 2.0, 3.0, 2, 1, 2)
    assert record.endswith(b"tbk" + struct.pack("<2Q", 9, 10) + b"BODY")
    bare = encode_put("t", 0, 0, 1, 0, 0, None, (), b"")
    assert struct.unpack_from("<BIddddBHI", bare)[-2:] == (0xFFFF, 0) and bare[44:] == b"t"
    assert encode_delete(258) == b"\x02" + (258).to_bytes(8, "little")
    assert encode_kick(1)[0] == 5 and encode_ready(1)[0] == 6
    assert encode_release(1, 2, 3.0, 4.0, None) == struct.pack("<BQIddB", 3, 1, 2, 3.0, 4.0, 0)
    assert encode_release(1, 2, 0, 0, "é").endswith(b"\x01" + "é".encode())
    assert encode_bury(1, 2, "x") == struct.pack("<BQIB", 4, 1, 2, 1) + b"x"


def relay_journal() -> tuple[JobMachine, list[tuple[int, bytes]]]:
    """A machine with marks and remembered keys (live, done, forgotten), built through the
    journal records."""
    m = JobMachine()
    journal: list[tuple[int, bytes]] = []

    def put(tube: str, key: str | None, mark: tuple[str, int] | None, remember: bool) -> int:
        offset = 100 * len(journal)
        plan = m.check_put(tube, b"b", 7, 0, 30, key, (), NOW)
        checked = m.check_extras(key, mark, remember)
        if isinstance(plan, int):
            assert checked is not None
            journal.append((offset, encode_mark(*checked)))
            m.apply_mark(*checked)
            return plan
        journal.append((offset, encode_put_with(plan, checked, remember)))
        m.apply_put_with(offset + 1, plan, checked, remember)
        return offset + 1

    def delete(job_id: int) -> None:
        journal.append((100 * len(journal), encode_delete(job_id)))
        m.apply_delete(job_id)

    put("t", "live", ("relay", 1), True)
    delete(put("t", "done", ("relay", 2), True))
    delete(put("t", "dropped", None, True))
    delete(put("u", "ké", ("other", 2**64 - 1), True))
    assert put("t", "done", ("relay", 3), False) == 101  # a MARK record
    put("t", None, ("relay", 4), False)
    forget = m.check_forget("t", ["dropped", "nothing"])
    journal.append((100 * len(journal), encode_forget("t", forget)))
    m.apply_forget("t", forget)
    return m, journal


def relay_state(m: JobMachine) -> tuple[object, ...]:
    return (states(m), m.marks(), {t: dict(k) for t, k in m.remembered_keys().items()})


def test_marks_and_remembered_keys_replay_and_load() -> None:
    m, journal = relay_journal()
    assert m.marks() == {"relay": 4, "other": 2**64 - 1}
    assert m.remembered_keys() == {"t": {"live": 1, "done": 101}, "u": {"ké": 501}}
    again = JobMachine()
    for offset, record in journal:
        replay(again, record, offset)
    assert relay_state(again) == relay_state(m)
    assert relay_state(load_snapshot(dump_snapshot(again))) == relay_state(m)
    assert again.check_put("t", b"", 1, 0, 1, "done", (), NOW) == 101


def test_relay_record_layouts() -> None:
    plan = ("tb", 5, 1.5, 60.0, 2.0, 3.0, "k", (), b"BODY")
    put = encode_put(*plan)
    assert encode_put_with(plan, None, True) == b"\x07\x02" + put
    assert encode_put_with(plan, ("ré", 9), False) == (
        b"\x07\x01" + struct.pack("<H", 3) + "ré".encode() + struct.pack("<Q", 9) + put)
    assert encode_put_with(plan, ("r", 9), True)[:2] == b"\x07\x03"
    assert encode_mark("ré", 2**64 - 1) == b"\x08" + struct.pack("<Q", 2**64 - 1) + "ré".encode()
    assert encode_forget("tb", ["a", "bé"]) == (
        b"\x09\x02tb" + struct.pack("<H", 1) + b"a" + struct.pack("<H", 3) + "bé".encode())


def test_groups_replay_and_load() -> None:
    """A group's live jobs and done count survive the journal and a snapshot; a forget
    drops both."""
    m = JobMachine()
    journal: list[tuple[int, bytes]] = []

    def put(tube: str, group: str | None) -> int:
        plan = m.check_put(tube, b"x", 1, 0, 1, None, (), NOW)
        assert not isinstance(plan, int)
        offset = 100 * len(journal)
        journal.append((offset, encode_put_with(plan, None, False, group)))
        m.apply_put_with(offset + 1, plan, None, False, group)
        return offset + 1

    def delete(job_id: int) -> None:
        journal.append((100 * len(journal), encode_delete(job_id)))
        m.apply_delete(job_id)

    ids = [put("t", "mail/42") for _ in range(4)]
    other = put("t", "é")
    put("u", "mail/42")  # same name, another tube: another group
    put("t", None)
    delete(ids[0])
    delete(ids[1])
    delete(other)
    m.reserve("w", ["t"], NOW)  # ids[2]: reserved (ready after a restart)
    assert m.group_progress("t", "mail/42") == {
        "ready": 1, "delayed": 0, "reserved": 1, "buried": 0, "waiting": 0, "done": 2}
    assert m.groups("t") == ["mail/42", "é"] and m.groups("u") == ["mail/42"]
    journal.append((100 * len(journal), encode_forget_group("t", "é")))
    m.apply_forget_group("t", "é")

    def progress(x: JobMachine) -> list[dict[str, int]]:
        return [x.group_progress(t, g) for t, g in
                [("t", "mail/42"), ("u", "mail/42"), ("t", "é"), ("t", "none")]]

    expected = progress(m)
    expected[0] = expected[0] | {"ready": 2, "reserved": 0}
    assert expected[2] == expected[3] == dict.fromkeys(expected[3], 0)
    again = JobMachine()
    for offset, record in journal:
        replay(again, record, offset)
    assert progress(again) == expected
    assert progress(load_snapshot(dump_snapshot(again))) == expected
    assert encode_put_with(("t", 1, 0.0, 1.0, 0.0, 0.0, None, (), b""), None, False, "g")[
        :5] == b"\x07\x04" + struct.pack("<H", 1) + b"g"
    assert encode_forget_group("tb", "gé") == b"\x0a\x02tb" + "gé".encode()


@pytest.mark.parametrize("record", [
    b"", b"\x0a", b"\x09", b"\x02\x00", b"\x02" + bytes(9), b"\x03" + bytes(5), b"\x04" + bytes(3),
    encode_put("tube", 1, 0, 1, 0, 0, "key", (), b"")[:48],
    encode_put("tube", 1, 0, 1, 0, 0, None, (1, 2), b"")[:-3],
    encode_bury(1, 1, None)[:-1] + b"\x01\xff",
    b"\x07\x08" + encode_put("t", 1, 0, 1, 0, 0, "k", (), b""),  # an unknown flag
    b"\x07\x04" + struct.pack("<H", 9) + b"g",  # a group cut short
    b"\x0a\x05tub",  # FORGET_GROUP cut short
    b"\x07\x02" + encode_put("t", 1, 0, 1, 0, 0, None, (), b""),  # remember, no key
    b"\x07\x01" + struct.pack("<H", 5) + b"ab",  # a mark cut short
    b"\x07\x00" + encode_delete(1),  # not a PUT inside
    b"\x08" + bytes(4),
    b"\x09\x05tub", encode_forget("t", ["key"])[:-1],
])
def test_damaged_records_are_reported(record: bytes) -> None:
    with pytest.raises(CorruptJobDataError) as info:
        replay(JobMachine(), record, 4242)
    assert info.value.offset == 4242 and "4242" in str(info.value)


def test_snapshot_round_trip() -> None:
    m, _ = journaled_machine()
    chunks = list(dump_snapshot(m, 777))
    data = b"".join(chunks)
    assert data.startswith(MAGIC) and snapshot_position(data) == 777
    for source in (data, chunks, iter(chunks), bytearray(data), memoryview(data)):
        loaded = load_snapshot(source)
        assert states(loaded) == restarted(m)
        assert [j.id for j in loaded.errors("a")] == [j.id for j in m.errors("a")]
        reserved = [j for j in m.jobs() if j.state is JobState.RESERVED]
        assert reserved and all(
            loaded.peek(j.id).reserves == j.reserves == 2  # type: ignore[union-attr]
            for j in reserved)
        assert sorted(loaded.tubes()) == sorted(m.tubes())


def test_an_empty_snapshot() -> None:
    loaded = load_snapshot(dump_snapshot(JobMachine()))
    assert len(loaded) == 0 and loaded.tubes() == []


def test_a_loaded_machine_goes_on() -> None:
    m, _ = journaled_machine()
    loaded = load_snapshot(dump_snapshot(m))
    first, second = [j for j in loaded.jobs() if j.state is JobState.WAITING]
    buried = loaded.errors("a")[0].id
    assert first.depends_on == (buried,) and buried in second.depends_on
    loaded.check_delete(buried)
    assert loaded.apply_delete(buried) == 1
    job = loaded.reserve("w", ["a"], NOW)
    assert job is not None and job.id == first.id
    assert loaded.peek(second.id).state is JobState.WAITING  # type: ignore[union-attr]


@pytest.mark.parametrize("where", [0, 9, 30, -5, -1])
def test_damaged_snapshots_are_reported(where: int) -> None:
    m, _ = journaled_machine()
    data = bytearray(b"".join(dump_snapshot(m)))
    data[where] ^= 0x40
    with pytest.raises(CorruptJobDataError):
        load_snapshot(bytes(data))


def test_truncated_or_foreign_snapshots_are_reported() -> None:
    m, _ = journaled_machine()
    data = b"".join(dump_snapshot(m))
    for bad in (data[:-1], data[:10], b"", b"hello" * 10, data[:8] + b"\x09" + data[9:]):
        with pytest.raises(CorruptJobDataError):
            load_snapshot(bad)


def test_counters_past_u32_are_saved_as_the_max() -> None:
    m = JobMachine()
    plan = m.check_put("t", b"", 1, 0, 1, None, (), NOW)
    assert not isinstance(plan, int)
    m.apply_put(1, plan)
    m._jobs[1].kicks = 2**40
    loaded = load_snapshot(dump_snapshot(m))
    assert loaded.peek(1).kicks == 2**32 - 1  # type: ignore[union-attr]


def _resealed(data: bytes | bytearray) -> bytes:
    """``data`` with its CRC32C trailer computed again (a snapshot crafted to pass it)."""
    body = bytes(data[:-4])
    return body + struct.pack("<I", crc32c(body))


def test_two_rows_with_one_id_are_a_corrupt_snapshot() -> None:
    """A snapshot whose rows hold two jobs with one id is refused, not loaded with one of
    them missing (its CRC32C checks out: written that way)."""
    m = JobMachine()
    for job_id in (1, 2, 3):
        plan = m.check_put("t", b"body %d" % job_id, 1, 0, 1, None, (), NOW)
        assert not isinstance(plan, int)
        m.apply_put(job_id, plan)
    data = bytearray(b"".join(dump_snapshot(m, 500)))
    rows = 24 + 2 + 8  # the header, tube "t", the job count: the rows, in id order
    assert struct.unpack_from("<QQ", data, rows - 8) == (3, 1)
    struct.pack_into("<Q", data, rows + 69, 1)  # the second row says it is job 1 too
    with pytest.raises(CorruptJobDataError, match="two jobs with id 1"):
        load_snapshot(_resealed(data))
    assert len(load_snapshot(_resealed(b"".join(dump_snapshot(m, 500))))) == 3
