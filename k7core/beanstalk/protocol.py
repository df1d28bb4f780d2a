"""The beanstalkd 1.12 wire protocol, sans-I/O: bytes in, requests or replies out.

The server side (:class:`RequestParser`) follows beanstalkd's ``prot.c`` rule for rule, so
that the same bytes get the same replies: the 224-byte line buffer and what happens to a
longer line, the first ``\\r`` ending a line only when ``\\n`` follows it, each command's
argument parsing (``strtoul`` and ``strtol`` quirks included), ``JOB_TOO_BIG`` after the
whole body was read, ``EXPECTED_CRLF`` after it. The client side (:class:`ReplyParser`,
:func:`command`) is the other half, for clients and load generators. No sockets, no
threads, no clocks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import NamedTuple

from .._errors import K7Error

DEFAULT_PORT = 11300
LINE_MAX = 224
"""A command line's bytes at most, ``\\r\\n`` included (beanstalkd's LINE_BUF_SIZE)."""
NAME_MAX = 200
"""A tube name's bytes at most."""
DEFAULT_MAX_JOB_SIZE = 65535
"""Job bodies' bytes at most unless configured (beanstalkd's ``-z`` default)."""
MAX_JOB_SIZE_LIMIT = 1 << 30
"""The largest ``-z`` beanstalkd accepts."""
NAME_CHARS = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()")
VERSION = "1.12"
"""The beanstalkd version whose protocol this is (reported by ``stats``)."""

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_C_SPACE = b" \t\n\v\f\r"  # isspace() in the C locale: what strtol and strtoul skip
_DIGITS = frozenset(b"0123456789")


class Op(IntEnum):
    """A command, numbered as beanstalkd's ``OP_*``; ``word`` is its name on the wire."""

    UNKNOWN = 0
    PUT = 1
    PEEK = 2
    RESERVE = 3
    DELETE = 4
    RELEASE = 5
    BURY = 6
    KICK = 7
    STATS = 8
    STATS_JOB = 9
    PEEK_BURIED = 10
    USE = 11
    WATCH = 12
    IGNORE = 13
    LIST_TUBES = 14
    LIST_TUBE_USED = 15
    LIST_TUBES_WATCHED = 16
    STATS_TUBE = 17
    PEEK_READY = 18
    PEEK_DELAYED = 19
    RESERVE_WITH_TIMEOUT = 20
    TOUCH = 21
    QUIT = 22
    PAUSE_TUBE = 23
    KICK_JOB = 24
    RESERVE_JOB = 25

    @property
    def word(self) -> str:
        return self.name.lower().replace("_", "-")


# which_cmd: prefixes tried in this order (a prefix may be a longer command's start).
_PREFIXES: tuple[tuple[bytes, Op], ...] = (
    (b"put ", Op.PUT),
    (b"peek ", Op.PEEK),
    (b"peek-ready", Op.PEEK_READY),
    (b"peek-delayed", Op.PEEK_DELAYED),
    (b"peek-buried", Op.PEEK_BURIED),
    (b"reserve-with-timeout ", Op.RESERVE_WITH_TIMEOUT),
    (b"reserve-job ", Op.RESERVE_JOB),
    (b"reserve", Op.RESERVE),
    (b"delete ", Op.DELETE),
    (b"release ", Op.RELEASE),
    (b"bury ", Op.BURY),
    (b"kick ", Op.KICK),
    (b"kick-job ", Op.KICK_JOB),
    (b"touch ", Op.TOUCH),
    (b"stats-job ", Op.STATS_JOB),
    (b"stats-tube ", Op.STATS_TUBE),
    (b"stats", Op.STATS),
    (b"use ", Op.USE),
    (b"watch ", Op.WATCH),
    (b"ignore ", Op.IGNORE),
    (b"list-tubes-watched", Op.LIST_TUBES_WATCHED),
    (b"list-tube-used", Op.LIST_TUBE_USED),
    (b"list-tubes", Op.LIST_TUBES),
    (b"quit", Op.QUIT),
    (b"pause-tube", Op.PAUSE_TUBE),
)
_BY_FIRST: dict[int, tuple[tuple[bytes, Op], ...]] = {}
for _prefix, _op in _PREFIXES:
    _BY_FIRST[_prefix[0]] = (*_BY_FIRST.get(_prefix[0], ()), (_prefix, _op))
_EXACT = {Op.PEEK_READY, Op.PEEK_DELAYED, Op.PEEK_BURIED, Op.RESERVE, Op.STATS,
          Op.LIST_TUBES, Op.LIST_TUBE_USED, Op.LIST_TUBES_WATCHED}
_PREFIX_OF = {op: prefix for prefix, op in _PREFIXES}

# --- replies (prot.c's MSG_*) ------------------------------------------------------------

NOT_FOUND = b"NOT_FOUND\r\n"
DEADLINE_SOON = b"DEADLINE_SOON\r\n"
TIMED_OUT = b"TIMED_OUT\r\n"
DELETED = b"DELETED\r\n"
RELEASED = b"RELEASED\r\n"
BURIED = b"BURIED\r\n"
KICKED = b"KICKED\r\n"
TOUCHED = b"TOUCHED\r\n"
NOT_IGNORED = b"NOT_IGNORED\r\n"
PAUSED = b"PAUSED\r\n"
OUT_OF_MEMORY = b"OUT_OF_MEMORY\r\n"
INTERNAL_ERROR = b"INTERNAL_ERROR\r\n"
DRAINING = b"DRAINING\r\n"
BAD_FORMAT = b"BAD_FORMAT\r\n"
UNKNOWN_COMMAND = b"UNKNOWN_COMMAND\r\n"
EXPECTED_CRLF = b"EXPECTED_CRLF\r\n"
JOB_TOO_BIG = b"JOB_TOO_BIG\r\n"


def inserted(job_id: int) -> bytes:
    return b"INSERTED %d\r\n" % job_id


def kicked(count: int) -> bytes:
    return b"KICKED %d\r\n" % count


def using(tube: str) -> bytes:
    return b"USING %s\r\n" % tube.encode()


def watching(count: int) -> bytes:
    return b"WATCHING %d\r\n" % count


def reserved(job_id: int, body: bytes) -> bytes:
    return b"RESERVED %d %d\r\n%s\r\n" % (job_id, len(body), body)


def found(job_id: int, body: bytes) -> bytes:
    return b"FOUND %d %d\r\n%s\r\n" % (job_id, len(body), body)


def ok(document: bytes) -> bytes:
    """``OK <bytes>`` and a YAML document (from :func:`yaml_map` or :func:`yaml_list`)."""
    return b"OK %d\r\n%s\r\n" % (len(document), document)


def yaml_map(fields: Mapping[str, object]) -> bytes:
    """beanstalkd's stats documents: ``---`` then ``key: value`` lines, in the given order
    (values as given: the caller formats what beanstalkd quotes or pads)."""
    return ("---\n" + "".join(f"{k}: {v}\n" for k, v in fields.items())).encode()


def yaml_list(names: Iterable[str]) -> bytes:
    """list-tubes' documents: ``---`` then ``- name`` lines."""
    return ("---\n" + "".join(f"- {name}\n" for name in names)).encode()


# --- requests ----------------------------------------------------------------------------


class Request(NamedTuple):
    """One command as parsed. ``reply`` is set when the parser already answered it (a format
    error, ``JOB_TOO_BIG``, ``EXPECTED_CRLF``): the server sends it and does nothing else,
    except count the command when ``counted`` (beanstalkd counts a put that was too big).
    The other fields are the command's arguments, as each command has them: ``job_id``;
    ``priority``; ``delay``, ``ttr`` and ``timeout`` in seconds (``timeout`` < 0: none);
    ``bound`` (kick); ``name`` (a tube); ``body`` (put)."""

    op: Op
    reply: bytes = b""
    counted: bool = True
    job_id: int = 0
    priority: int = 0
    delay: int = 0
    ttr: int = 0
    timeout: int = -1
    bound: int = 0
    name: str = ""
    body: bytes = b""


_BAD_FORMAT = Request(Op.UNKNOWN, BAD_FORMAT, False)
_UNKNOWN = Request(Op.UNKNOWN, UNKNOWN_COMMAND, False)
_PUT_GARBAGE = Request(Op.PUT, BAD_FORMAT)  # counted: beanstalkd counts it first
_NO_ARGS = {op: Request(op) for op in _EXACT}


def _number(line: bytes, i: int, limit: int, to_end: bool) -> tuple[int, int] | None:
    """prot.c's read_u64/read_u32 from ``line[i:]``: spaces, then decimal digits, at most
    ``limit``; with ``to_end`` nothing may follow. (value, index after) or None."""
    n = len(line)
    while i < n and line[i] == 0x20:
        i += 1
    j = i
    while j < n and line[j] in _DIGITS:
        j += 1
    if j == i or (to_end and j != n):
        return None
    value = int(line[i:j])
    if value > limit:
        return None
    return value, j


def _c_integer(line: bytes, i: int, signed: bool) -> tuple[int, int] | None:
    """C's strtol (``signed``) or strtoul from ``line[i:]``, base 10: whitespace, a sign,
    digits. (value as C returns it, index after the digits; ``i`` when none) or None on
    ERANGE. strtoul negates in unsigned arithmetic ("-1" is ULONG_MAX)."""
    n = len(line)
    j = i
    while j < n and line[j] in _C_SPACE:
        j += 1
    negative = False
    if j < n and line[j] in b"+-":
        negative = line[j] == 0x2D
        j += 1
    k = j
    while k < n and line[k] in _DIGITS:
        k += 1
    if k == j:
        return 0, i  # no conversion
    value = int(line[j:k])
    if signed:
        value = -value if negative else value
        if not -(1 << 63) <= value < 1 << 63:
            return None
        return value, k
    if value > _U64:
        return None
    return (-value) & _U64 if negative else value, k


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _tube_name(raw: bytes) -> str | None:
    """prot.c's is_valid_tube: 1..200 name characters, not starting with '-'."""
    if not 0 < len(raw) <= NAME_MAX or raw[0] == 0x2D:
        return None
    if not NAME_CHARS.issuperset(raw):
        return None
    return raw.decode("ascii")


class PutHead(NamedTuple):
    """A put's command line, parsed: its body (``size`` bytes, then ``\\r\\n``) comes next.
    ``clean`` is False when garbage follows the size (BAD_FORMAT, unless the job is too
    big: beanstalkd checks the size first)."""

    priority: int
    delay: int
    ttr: int
    size: int
    clean: bool


def parse_line(line: bytes) -> Request | PutHead:
    """Parse one command line (without its ``\\r\\n``) as prot.c's dispatch_cmd does: a
    request, or the head of a put (:func:`put_request` makes the request)."""
    if 0 in line:
        return _BAD_FORMAT
    op = Op.UNKNOWN
    if line:
        for prefix, candidate in _BY_FIRST.get(line[0], ()):
            if line.startswith(prefix):
                op = candidate
                break
    if op is Op.UNKNOWN:
        return _UNKNOWN
    if op in _EXACT:
        return _NO_ARGS[op] if len(line) == len(_PREFIX_OF[op]) else _BAD_FORMAT
    start = len(_PREFIX_OF[op])
    if op is Op.PUT:
        return _parse_put(line, start)
    if op in (Op.PEEK, Op.RESERVE_JOB, Op.DELETE, Op.KICK_JOB, Op.TOUCH, Op.STATS_JOB):
        got = _number(line, start, _U64, True)
        return _BAD_FORMAT if got is None else Request(op, job_id=got[0])
    if op is Op.RESERVE_WITH_TIMEOUT:
        long = _c_integer(line, start, signed=True)
        if long is None:
            return _BAD_FORMAT
        return Request(op, timeout=_int32(long[0]))
    if op is Op.RELEASE:
        job = _number(line, start, _U64, False)
        pri = job and _number(line, job[1], _U32, False)
        delay = pri and _number(line, pri[1], _U32, True)
        if not (job and pri and delay):
            return _BAD_FORMAT
        return Request(op, job_id=job[0], priority=pri[0], delay=delay[0])
    if op is Op.BURY:
        job = _number(line, start, _U64, False)
        pri = job and _number(line, job[1], _U32, True)
        if not (job and pri):
            return _BAD_FORMAT
        return Request(op, job_id=job[0], priority=pri[0])
    if op is Op.KICK:
        got = _c_integer(line, start, signed=False)
        if got is None or got[1] == start:
            return _BAD_FORMAT
        return Request(op, bound=got[0] & 0xFFFFFFFF)
    if op is Op.QUIT:
        return Request(op)
    if op is Op.PAUSE_TUBE:
        return _parse_pause(line, start)
    name = _tube_name(line[start:])  # use, watch, ignore, stats-tube
    return _BAD_FORMAT if name is None else Request(op, name=name)


def _parse_put(line: bytes, start: int) -> Request | PutHead:
    pri = _number(line, start, _U32, False)
    delay = pri and _number(line, pri[1], _U32, False)
    ttr = delay and _number(line, delay[1], _U32, False)
    size = ttr and _number(line, ttr[1], _U32, False)
    if not (pri and delay and ttr and size):
        return _BAD_FORMAT
    return PutHead(pri[0], delay[0], ttr[0], size[0], size[1] == len(line))


def put_request(head: PutHead, data: bytes | memoryview) -> Request:
    """The put of ``head`` whose body plus ``\\r\\n`` is ``data``, or EXPECTED_CRLF."""
    if data[-2:] != b"\r\n":
        return Request(Op.PUT, EXPECTED_CRLF)
    return Request(Op.PUT, priority=head.priority, delay=head.delay, ttr=max(head.ttr, 1),
                   body=bytes(data[:-2]))


def _parse_pause(line: bytes, start: int) -> Request:
    i, n = start, len(line)
    while i < n and line[i] == 0x20:
        i += 1
    j = i
    while j < n and line[j] in NAME_CHARS:
        j += 1
    if j == i:
        return _BAD_FORMAT
    delay = _number(line, j, _U32, True)
    if delay is None:
        return _BAD_FORMAT
    name = _tube_name(line[i:j])
    if name is None:
        return Request(Op.PAUSE_TUBE, BAD_FORMAT)  # counted: beanstalkd checks it late
    return Request(Op.PAUSE_TUBE, name=name, delay=delay[0])


def _line_end(buf: bytearray, size: int) -> int:
    """prot.c's scan_line_end over ``buf[:size]``: the length of the line with its
    ``\\r\\n`` when the *first* ``\\r`` is followed by ``\\n``, else 0."""
    at = buf.find(b"\r", 0, size - 1)
    if at < 0 or buf[at + 1] != 0x0A:
        return 0
    return at + 2


_COMMAND, _ENDLINE, _BODY, _BUCKET = range(4)

_PLAIN_PUT = re.compile(rb"put +([0-9]{1,9}) +([0-9]{1,9}) +([0-9]{1,9}) +([0-9]{1,9})\r\n")
"""A put line in its common form (numbers below 10**9 < 2**32, nothing else on the line):
what the general path would make of it is certain, so :meth:`RequestParser.next` takes it
and its body in one step (the general path parses every other line, and this one when its
body is not all there, too big, or without its ``\r\n``)."""


class RequestParser:
    """The server's side: :meth:`feed` what the connection received, then take the
    requests in order with :meth:`next`. Format errors come out as requests with their
    reply, in their place, so replies to pipelined commands stay in order."""

    def __init__(self, max_job_size: int = DEFAULT_MAX_JOB_SIZE) -> None:
        self.max_job_size = max_job_size
        self._buf = bytearray()
        self._state = _COMMAND
        self._need = 0  # bytes the body (or the discarded body) still needs
        self._head: PutHead | None = None  # the put whose body is being read

    @property
    def buffered(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Request | None:
        """The next complete request, or None until more bytes are fed."""
        buf = self._buf
        if self._state == _COMMAND and (m := _PLAIN_PUT.match(buf)) is not None:
            start, size = m.end(), int(m[4])
            end = start + size
            if start <= LINE_MAX and size <= self.max_job_size and len(buf) >= end + 2 \
                    and buf[end] == 0x0D and buf[end + 1] == 0x0A:
                request = Request(Op.PUT, priority=int(m[1]), delay=int(m[2]),
                                  ttr=max(int(m[3]), 1), body=bytes(buf[start:end]))
                del buf[:end + 2]
                return request
        while True:
            state = self._state
            if state <= _ENDLINE:  # _COMMAND or _ENDLINE
                size = min(len(buf), LINE_MAX)
                end = _line_end(buf, size) if size >= 2 else 0
                if not end:
                    if size == LINE_MAX:  # too long: dropped up to the line's end
                        del buf[:LINE_MAX]
                        self._state = _ENDLINE
                        continue
                    return None
                line = bytes(buf[:end - 2])
                del buf[:end]
                if state == _ENDLINE:
                    self._state = _COMMAND
                    return _BAD_FORMAT
                parsed = parse_line(line)
                if type(parsed) is Request:
                    return parsed
                assert isinstance(parsed, PutHead)
                if parsed.size > self.max_job_size:
                    self._state, self._need = _BUCKET, parsed.size + 2
                elif not parsed.clean:
                    return _PUT_GARBAGE
                else:
                    self._state, self._need, self._head = _BODY, parsed.size + 2, parsed
            elif state == _BODY:
                need = self._need
                if len(buf) < need:
                    return None
                assert self._head is not None
                request = put_request(self._head, memoryview(buf)[:need])
                del buf[:need]
                self._state, self._head = _COMMAND, None
                return request
            else:  # _BUCKET: JOB_TOO_BIG once the whole body is thrown away
                dropped = min(len(buf), self._need)
                del buf[:dropped]
                self._need -= dropped
                if self._need:
                    return None
                self._state = _COMMAND
                return Request(Op.PUT, JOB_TOO_BIG)


# --- the client's side -------------------------------------------------------------------


def command(op: Op, *args: int | str) -> bytes:
    """A command line: ``command(Op.RELEASE, 5, 1024, 0)`` is ``b"release 5 1024 0\\r\\n"``
    (a put's body goes with :func:`put_command`)."""
    if op in (Op.PUT, Op.UNKNOWN):
        raise ValueError(f"{op.word}: use put_command() for a put")
    words = [op.word, *(str(a) for a in args)]
    return " ".join(words).encode() + b"\r\n"


def put_command(body: bytes, priority: int = 1024, delay: int = 0, ttr: int = 60) -> bytes:
    return b"put %d %d %d %d\r\n%s\r\n" % (priority, delay, ttr, len(body), body)


class Reply(NamedTuple):
    """A server reply: its first word, the other words of its line, and the body
    (``RESERVED``, ``FOUND``, ``OK``) without its ``\\r\\n``."""

    word: str
    args: tuple[str, ...] = ()
    body: bytes | None = None


_WITH_BODY = {"RESERVED": 1, "FOUND": 1, "OK": 0}  # which word gives the body's size


class ProtocolError(K7Error, ValueError):
    """The server's bytes are not a beanstalkd reply (a client talks to something else, or
    the stream lost its place): close the connection."""


class ReplyParser:
    """The client's side: :meth:`feed` what the server sent; :meth:`next` gives the
    replies in order."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: Reply | None = None
        self._need = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> Reply | None:
        buf = self._buf
        if self._head is None:
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > LINE_MAX:
                    raise ProtocolError(f"no reply line in {bytes(buf[:40])!r}...")
                return None
            words = bytes(buf[:end]).decode("ascii", "replace").split(" ")
            del buf[:end + 2]
            head = Reply(words[0], tuple(words[1:]))
            at = _WITH_BODY.get(head.word)
            if at is None:
                return head
            try:
                self._need = int(head.args[at]) + 2
            except (IndexError, ValueError):
                raise ProtocolError(f"bad reply line {words!r}") from None
            self._head = head
        if len(buf) < self._need:
            return None
        body = bytes(buf[:self._need - 2])
        if buf[self._need - 2:self._need] != b"\r\n":
            raise ProtocolError("a reply body does not end with \\r\\n")
        del buf[:self._need]
        head, self._head = self._head, None
        return head._replace(body=body)


__all__ = [
    "BAD_FORMAT", "BURIED", "DEADLINE_SOON", "DEFAULT_MAX_JOB_SIZE", "DEFAULT_PORT", "DELETED",
    "DRAINING", "EXPECTED_CRLF", "INTERNAL_ERROR", "JOB_TOO_BIG", "KICKED", "LINE_MAX",
    "MAX_JOB_SIZE_LIMIT", "NAME_CHARS", "NAME_MAX", "NOT_FOUND", "NOT_IGNORED",
    "OUT_OF_MEMORY", "PAUSED", "RELEASED", "TIMED_OUT", "TOUCHED", "UNKNOWN_COMMAND",
    "VERSION", "Op", "ProtocolError", "PutHead", "Reply", "ReplyParser", "Request",
    "RequestParser", "command", "found", "inserted", "kicked", "ok", "parse_line",
    "put_command", "put_request", "reserved", "using", "watching", "yaml_list", "yaml_map",
]
