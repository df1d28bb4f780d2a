"""Differential tests: the same bytes sent to the real beanstalkd 1.12 and to ours
(k7-beanstalkd), every reply compared byte for byte.

Each test starts both servers as child processes (``_servers``) and holds its conversation
with both at once through :class:`Conv`: one connection to each server, the same bytes
sent to both, the replies of both read and compared. Where beanstalkd misbehaves, the test
says so and checks the documented behaviour on ours only.

JOB IDS ARE THE ONE DIFFERENCE ALLOWED. beanstalkd numbers its jobs 1, 2, 3...; ours are
journal positions (1, 73, 145...), not consecutive. :class:`Ids` keeps a bijection: each id
ours returns (``INSERTED``, ``RESERVED``, ``FOUND``, ``BURIED <id>``, the ``id:`` of a
stats-job document) is paired with the id beanstalkd returned in the same place and
rewritten to it before the replies are compared; a pairing that contradicts an earlier one
fails the test. Tests name jobs by beanstalkd's ids, and a command that carries ids
(``b"delete %d\\r\\n"``) is formatted per server, each with its own id (an id that neither
server returned goes out unchanged). Any other difference is a bug.

In stats documents the values that legitimately differ are masked: ``pid``, the server's
``id``, ``hostname``, ``os``, ``platform``, ``version``, ``uptime``, ``rusage-*``,
``binlog-*``; ``age``, ``time-left`` and ``pause-time-left`` may differ by 1 (the two
servers' clocks tick apart). The keys, their order and every other value must match.
"""


from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ._servers import Client, ServerProcess, beanstalkd_path, start_beanstalkd, start_k7

JOB_WORDS = frozenset({b"INSERTED", b"RESERVED", b"FOUND", b"BURIED"})
MASKED = frozenset({"pid", "id", "hostname", "os", "platform", "version", "uptime",
                    "rusage-utime", "rusage-stime"})
NEAR = frozenset({"age", "time-left", "pause-time-left"})
_JOB_DOC = re.compile(rb"---\nid: (\d+)\n")


class Mismatch(AssertionError):
    """The servers answered differently."""


class Ids:
    """The bijection between ours' job ids and beanstalkd's."""

    def __init__(self) -> None:
        self.to_real: dict[int, int] = {}
        self.to_ours: dict[int, int] = {}

    def pair(self, real: int, ours: int, where: bytes) -> None:
        if self.to_real.get(ours, real) != real or self.to_ours.get(real, ours) != ours:
            raise Mismatch(f"after {where!r}: ours' job {ours} is beanstalkd's {real}, but "
                           f"was paired with {self.to_real.get(ours)} (beanstalkd's {real} "
                           f"with ours' {self.to_ours.get(real)})")
        self.to_real[ours] = real
        self.to_ours[real] = ours

    def ours(self, real: int) -> int:
        return self.to_ours.get(real, real)


def parse_doc(body: bytes) -> list[tuple[str, str]] | None:
    """A stats document's ``key: value`` lines, or None when ``body`` is not one."""
    if not body.startswith(b"---\n") or not body.endswith(b"\n"):
        return None
    out: list[tuple[str, str]] = []
    for line in body[4:-1].decode("latin-1").split("\n"):
        key, sep, value = line.partition(": ")
        if not sep or key.startswith("- "):
            return None
        out.append((key, value))
    return out


def _same_doc(real: list[tuple[str, str]], ours: list[tuple[str, str]]) -> bool:
    if [k for k, _ in real] != [k for k, _ in ours]:
        return False
    for (key, a), (_, b) in zip(real, ours, strict=True):
        if key in MASKED or key.startswith("binlog-"):
            continue
        if key in NEAR and a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
            if abs(int(a) - int(b)) > 1:
                return False
        elif a != b:
            return False
    return True


def _split(reply: bytes) -> tuple[bytes, bytes | None]:
    line, _, rest = reply.partition(b"\r\n")
    return line, (rest[:-2] if rest else None)


def same(real: bytes, ours: bytes, ids: Ids, sent: bytes) -> bool:
    """Whether two replies to ``sent`` match, ids paired (and learnt) and masks applied."""
    line_r, body_r = _split(real)
    line_o, body_o = _split(ours)
    words_r, words_o = line_r.split(b" "), line_o.split(b" ")
    if (words_r[0] == words_o[0] and words_r[0] in JOB_WORDS and len(words_r) > 1
            and len(words_o) > 1 and words_r[1].isdigit() and words_o[1].isdigit()):
        ids.pair(int(words_r[1]), int(words_o[1]), sent)
        words_o[1] = words_r[1]
        line_o = b" ".join(words_o)
    if body_r is not None and body_o is not None:
        m_r, m_o = _JOB_DOC.match(body_r), _JOB_DOC.match(body_o)
        if m_r and m_o:
            ids.pair(int(m_r[1]), int(m_o[1]), sent)
            body_o = body_o.replace(m_o[0], m_r[0], 1)
        doc_r, doc_o = parse_doc(body_r), parse_doc(body_o)
        if doc_r is not None and doc_o is not None and words_r[0] == words_o[0] == b"OK":
            return _same_doc(doc_r, doc_o)
    return (line_r, body_r) == (line_o, body_o)


class Diff:
    """The real beanstalkd and ours, started alike; :meth:`conv` opens a conversation."""

    def __init__(self, root: Path, max_job_size: int | None = None,
                 binlog: bool = False) -> None:
        self.root = root
        self.max_job_size = max_job_size
        self.binlog = binlog
        self.ids = Ids()
        self.convs: list[Conv] = []
        self.real, self.ours = self._start()

    def _start(self) -> tuple[ServerProcess, ServerProcess]:
        binlog = self.root / "beanstalkd" if self.binlog else None
        if binlog is not None:
            binlog.mkdir(exist_ok=True)
        real = start_beanstalkd(binlog, self.max_job_size)
        try:
            ours = start_k7(self.root / "k7", self.max_job_size)
        except BaseException:
            real.kill()
            raise
        return real, ours

    def conv(self) -> Conv:
        conv = Conv(self)
        self.convs.append(conv)
        return conv

    def restart(self) -> None:
        """Stop both (SIGTERM, then wait) and start them again over the same directories;
        the id pairing stays."""
        self.stop()
        self.real, self.ours = self._start()

    def stop(self) -> None:
        for conv in self.convs:
            conv.close()
        self.convs.clear()
        try:
            self.real.stop()
        finally:
            self.ours.stop()


class Conv:
    """One connection to each server; the same bytes go to both."""

    def __init__(self, diff: Diff) -> None:
        self.diff = diff
        self.real: Client = diff.real.client()
        self.ours: Client = diff.ours.client()
        self.sent = b""

    def send(self, data: bytes, *ids: int) -> None:
        """Send ``data`` (``%d`` formatted with ``ids``, per server) to both."""
        real = data % ids if ids else data
        ours = data % tuple(self.diff.ids.ours(i) for i in ids) if ids else data
        self.sent = real
        self.real.send(real)
        self.ours.send(ours)

    def _compare(self, real: list[bytes], ours: list[bytes]) -> list[bytes]:
        if len(real) != len(ours) or not all(
                same(a, b, self.diff.ids, self.sent) for a, b in zip(real, ours, strict=False)):
            raise Mismatch(f"to {self.sent!r}\n  beanstalkd said {real!r}\n  ours said       "
                           f"{ours!r}")
        return real

    def _one(self, client: Client) -> bytes:
        try:
            return client.reply()
        except (TimeoutError, EOFError) as exc:
            return f"<{exc}>".encode()

    def recv(self, n: int = 1) -> list[bytes]:
        """Exactly ``n`` replies from each server, compared; beanstalkd's."""
        real = [self._one(self.real) for _ in range(n)]
        ours = [self._one(self.ours) for _ in range(n)]
        return self._compare(real, ours)

    def recv_some(self, n: int) -> list[bytes]:
        """Up to ``n`` replies from each, fewer when a server falls silent; compared,
        their count too."""
        return self._compare(self.real.replies(n), self.ours.replies(n))

    def check(self, data: bytes, *ids: int, expect: bytes | None = None) -> bytes:
        """Send a command, compare the replies, return beanstalkd's (which must be
        ``expect`` when given)."""
        self.send(data, *ids)
        got = self.recv()[0]
        if expect is not None:
            assert got == expect, f"to {self.sent!r}: {got!r}, not {expect!r}"
        return got

    def put(self, body: bytes = b"job", priority: int = 1024, delay: int = 0,
            ttr: int = 60) -> int:
        """A put; beanstalkd's id of the job."""
        got = self.check(b"put %d %d %d %d\r\n" % (priority, delay, ttr, len(body))
                         + body + b"\r\n")
        assert got.startswith(b"INSERTED "), got
        return int(got.split()[1])

    def reserve(self, data: bytes = b"reserve\r\n") -> int:
        got = self.check(data)
        assert got.startswith(b"RESERVED "), f"to {data!r}: {got!r}"
        return int(got.split()[1])

    def doc(self, data: bytes, *ids: int) -> dict[str, str]:
        """A stats command's document (beanstalkd's), compared."""
        got = self.check(data, *ids)
        doc = parse_doc(_split(got)[1] or b"")
        assert got.startswith(b"OK ") and doc is not None, f"to {data!r}: {got!r}"
        return dict(doc)

    def closed(self) -> None:
        """Both servers hang up without another byte."""
        real, ours = self.real.closed(), self.ours.closed()
        if not (real and ours):
            raise Mismatch(f"after {self.sent!r}: beanstalkd hung up: {real}, ours: {ours}")

    def close(self) -> None:
        self.real.close()
        self.ours.close()


# --- fixtures ------------------------------------------------------------------------------

MakeDiff = Callable[..., Diff]


def _need_beanstalkd() -> None:
    if beanstalkd_path() is None:
        pytest.skip("the real beanstalkd is not installed (apt-get install beanstalkd): the "
                    "differential tests compare ours with it")


@pytest.fixture
def make_diff(tmp_path: Path) -> Iterator[MakeDiff]:
    """Start a pair of servers: ``make_diff(max_job_size=None, binlog=False)``."""
    _need_beanstalkd()
    made: list[Diff] = []

    def make(max_job_size: int | None = None, binlog: bool = False) -> Diff:
        root = tmp_path / f"pair{len(made)}"
        root.mkdir()
        made.append(Diff(root, max_job_size, binlog))
        return made[-1]

    yield make
    for diff in made:
        diff.stop()


@pytest.fixture
def diff(make_diff: MakeDiff) -> Diff:
    return make_diff()


@pytest.fixture
def conv(diff: Diff) -> Conv:
    return diff.conv()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Diff]:
    """One pair for the stateless cases (format errors), which run on fresh connections."""
    _need_beanstalkd()
    pair = Diff(tmp_path_factory.mktemp("shared"))
    yield pair
    pair.stop()


def _cmd_counts(doc: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in doc.items() if k.startswith("cmd-")}


def _client_stats(client: Client) -> dict[str, str]:
    client.send(b"stats\r\n")
    doc = parse_doc(_split(client.reply())[1] or b"")
    assert doc is not None
    return dict(doc)


# --- format errors and odd lines, each on fresh connections -------------------------------

B = b"BAD_FORMAT\r\n"
U = b"UNKNOWN_COMMAND\r\n"
NF = b"NOT_FOUND\r\n"
A200 = b"a" * 200
A201 = b"a" * 201

LINES: list[tuple[bytes, list[bytes]]] = [
    # put: priorities, delays, ttrs and sizes are decimal u32s; after a put refused for its
    # format, its body is read as a command
    (b"put -1 0 1 1\r\nx\r\n", [B, U]),
    (b"put x 0 1 1\r\nx\r\n", [B, U]),
    (b"put +1 0 1 1\r\nx\r\n", [B, U]),
    (b"put 4294967296 0 1 1\r\nx\r\n", [B, U]),
    (b"put 99999999999999999999999 0 1 1\r\nx\r\n", [B, U]),
    (b"put 1 4294967296 1 1\r\nx\r\n", [B, U]),
    (b"put 1 0 4294967296 1\r\nx\r\n", [B, U]),
    (b"put 1 0 1 4294967296\r\nx\r\n", [B, U]),
    (b"put 1 0 1\r\nx\r\n", [B, U]),
    (b"put\r\n", [U]),
    (b"put 1 0 1 1 x\r\nx\r\n", [B, U]),
    (b"put 1 0 1 1 \r\nx\r\n", [B, U]),
    (b"put 1 0 1 1x\r\nx\r\n", [B, U]),
    (b"put 1 0 1 1\t\r\nx\r\n", [B, U]),
    (b"put 1 0 1 \x001\r\nx\r\n", [B, U]),
    # job ids are decimal u64s, nothing after them
    (b"peek\r\n", [U]),
    (b"peek \r\n", [B]),
    (b"peek x\r\n", [B]),
    (b"peek -1\r\n", [B]),
    (b"peek 1 \r\n", [B]),
    (b"peek 1x\r\n", [B]),
    (b"peek 18446744073709551616\r\n", [B]),
    (b"peek 18446744073709551615\r\n", [NF]),
    (b"peek   99999\r\n", [NF]),
    (b"reserve-job x\r\n", [B]),
    (b"reserve-job 99999\r\n", [NF]),
    (b"delete\r\n", [U]),
    (b"delete \r\n", [B]),
    (b"delete 1 2\r\n", [B]),
    (b"delete 99999\r\n", [NF]),
    (b"release 1\r\n", [B]),
    (b"release 1 1\r\n", [B]),
    (b"release 1 1 1 1\r\n", [B]),
    (b"release 1 4294967296 0\r\n", [B]),
    (b"release 1 1 4294967296\r\n", [B]),
    (b"release 99999 4294967295 4294967295\r\n", [NF]),
    (b"bury 1\r\n", [B]),
    (b"bury 1 -1\r\n", [B]),
    (b"bury 99999 1\r\n", [NF]),
    (b"touch\r\n", [U]),
    (b"touch x\r\n", [B]),
    (b"touch 99999\r\n", [NF]),
    (b"kick-job\r\n", [U]),
    (b"kick-job x\r\n", [B]),
    (b"kick-job 99999\r\n", [NF]),
    (b"stats-job\r\n", [B]),
    (b"stats-job x\r\n", [B]),
    (b"stats-job 99999\r\n", [NF]),
    # kick's bound goes through strtoul: signs, trailing garbage and wrap-around pass
    (b"kick\r\n", [U]),
    (b"kick \r\n", [B]),
    (b"kick x\r\n", [B]),
    (b"kick 1x\r\n", [b"KICKED 0\r\n"]),
    (b"kick -1\r\n", [b"KICKED 0\r\n"]),
    (b"kick  +5\r\n", [b"KICKED 0\r\n"]),
    (b"kick 18446744073709551615\r\n", [b"KICKED 0\r\n"]),
    (b"kick 18446744073709551616\r\n", [B]),
    # reserve-with-timeout's through strtol
    (b"reserve-with-timeout 0\r\n", [b"TIMED_OUT\r\n"]),
    (b"reserve-with-timeout  -0\r\n", [b"TIMED_OUT\r\n"]),
    (b"reserve-with-timeout 0x\r\n", [b"TIMED_OUT\r\n"]),
    (b"reserve-with-timeout x\r\n", [b"TIMED_OUT\r\n"]),
    (b"reserve-with-timeout 99999999999999999999\r\n", [B]),
    (b"reserve-with-timeout\r\n", [B]),
    # commands without arguments take nothing after them
    (b"reserve \r\n", [B]),
    (b"reserve 0\r\n", [B]),
    (b"peek-ready \r\n", [B]),
    (b"peek-readyx\r\n", [B]),
    (b"peek-delayed 1\r\n", [B]),
    (b"peek-buried \r\n", [B]),
    (b"stats x\r\n", [B]),
    (b"list-tubes x\r\n", [B]),
    (b"list-tube-used \r\n", [B]),
    (b"list-tubes-watched x\r\n", [B]),
    (b"list-tubes-watchedx\r\n", [B]),
    # tube names: 1..200 name characters, not starting with '-'
    (b"use\r\n", [U]),
    (b"use \r\n", [B]),
    (b"use -a\r\n", [B]),
    (b"use a b\r\n", [B]),
    (b"use a!\r\n", [B]),
    (b"use a\x00b\r\n", [B]),
    (b"use a-+/;.$_()9\r\n", [b"USING a-+/;.$_()9\r\n"]),
    (b"use " + A200 + b"\r\n", [b"USING " + A200 + b"\r\n"]),
    (b"use " + A201 + b"\r\n", [B]),
    (b"watch " + A200 + b"\r\n", [b"WATCHING 2\r\n"]),
    (b"watch " + A201 + b"\r\n", [B]),
    (b"watch -x\r\n", [B]),
    (b"watch \r\n", [B]),
    (b"ignore default\r\n", [b"NOT_IGNORED\r\n"]),
    (b"ignore nosuch\r\n", [b"WATCHING 1\r\n"]),
    (b"ignore -x\r\n", [B]),
    (b"stats-tube\r\n", [B]),
    (b"stats-tube \r\n", [B]),
    (b"stats-tube -a\r\n", [B]),
    (b"stats-tube nosuch\r\n", [NF]),
    (b"stats-tube " + A201 + b"\r\n", [B]),
    # pause-tube: the name is read first, checked after the delay (and then counted)
    (b"pause-tube\r\n", [B]),
    (b"pause-tube default\r\n", [B]),
    (b"pause-tube default x\r\n", [B]),
    (b"pause-tube default 1 \r\n", [B]),
    (b"pause-tube default 4294967296\r\n", [B]),
    (b"pause-tube nosuch 1\r\n", [NF]),
    (b"pause-tube -x 1\r\n", [B]),
    (b"pause-tube " + A201 + b" 1\r\n", [B]),
    (b"pause-tubex 0\r\n", [NF]),
    # unknown commands
    (b"\r\n", [U]),
    (b"PUT 1 0 1 1\r\n", [U]),
    (b" put 1 0 1 1\r\n", [U]),
    (b"foo\r\n", [U]),
    (b"quix\r\n", [U]),
    (b"\x00\r\n", [B]),
    (b"stats\x00\r\n", [B]),
]


@pytest.mark.parametrize(("data", "expect"), LINES, ids=[repr(d)[2:42] for d, _ in LINES])
def test_line(shared: Diff, data: bytes, expect: list[bytes]) -> None:
    """One line (a put's with its body), then list-tube-used: the replies and what they
    count in stats' cmd-* lines match."""
    conv = shared.conv()
    try:
        before = _client_stats(conv.real), _client_stats(conv.ours)
        conv.send(data + b"list-tube-used\r\n")
        got = conv.recv_some(len(expect) + 1)  # one too many shows in the last place
        used = expect[0] if expect[0].startswith(b"USING") else b"USING default\r\n"
        assert got == [*expect, used]
        after = _client_stats(conv.real), _client_stats(conv.ours)
        counted = [{k: int(v) - int(was[k]) for k, v in _cmd_counts(now).items()}
                   for was, now in zip(before, after, strict=True)]
        assert counted[0] == counted[1], f"{data!r} counted {counted[0]} vs ours {counted[1]}"
    finally:
        conv.close()
