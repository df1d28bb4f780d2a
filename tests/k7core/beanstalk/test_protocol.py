"""The sans-I/O beanstalkd protocol: prot.c's parsing rules, quirks included, and the
client's half. (The replies a real server gives are compared with beanstalkd's own in
tests/k7async/server/test_differential.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k7core.beanstalk import Op, ProtocolError, Reply, ReplyParser, Request, RequestParser
from k7core.beanstalk import protocol as wire


def parse(data: bytes, max_job_size: int = wire.DEFAULT_MAX_JOB_SIZE) -> list[Request]:
    parser = RequestParser(max_job_size)
    parser.feed(data)
    out = []
    while (r := parser.next()) is not None:
        out.append(r)
    return out


def replies(data: bytes) -> list[bytes]:
    return [r.reply for r in parse(data)]


def test_put_and_its_arguments() -> None:
    (r,) = parse(b"put 5 10 0 3\r\nabc\r\n")
    assert (r.op, r.priority, r.delay, r.ttr, r.body, r.reply) == (Op.PUT, 5, 10, 1, b"abc", b"")
    (r,) = parse(b"put  4294967295 0 30 0\r\n\r\n")  # spaces before a number are skipped
    assert (r.priority, r.ttr, r.body) == (4294967295, 30, b"")


@pytest.mark.parametrize("line", [
    b"put 4294967296 0 1 1", b"put -1 0 1 1", b"put x 0 1 1", b"put 1 0 1", b"put 1x 0 1 1",
    b"put 1 0 1 1 ", b"put 1 0 1 1 garbage", b"use -tube", b"use " + b"t" * 201, b"use ",
    b"watch a b", b"delete ", b"delete 1 ", b"delete 18446744073709551616", b"release 1 2",
    b"bury 1", b"kick ", b"kick x", b"peek-readyx", b"reserve ", b"stats-tube", b"list-tubes ",
    b"use a\x00b", b"stats-tube  default", b"pause-tube 1", b"pause-tube -x 1",
])
def test_bad_format(line: bytes) -> None:
    assert replies(line + b"\r\n") == [wire.BAD_FORMAT]


@pytest.mark.parametrize("line", [
    b"", b"PUT 1 0 1 1", b"puts", b"hello", b" put 1 0 1 1", b"delete", b"kick", b"use",
])
def test_unknown_command(line: bytes) -> None:
    assert replies(line + b"\r\n") == [wire.UNKNOWN_COMMAND]


def test_what_beanstalkd_counts_among_bad_formats() -> None:
    """op_ct is incremented before some late checks: a put with garbage after its size, a
    pause-tube whose name starts with '-'."""
    (garbage,) = parse(b"put 1 0 1 1 x\r\n")
    (pause,) = parse(b"pause-tube -x 1\r\n")
    (early,) = parse(b"put x\r\n")
    assert (garbage.counted, garbage.op) == (True, Op.PUT)
    assert (pause.counted, pause.op, pause.reply) == (True, Op.PAUSE_TUBE, wire.BAD_FORMAT)
    assert not early.counted


def test_names_at_the_limits() -> None:
    ok = b"x" * wire.NAME_MAX
    assert parse(b"use " + ok + b"\r\n")[0].name == ok.decode()
    assert parse(b"watch (x)$;+/.-_\r\n")[0].name == "(x)$;+/.-_"


def test_prefix_matching_as_which_cmd() -> None:
    """Commands are recognized by prefix: quit takes anything after it; pause-tube needs no
    space before its name; reserve-with-timeout needs its space (else it is a bad
    reserve)."""
    assert parse(b"quitnow\r\n")[0].op is Op.QUIT
    r = parse(b"pause-tubefoo 5\r\n")[0]
    assert (r.op, r.name, r.delay) == (Op.PAUSE_TUBE, "foo", 5)
    assert replies(b"reserve-with-timeout\r\n") == [wire.BAD_FORMAT]
    assert parse(b"list-tubes-watched\r\n")[0].op is Op.LIST_TUBES_WATCHED
    assert parse(b"stats-job 7\r\n")[0].job_id == 7


@pytest.mark.parametrize(("arg", "timeout"), [
    (b"5", 5), (b"0", 0), (b"-3", -3), (b"  7xyz", 7), (b"abc", 0), (b"", 0),
    (b"4294967296", 0), (b"4294967295", -1), (b"+9", 9),
])
def test_reserve_with_timeout_reads_like_strtol_into_an_int(arg: bytes, timeout: int) -> None:
    (r,) = parse(b"reserve-with-timeout " + arg + b"\r\n")
    assert (r.op, r.reply, r.timeout) == (Op.RESERVE_WITH_TIMEOUT, b"", timeout)


def test_reserve_with_timeout_out_of_long_range() -> None:
    assert replies(b"reserve-with-timeout 9223372036854775808\r\n") == [wire.BAD_FORMAT]


@pytest.mark.parametrize(("arg", "bound"), [
    (b"5", 5), (b"-1", 4294967295), (b" 3x", 3), (b"4294967296", 0), (b"\t2", 2),
])
def test_kick_reads_like_strtoul_into_a_uint(arg: bytes, bound: int) -> None:
    (r,) = parse(b"kick " + arg + b"\r\n")
    assert (r.op, r.bound) == (Op.KICK, bound)


def test_expected_crlf_then_the_rest_is_commands() -> None:
    """The body is read by its size; what follows it is the next command's start."""
    assert replies(b"put 0 0 1 1\r\nab\r\nput 0 0 1 1\r\nc\r\n") == [
        wire.EXPECTED_CRLF, wire.UNKNOWN_COMMAND, wire.UNKNOWN_COMMAND]


def test_job_too_big_comes_after_the_whole_body() -> None:
    parser = RequestParser(max_job_size=10)
    parser.feed(b"put 0 0 1 11 trailing garbage\r\n" + b"x" * 12)
    assert parser.next() is None  # one byte of the body (plus its CRLF) still to come
    parser.feed(b"\ruse a\r\n")
    first, second = parser.next(), parser.next()
    assert first is not None and (first.op, first.reply) == (Op.PUT, wire.JOB_TOO_BIG)
    assert second is not None and second.name == "a"
    assert parse(b"put 0 0 1 10\r\n0123456789\r\n", 10)[0].body == b"0123456789"


def test_a_long_line_is_dropped_up_to_its_end() -> None:
    exact = b"use " + b"t" * (wire.LINE_MAX - 6) + b"\r\n"  # 224 bytes: still a line
    assert len(exact) == wire.LINE_MAX
    assert replies(exact) == [wire.BAD_FORMAT]  # (the name is too long, not the line)
    long = b"x" * 1000 + b"\r\nlist-tube-used\r\n"
    got = parse(long)
    assert [r.reply for r in got] == [wire.BAD_FORMAT, b""]
    assert got[1].op is Op.LIST_TUBE_USED


def test_only_the_first_cr_can_end_a_line() -> None:
    """scan_line_end looks at the first \\r only: a lone \\r makes the line run on until
    the 224-byte buffer is full, and everything up to the next line end is dropped."""
    parser = RequestParser()
    parser.feed(b"use a\rb\r\n")
    assert parser.next() is None
    parser.feed(b"y" * 300 + b"\r\nstats\r\n")
    got = [parser.next(), parser.next(), parser.next()]
    assert got[0] is not None and got[0].reply == wire.BAD_FORMAT
    assert got[1] is not None and got[1].op is Op.STATS
    assert got[2] is None


@given(st.lists(st.integers(0, 40), max_size=30))
def test_chunking_does_not_change_what_is_parsed(cuts: list[int]) -> None:
    stream = (b"put 1 2 3 5\r\nhello\r\nreserve\r\n" + b"z" * 250 + b"\r\n"
              + b"put 0 0 1 3\r\nabcd\r\nput 0 0 1 70000\r\n" + b"q" * 70002
              + b"use a\rb\r\n" + b"w" * 230 + b"\r\nkick -1\r\nquit\r\n")
    whole = parse(stream)
    parser = RequestParser()
    got = []
    at = 0
    for cut in cuts:
        parser.feed(stream[at:at + cut])
        at += cut
        while (r := parser.next()) is not None:
            got.append(r)
    parser.feed(stream[at:])
    while (r := parser.next()) is not None:
        got.append(r)
    assert got == whole
    assert [r.op for r in whole][-1] is Op.QUIT


def test_reply_builders() -> None:
    assert wire.inserted(12) == b"INSERTED 12\r\n"
    assert wire.reserved(3, b"ab") == b"RESERVED 3 2\r\nab\r\n"
    assert wire.found(3, b"") == b"FOUND 3 0\r\n\r\n"
    assert wire.ok(wire.yaml_list(["default"])) == b"OK 14\r\n---\n- default\n\r\n"
    assert wire.yaml_map({"a": 1, "b": "x"}) == b"---\na: 1\nb: x\n"


def test_client_half_round_trip() -> None:
    assert wire.command(Op.RELEASE, 5, 1024, 0) == b"release 5 1024 0\r\n"
    assert wire.put_command(b"hi", 1, 2, 3) == b"put 1 2 3 2\r\nhi\r\n"
    with pytest.raises(ValueError, match="put_command"):
        wire.command(Op.PUT)
    (r,) = parse(wire.put_command(b"body\r\nwith crlf", 7))
    assert (r.priority, r.body) == (7, b"body\r\nwith crlf")
    parser = ReplyParser()
    stream = (wire.inserted(1) + wire.reserved(1, b"a\r\nb") + wire.NOT_FOUND
              + wire.ok(wire.yaml_list(["x"])))
    for i in range(len(stream)):  # byte by byte
        parser.feed(stream[i:i + 1])
    got = []
    while (reply := parser.next()) is not None:
        got.append(reply)
    assert got == [Reply("INSERTED", ("1",)), Reply("RESERVED", ("1", "4"), b"a\r\nb"),
                   Reply("NOT_FOUND"), Reply("OK", ("8",), b"---\n- x\n")]


def test_reply_parser_rejects_what_is_not_a_reply() -> None:
    parser = ReplyParser()
    parser.feed(b"RESERVED x\r\n")
    with pytest.raises(ProtocolError):
        parser.next()
    parser = ReplyParser()
    parser.feed(b"FOUND 1 2\r\nabXY")
    with pytest.raises(ProtocolError):
        parser.next()


_NUMBER = st.one_of(st.integers(0, 2**33).map(lambda n: str(n).encode()),
                    st.text("0123456789", min_size=1, max_size=12).map(str.encode))
_GAP = st.sampled_from([b" ", b"  ", b"   ", b"\t", b""])


@given(st.lists(_NUMBER, min_size=4, max_size=4), st.lists(_GAP, min_size=4, max_size=4),
       st.sampled_from([b"", b" ", b"x", b" 7"]), st.integers(0, 300), st.integers(-2, 2),
       st.sampled_from([b"\r\n", b"\n\r", b"xy"]), st.integers(0, 300))
def test_a_whole_put_parses_as_one_fed_byte_by_byte(
        numbers: list[bytes], gaps: list[bytes], tail: bytes, size: int, skew: int,
        end: bytes, max_job_size: int) -> None:
    """A put whose line and body are all there may be taken in one step (the common form);
    fed a byte at a time, the same bytes go through the general path: same requests."""
    numbers[3] = str(size).encode() if skew != 2 else numbers[3]
    line = b"put" + b"".join(g + n for g, n in zip(gaps, numbers, strict=True)) + tail
    body = b"b" * max(size + skew, 0)
    stream = line + b"\r\n" + body + end + b"quit\r\n"
    whole = parse(stream, max_job_size)
    parser = RequestParser(max_job_size)
    one_by_one = []
    for i in range(len(stream)):
        parser.feed(stream[i:i + 1])
        while (r := parser.next()) is not None:
            one_by_one.append(r)
    assert whole == one_by_one
