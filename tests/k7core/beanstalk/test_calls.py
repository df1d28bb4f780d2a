"""The clients' sans-I/O core: each command's request (as the server's own parser reads it),
each reply's meaning, each failure reply's error, the argument checks, the addresses, and the
connection state both clients share. (The clients against real servers:
tests/k7core/beanstalk/test_client.py and tests/k7async/test_async_beanstalk.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import k7core
from k7core import jobs
from k7core.beanstalk import (
    Address,
    BeanstalkConnectionError,
    BeanstalkError,
    BeanstalkTimeoutError,
    Call,
    ClientState,
    DeadlineSoonError,
    DrainingError,
    InvalidAddressError,
    JobBuriedError,
    JobNotFoundError,
    JobTooBigError,
    NotIgnoredError,
    Op,
    PeekedJob,
    ProtocolError,
    RejectedCommandError,
    Reply,
    ReplyParser,
    Request,
    RequestParser,
    ReservedJob,
    ServerError,
    TubeNotFoundError,
    calls,
    parse_address,
)
from k7core.beanstalk import protocol as wire

# A real beanstalkd 1.12's documents (Debian's, this machine), cut to a few lines of each kind.
SERVER_STATS = (b"---\ncurrent-jobs-urgent: 0\ncmd-put: 12\npid: 11460\nversion: \"1.12\"\n"
                b"rusage-utime: 0.000000\nrusage-stime: 0.002351\nbinlog-max-size: 10485760\n"
                b"draining: false\nid: 7945801331863642\nhostname: vm\n"
                b"os: #1 SMP PREEMPT_DYNAMIC @0\nplatform: x86_64\n")
JOB_STATS = (b"---\nid: 1\ntube: 2024\nstate: reserved\npri: 1\nage: 0\ndelay: 100\nttr: 60\n"
             b"time-left: 59\nfile: 0\nreserves: 1\n")
TUBE_STATS = b"---\nname: 007\ncurrent-jobs-ready: 3\npause: 0\npause-time-left: 0\n"


def reply(data: bytes) -> Reply:
    """The one reply in ``data``."""
    parser = ReplyParser()
    parser.feed(data)
    got = parser.next()
    assert got is not None and parser.next() is None
    return got


def request(data: bytes) -> Request:
    """The one request in ``data``, as the server reads it."""
    parser = RequestParser()
    parser.feed(data)
    got = parser.next()
    assert got is not None and parser.next() is None and parser.buffered == 0
    return got


# --- requests ----------------------------------------------------------------------------

REQUESTS: list[tuple[Call[object] | bytes, bytes, Request]] = [
    (calls.put(b"a\r\nb", priority=7, delay=3, ttr=0), b"put 7 3 0 4\r\na\r\nb\r\n",
     Request(Op.PUT, priority=7, delay=3, ttr=1, body=b"a\r\nb")),
    (calls.put(b""), b"put 1024 0 60 0\r\n\r\n", Request(Op.PUT, priority=1024, ttr=60)),
    (calls.use("a-b"), b"use a-b\r\n", Request(Op.USE, name="a-b")),
    (calls.reserve(), b"reserve\r\n", Request(Op.RESERVE)),
    (calls.reserve_with_timeout(0), b"reserve-with-timeout 0\r\n",
     Request(Op.RESERVE_WITH_TIMEOUT, timeout=0)),
    (calls.reserve_with_timeout(calls.MAX_TIMEOUT), b"reserve-with-timeout 2147483647\r\n",
     Request(Op.RESERVE_WITH_TIMEOUT, timeout=calls.MAX_TIMEOUT)),
    (calls.reserve_job(9), b"reserve-job 9\r\n", Request(Op.RESERVE_JOB, job_id=9)),
    (calls.delete(calls.MAX_JOB_ID), b"delete 18446744073709551615\r\n",
     Request(Op.DELETE, job_id=calls.MAX_JOB_ID)),
    (calls.release(5, priority=calls.MAX_U32, delay=2), b"release 5 4294967295 2\r\n",
     Request(Op.RELEASE, job_id=5, priority=calls.MAX_U32, delay=2)),
    (calls.release(5), b"release 5 1024 0\r\n", Request(Op.RELEASE, job_id=5, priority=1024)),
    (calls.bury(5, priority=0), b"bury 5 0\r\n", Request(Op.BURY, job_id=5)),
    (calls.touch(5), b"touch 5\r\n", Request(Op.TOUCH, job_id=5)),
    (calls.watch("x" * 200), b"watch " + b"x" * 200 + b"\r\n", Request(Op.WATCH, name="x" * 200)),
    (calls.ignore("(x)$;+/._"), b"ignore (x)$;+/._\r\n", Request(Op.IGNORE, name="(x)$;+/._")),
    (calls.peek(0), b"peek 0\r\n", Request(Op.PEEK, job_id=0)),
    (calls.peek_ready(), b"peek-ready\r\n", Request(Op.PEEK_READY)),
    (calls.peek_delayed(), b"peek-delayed\r\n", Request(Op.PEEK_DELAYED)),
    (calls.peek_buried(), b"peek-buried\r\n", Request(Op.PEEK_BURIED)),
    (calls.kick(calls.MAX_U32), b"kick 4294967295\r\n", Request(Op.KICK, bound=calls.MAX_U32)),
    (calls.kick_job(3), b"kick-job 3\r\n", Request(Op.KICK_JOB, job_id=3)),
    (calls.stats_job(3), b"stats-job 3\r\n", Request(Op.STATS_JOB, job_id=3)),
    (calls.stats_tube("t"), b"stats-tube t\r\n", Request(Op.STATS_TUBE, name="t")),
    (calls.stats(), b"stats\r\n", Request(Op.STATS)),
    (calls.list_tubes(), b"list-tubes\r\n", Request(Op.LIST_TUBES)),
    (calls.list_tube_used(), b"list-tube-used\r\n", Request(Op.LIST_TUBE_USED)),
    (calls.list_tubes_watched(), b"list-tubes-watched\r\n", Request(Op.LIST_TUBES_WATCHED)),
    (calls.pause_tube("t", 30), b"pause-tube t 30\r\n", Request(Op.PAUSE_TUBE, name="t", delay=30)),
    (calls.quit(), b"quit\r\n", Request(Op.QUIT)),
]


@pytest.mark.parametrize(("call", "data", "parsed"), REQUESTS,
                         ids=[r[1].split(b" ")[0].strip().decode() for r in REQUESTS])
def test_each_request_is_what_the_server_reads(call: Call[object] | bytes, data: bytes,
                                              parsed: Request) -> None:
    sent = call if isinstance(call, bytes) else call.request
    assert sent == data
    assert request(sent) == parsed


def test_every_command_has_a_call() -> None:
    """Every command of the protocol but put and quit (checked above) is sent by a call of
    the same name."""
    made = {request(c.request).op for c, _, _ in REQUESTS if isinstance(c, Call)}
    assert made | {Op.QUIT, Op.UNKNOWN} == set(Op)
    for op in Op:
        if op is not Op.UNKNOWN:
            assert callable(getattr(calls, op.name.lower()))


def test_what_waits() -> None:
    """How long the server may hold a reply on purpose, and the limit a client puts on it."""
    assert calls.reserve().wait is None and calls.reserve().reply_limit(5.0) is None
    assert calls.reserve_with_timeout(7).wait == 7
    assert calls.reserve_with_timeout(7).reply_limit(0.5) == 7.5
    assert calls.reserve_with_timeout(7).reply_limit(None) is None
    assert calls.put(b"x").reply_limit(2.0) == 2.0
    assert calls.put(b"x" * 100).command == "put 1024 0 60 100"


# --- replies -----------------------------------------------------------------------------


SUCCESSES: list[tuple[Call[object], bytes, object]] = [
    (calls.put(b"x"), wire.inserted(42), 42),
    (calls.use("emails"), wire.using("emails"), "emails"),
    (calls.reserve(), wire.reserved(5, b"a\r\nb"), ReservedJob(5, b"a\r\nb")),
    (calls.reserve(), wire.TIMED_OUT, None),
    (calls.reserve_with_timeout(0), wire.reserved(5, b""), ReservedJob(5, b"")),
    (calls.reserve_with_timeout(0), wire.TIMED_OUT, None),
    (calls.reserve_job(5), wire.reserved(5, b"x"), ReservedJob(5, b"x")),
    (calls.delete(5), wire.DELETED, None),
    (calls.release(5), wire.RELEASED, None),
    (calls.bury(5), wire.BURIED, None),
    (calls.touch(5), wire.TOUCHED, None),
    (calls.watch("t"), wire.watching(2), 2),
    (calls.ignore("t"), wire.watching(1), 1),
    (calls.peek(5), wire.found(5, b"x"), PeekedJob(5, b"x")),
    (calls.peek(5), wire.NOT_FOUND, None),
    (calls.peek_ready(), wire.found(6, b"y"), PeekedJob(6, b"y")),
    (calls.peek_delayed(), wire.NOT_FOUND, None),
    (calls.peek_buried(), wire.found(7, b""), PeekedJob(7, b"")),
    (calls.kick(10), wire.kicked(3), 3),
    (calls.kick_job(5), wire.KICKED, None),
    (calls.stats_job(1), wire.ok(JOB_STATS),
     {"id": 1, "tube": "2024", "state": "reserved", "pri": 1, "age": 0, "delay": 100,
      "ttr": 60, "time-left": 59, "file": 0, "reserves": 1}),
    (calls.stats_tube("007"), wire.ok(TUBE_STATS),
     {"name": "007", "current-jobs-ready": 3, "pause": 0, "pause-time-left": 0}),
    (calls.stats(), wire.ok(SERVER_STATS),
     {"current-jobs-urgent": 0, "cmd-put": 12, "pid": 11460, "version": "1.12",
      "rusage-utime": 0.0, "rusage-stime": 0.002351, "binlog-max-size": 10485760,
      "draining": "false", "id": "7945801331863642", "hostname": "vm",
      "os": "#1 SMP PREEMPT_DYNAMIC @0", "platform": "x86_64"}),
    (calls.stats_tube("t"), wire.ok(b'---\nname: "t"\npause: 5\n'),  # beanstalkd 1.13 quotes
     {"name": "t", "pause": 5}),
    (calls.list_tubes(), wire.ok(wire.yaml_list(["default", "1", "a-b"])),
     ["default", "1", "a-b"]),
    (calls.list_tubes(), wire.ok(b"---\n"), []),
    (calls.list_tube_used(), wire.using("t"), "t"),
    (calls.list_tubes_watched(), wire.ok(wire.yaml_list(["default"])), ["default"]),
    (calls.pause_tube("t", 0), wire.PAUSED, None),
]


@pytest.mark.parametrize(("call", "data", "value"), SUCCESSES,
                         ids=[f"{c.command}->{d[:12]!r}" for c, d, _ in SUCCESSES])
def test_each_success_reply(call: Call[object], data: bytes, value: object) -> None:
    got = call.result(reply(data))
    assert got == value and type(got) is type(value)


def test_stats_keep_names_as_text_and_numbers_as_numbers() -> None:
    stats = calls.stats().result(reply(wire.ok(SERVER_STATS)))
    assert [type(stats[k]) for k in ("cmd-put", "rusage-stime", "id", "draining")] == [
        int, float, str, str]


ERRORS: list[tuple[Call[object], bytes, type[BeanstalkError], int | None]] = [
    (calls.delete(5), wire.NOT_FOUND, JobNotFoundError, 5),
    (calls.release(6), wire.NOT_FOUND, JobNotFoundError, 6),
    (calls.bury(7), wire.NOT_FOUND, JobNotFoundError, 7),
    (calls.touch(8), wire.NOT_FOUND, JobNotFoundError, 8),
    (calls.kick_job(9), wire.NOT_FOUND, JobNotFoundError, 9),
    (calls.stats_job(10), wire.NOT_FOUND, JobNotFoundError, 10),
    (calls.reserve_job(11), wire.NOT_FOUND, JobNotFoundError, 11),
    (calls.stats_tube("t"), wire.NOT_FOUND, TubeNotFoundError, None),
    (calls.pause_tube("t", 1), wire.NOT_FOUND, TubeNotFoundError, None),
    (calls.put(b"x"), b"BURIED 12\r\n", JobBuriedError, 12),
    (calls.release(13), wire.BURIED, JobBuriedError, 13),
    (calls.put(b"x"), wire.EXPECTED_CRLF, RejectedCommandError, None),
    (calls.put(b"x"), wire.JOB_TOO_BIG, JobTooBigError, None),
    (calls.put(b"x"), wire.DRAINING, DrainingError, None),
    (calls.reserve(), wire.DEADLINE_SOON, DeadlineSoonError, None),
    (calls.reserve_with_timeout(1), wire.DEADLINE_SOON, DeadlineSoonError, None),
    (calls.ignore("t"), wire.NOT_IGNORED, NotIgnoredError, None),
    (calls.stats(), wire.OUT_OF_MEMORY, ServerError, None),
    (calls.put(b"x"), wire.INTERNAL_ERROR, ServerError, None),
    (calls.use("t"), wire.BAD_FORMAT, RejectedCommandError, None),
    (calls.list_tubes(), wire.UNKNOWN_COMMAND, RejectedCommandError, None),
]


@pytest.mark.parametrize(("call", "data", "kind", "job_id"), ERRORS,
                         ids=[f"{c.command}->{d.split()[0].decode()}" for c, d, _, _ in ERRORS])
def test_each_failure_reply(call: Call[object], data: bytes, kind: type[BeanstalkError],
                            job_id: int | None) -> None:
    with pytest.raises(BeanstalkError) as info:
        call.result(reply(data))
    error = info.value
    assert type(error) is kind and isinstance(error, k7core.K7Error)
    assert (error.reply, error.command) == (data.split()[0].decode(), call.command)
    assert str(error).startswith(f"{call.command}: {error.reply}: ") and error.hint
    if job_id is not None:
        assert getattr(error, "job_id") == job_id  # noqa: B009 (two classes have it)


def test_job_not_found_is_the_job_stores_too() -> None:
    """One ``except k7core.jobs.JobNotFoundError`` serves jobs from a store or a server."""
    with pytest.raises(jobs.JobNotFoundError) as info:
        calls.delete(5).result(reply(wire.NOT_FOUND))
    assert info.value.job_id == 5


@pytest.mark.parametrize(("call", "data"), [
    (calls.put(b"x"), wire.DELETED),            # another command's success
    (calls.delete(1), b"INSERTED 1\r\n"),
    (calls.put(b"x"), b"HELLO\r\n"),             # no beanstalkd reply
    (calls.put(b"x"), b"INSERTED\r\n"),          # malformed successes
    (calls.put(b"x"), b"INSERTED x\r\n"),
    (calls.put(b"x"), b"INSERTED 1 2\r\n"),
    (calls.put(b"x"), b"BURIED x\r\n"),
    (calls.delete(1), b"DELETED 1\r\n"),
    (calls.reserve(), b"RESERVED 1 1 2\r\nx\r\n"),
    (calls.use("t"), wire.NOT_FOUND),          # NOT_FOUND to what names no job or tube
    (calls.delete(1), wire.BURIED),             # BURIED to what neither puts nor releases
    (calls.stats(), wire.ok(b"key value\n")),  # not a document
    (calls.stats(), wire.ok(b"- a\n")),
    (calls.list_tubes(), wire.ok(b"---\nkey: value\n")),
])
def test_a_reply_that_makes_no_sense_is_a_protocol_error(call: Call[object],
                                                         data: bytes) -> None:
    with pytest.raises(ProtocolError, match="close the connection"):
        call.result(reply(data))


# --- the checks --------------------------------------------------------------------------

BAD_ARGUMENTS: list[Callable[[], object]] = [
    lambda: calls.put("text"),  # type: ignore[arg-type]
    lambda: calls.put(bytearray(b"x")),  # type: ignore[arg-type]
    lambda: calls.put(b"x", priority=-1),
    lambda: calls.put(b"x", priority=1 << 32),
    lambda: calls.put(b"x", priority=True),
    lambda: calls.put(b"x", delay=1.5),  # type: ignore[arg-type]
    lambda: calls.put(b"x", ttr=-1),
    lambda: calls.use(""),
    lambda: calls.use("-a"),
    lambda: calls.use("a" * 201),
    lambda: calls.watch("a b"),
    lambda: calls.ignore("é"),
    lambda: calls.stats_tube("a\r\nstats"),
    lambda: calls.pause_tube(b"t", 1),  # type: ignore[arg-type]
    lambda: calls.pause_tube("t", -1),
    lambda: calls.reserve_with_timeout(-1),
    lambda: calls.reserve_with_timeout(calls.MAX_TIMEOUT + 1),
    lambda: calls.reserve_with_timeout(None),  # type: ignore[arg-type]
    lambda: calls.delete(-1),
    lambda: calls.peek(1 << 64),
    lambda: calls.release(1, delay=-1),
    lambda: calls.bury(1, priority=1 << 32),
    lambda: calls.kick(-1),
    lambda: calls.kick_job("1"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("make", BAD_ARGUMENTS)
def test_arguments_are_checked_before_anything_is_sent(make: Callable[[], object]) -> None:
    with pytest.raises(jobs.InvalidJobError, match=r"is not valid|is bytes|larger") as info:
        make()
    assert isinstance(info.value, ValueError) and info.value.hint


# --- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "address"), [
    ("beanstalk://example.com", Address("example.com", 11300)),
    ("beanstalk://example.com:1234", Address("example.com", 1234)),
    ("beanstalk://[::1]", Address("::1", 11300)),
    ("beanstalk://[::1]:11301", Address("::1", 11301)),
    ("127.0.0.1:11300", Address("127.0.0.1", 11300)),
    ("localhost:65535", Address("localhost", 65535)),
    ("[fe80::1%eth0]:1", Address("fe80::1%eth0", 1)),
    ("unix:/run/b.sock", Address(path="/run/b.sock")),
    ("unix:///run/b.sock", Address(path="/run/b.sock")),
    ("unix:b.sock", Address(path="b.sock")),
    (("10.0.0.1", 11300), Address("10.0.0.1", 11300)),
])
def test_addresses(text: str | tuple[str, int], address: Address) -> None:
    assert parse_address(text) == address
    assert parse_address(str(address)) == address
    assert parse_address(address) is address


@pytest.mark.parametrize("text", [
    "", "localhost", "localhost:", "localhost:0", "localhost:65536", "localhost:x",
    "localhost:+1", "localhost:\u0661", ":11300", "::1:11300", "::1", "[::1", "[::1]x", "[]:1",
    "[127.0.0.1]:1", "beanstalk://", "beanstalk://:1", "beanstalk://h:1/", "http://h:1",
    "tcp://h:1", "unix:", "unix://", "unix://host/path", "unix:a\0b", "a b:1", "/run/b.sock",
    ("h",), ("h", "1"), (1, 2), ("h", 0), ("h", True), 11300, None,
])
def test_what_is_not_an_address(text: object) -> None:
    with pytest.raises(InvalidAddressError, match="not a beanstalkd server's address") as info:
        parse_address(text)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and "unix:/PATH" in str(info.value)


# --- the connection's state --------------------------------------------------------------


def test_client_state() -> None:
    state = ClientState("h:1", 2)
    assert (state.timeout, state.ended) == (2.0, False)
    state.check()
    lost = (EOFError, OSError)
    call = calls.delete(5)
    timeout = state.failed(call, TimeoutError(), lost)
    assert type(timeout) is BeanstalkTimeoutError and "within 2.0 s" in str(timeout)
    assert state.ended and "'delete 5' got TimeoutError" in state.broken
    with pytest.raises(BeanstalkConnectionError, match="broke earlier"):
        state.check()

    state = ClientState("h:1", None)
    gone = state.failed(call, EOFError("the server closed the connection"), lost)
    assert type(gone) is BeanstalkConnectionError and "the server closed" in str(gone)
    bad = ProtocolError("x")
    assert ClientState("h", None).failed(call, bad, lost) is bad
    interrupt = KeyboardInterrupt()
    assert ClientState("h", None).failed(call, interrupt, lost) is interrupt

    closed = ClientState("h", None)
    closed.closed = True
    assert type(closed.failed(call, EOFError(), lost)) is k7core.ClosedError
    assert closed.failed(call, interrupt, lost) is interrupt  # a cancellation stays one
    with pytest.raises(k7core.ClosedError, match="is closed"):
        closed.check()

    assert type(ClientState("h", 1).connect_failed(TimeoutError())) is BeanstalkTimeoutError
    refused = ClientState("h", 1).connect_failed(ConnectionRefusedError("refused"))
    assert type(refused) is BeanstalkConnectionError and "refused" in str(refused)
    for bad_timeout in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            ClientState("h", bad_timeout)
