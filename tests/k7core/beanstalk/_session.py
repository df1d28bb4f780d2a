"""What the client tests share (not a test module): the servers, and one scripted session
that both clients run against each of them.

:func:`session` is written once, as a generator: it yields each call as a :class:`Step` (a
client method's name and arguments) and gets back what the call returned, or the
``K7Error`` it raised; it asserts as it goes. The blocking and the async tests drive it
through their client (:class:`Transcript` does the bookkeeping) and compare the transcripts
the two servers gave: job ids (ours are journal positions, beanstalkd's count from 1) are
named by order of appearance, and the stats values that differ between any two servers
(pid, uptime...) are left out.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from k7core import ClosedError, K7Error
from k7core.beanstalk import (
    BeanstalkError,
    Call,
    DeadlineSoonError,
    JobNotFoundError,
    JobTooBigError,
    NotIgnoredError,
    PeekedJob,
    RejectedCommandError,
    ReservedJob,
    TubeNotFoundError,
)
from tests.k7async.server._proc import ServerProcess

SERVERS = ["ours-tcp", "ours-unix", "real-tcp", "real-unix"]
"""Our server (``k7 serve``) and Debian's beanstalkd, each over TCP and a Unix socket."""

VARYING = frozenset({"pid", "id", "hostname", "os", "platform", "version", "uptime",
                     "rusage-utime", "rusage-stime", "total-connections",
                     "current-connections", "age", "time-left", "pause-time-left"})
"""Stats keys whose values differ between two servers, with ``binlog-*`` (a job's ``id`` is
named instead)."""

LONG = 3600
"""A time-to-run or delay no test waits for: a job back to ready before it came back for
another reason."""


@contextmanager
def server(kind: str, tmp: Path) -> Iterator[tuple[ServerProcess, str]]:
    """A server of ``kind`` (one of :data:`SERVERS`), and its address as the clients take
    it (``HOST:PORT`` or ``unix:PATH``)."""
    which, transport = kind.split("-")
    tcp = ("127.0.0.1:0", "-l", "127.0.0.1", "-p", "0")
    unix = (f"unix:{tmp / 'b.sock'}", "-l", f"unix:{tmp / 'b.sock'}")
    listen, *flags = tcp if transport == "tcp" else unix
    if which == "ours":
        proc = ServerProcess.serve(tmp / "jobs", listen=listen)
    else:
        proc = ServerProcess.real_beanstalkd(*flags)
    with proc:
        where = proc.address
        yield proc, f"unix:{where}" if isinstance(where, str) else f"{where[0]}:{where[1]}"


class Step(NamedTuple):
    """A client method's name and its arguments."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def do(method: str, *args: Any, **kwargs: Any) -> Step:
    return Step(method, args, kwargs)


Session = Generator[Step, object, None]


class Transcript:
    """Steps a session and notes what each step gave, with ids named and varying stats left
    out. ``step`` is the next call to make (None once the session ended); :meth:`give` hands
    it what the call returned or raised."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lines: list[tuple[str, object]] = []
        self._names: dict[int, str] = {}
        self.step: Step | None = next(session)

    def give(self, result: object) -> None:
        assert self.step is not None
        self.lines.append((self.step.method, self._note(self.step.method, result)))
        try:
            self.step = self.session.send(result)
        except StopIteration:
            self.step = None

    def _name(self, job_id: int) -> str:
        return self._names.setdefault(job_id, f"job{len(self._names) + 1}")

    def _note(self, method: str, result: object) -> object:
        if isinstance(result, ReservedJob | PeekedJob):
            return type(result).__name__, self._name(result.id), result.body
        if isinstance(result, K7Error):
            job_id = getattr(result, "job_id", None)
            reply = getattr(result, "reply", None)
            return type(result).__name__, reply, job_id and self._name(job_id)
        if isinstance(result, dict):
            kept = {k: v for k, v in result.items()
                    if k not in VARYING and not k.startswith("binlog-")}
            return {**kept, "id": self._name(result["id"])} if method == "stats_job" else kept
        if method == "put" and isinstance(result, int):
            return self._name(result)
        return result


def _job(got: object) -> ReservedJob:
    assert isinstance(got, ReservedJob), got
    return got


def _stats(got: object) -> dict[str, int | float | str]:
    assert isinstance(got, dict), got
    return got


def _raised(got: object, kind: type[K7Error], job_id: int | None = None) -> None:
    assert type(got) is kind, got
    assert job_id is None or getattr(got, "job_id", None) == job_id


def session() -> Session:
    """A conversation with every command and the failure replies a well-formed client can
    get, on one connection."""
    assert (yield do("list_tube_used")) == "default"
    assert (yield do("list_tubes_watched")) == ["default"]
    assert (yield do("use", "emails")) == "emails"
    assert (yield do("watch", "emails")) == 2
    assert (yield do("ignore", "default")) == 1
    _raised((yield do("ignore", "emails")), NotIgnoredError)
    assert (yield do("list_tubes_watched")) == ["emails"]

    a = yield do("put", b"first", priority=10)
    b = yield do("put", b"second\r\n\0", priority=5)
    d = yield do("put", b"later", delay=LONG)
    assert isinstance(a, int) and isinstance(b, int) and isinstance(d, int)
    assert len({a, b, d}) == 3
    assert (yield do("peek", a)) == PeekedJob(a, b"first")
    assert (yield do("peek_ready")) == PeekedJob(b, b"second\r\n\0")  # the most urgent
    assert (yield do("peek_delayed")) == PeekedJob(d, b"later")
    assert (yield do("peek_buried")) is None

    assert (yield do("reserve", timeout=0)) == ReservedJob(b, b"second\r\n\0")
    assert (yield do("touch", b)) is None
    stats = _stats((yield do("stats_job", b)))
    assert (stats["id"], stats["tube"], stats["state"], stats["pri"], stats["reserves"]) == (
        b, "emails", "reserved", 5, 1)
    assert (yield do("release", b, priority=20, delay=LONG)) is None
    stats = _stats((yield do("stats_job", b)))
    assert (stats["state"], stats["pri"], stats["delay"], stats["releases"]) == (
        "delayed", 20, LONG, 1)

    assert (yield do("reserve", timeout=0)) == ReservedJob(a, b"first")
    assert (yield do("bury", a, priority=7)) is None
    assert (yield do("peek_buried")) == PeekedJob(a, b"first")
    stats = _stats((yield do("stats_tube", "emails")))
    assert (stats["name"], stats["current-jobs-buried"], stats["current-jobs-delayed"],
            stats["current-jobs-ready"]) == ("emails", 1, 2, 0)
    assert (yield do("kick", 10)) == 1  # the buried ones first
    assert _stats((yield do("stats_job", a)))["kicks"] == 1
    assert (yield do("kick_job", b)) is None  # delayed -> ready
    assert _stats((yield do("stats_job", b)))["state"] == "ready"
    _raised((yield do("kick_job", b)), JobNotFoundError, b)  # ready: nothing to kick

    # reserve-job takes a delayed or a buried job too (beanstalkd 1.12 and ours)
    assert _job((yield do("reserve_job", d))) == ReservedJob(d, b"later")
    assert _stats((yield do("stats_job", d)))["state"] == "reserved"
    _raised((yield do("reserve_job", d)), JobNotFoundError, d)  # reserved already
    assert (yield do("bury", d)) is None
    assert _job((yield do("reserve_job", d))).id == d
    assert (yield do("delete", d)) is None
    for method in ("reserve_job", "delete", "touch", "release", "bury", "kick_job",
                   "stats_job"):
        _raised((yield do(method, d)), JobNotFoundError, d)
    assert (yield do("peek", d)) is None

    _raised((yield do("stats_tube", "nowhere")), TubeNotFoundError)
    _raised((yield do("pause_tube", "nowhere", 1)), TubeNotFoundError)
    assert (yield do("pause_tube", "emails", LONG)) is None
    assert _stats((yield do("stats_tube", "emails")))["pause"] == LONG
    assert (yield do("reserve", timeout=0)) is None  # two ready jobs, but paused
    assert _job((yield do("reserve_job", a))).id == a  # reserve-job takes it all the same
    assert (yield do("release", a, priority=7)) is None
    tubes = yield do("list_tubes")
    assert isinstance(tubes, list) and sorted(tubes) == ["default", "emails"]

    assert (yield do("use", "other")) == "other"
    assert (yield do("watch", "other")) == 2
    assert (yield do("ignore", "emails")) == 1
    assert _job((yield do("reserve_job", b))).id == b  # from a tube no longer watched too
    assert (yield do("release", b, priority=20)) is None
    c = yield do("put", b"other job", ttr=1)
    assert isinstance(c, int)
    assert _job((yield do("reserve", timeout=0))).id == c
    # its time-to-run ends within the second: a reserve gets DEADLINE_SOON at once
    _raised((yield do("reserve", timeout=10)), DeadlineSoonError)
    assert (yield do("delete", c)) is None
    _raised((yield do("put", b"x" * 65536)), JobTooBigError)  # the default -z is 65535

    stats = _stats((yield do("stats")))
    assert (stats["current-jobs-ready"], stats["current-jobs-delayed"], stats["total-jobs"],
            stats["cmd-put"], stats["current-tubes"], stats["draining"]) == (2, 0, 4, 5, 3,
                                                                              "false")
    for raw in (b"frobnicate\r\n", b"use -x\r\n", b"put 1 0 1 1\r\nabc"):
        got = yield do("call", Call(raw, {}))
        _raised(got, RejectedCommandError)
        assert isinstance(got, BeanstalkError)
    assert (yield do("quit")) is None
    _raised((yield do("stats")), ClosedError)
