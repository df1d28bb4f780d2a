"""The client's commands, sans-I/O: one function per beanstalkd 1.12 command, each giving a
:class:`Call`, the request's bytes and what each reply to it means.

    call = calls.put(b"hello", priority=10)
    sock.sendall(call.request)
    ...                                      # feed what comes back to a ReplyParser
    job_id = call.result(reply)              # an int, or a BeanstalkError

Both clients (``k7core.beanstalk.Client``, ``k7async.beanstalk.AsyncClient``) send a call,
read one reply and hand it to :meth:`Call.result`: the checks, the requests and the replies'
meanings are written once, here. Arguments are checked before anything is sent
(:class:`k7core.jobs.InvalidJobError`, as the in-process job store raises).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeAlias, TypeVar

from ..jobs import InvalidJobError
from ._errors import (
    BeanstalkError,
    DeadlineSoonError,
    DrainingError,
    JobBuriedError,
    JobNotFoundError,
    JobTooBigError,
    NotIgnoredError,
    RejectedCommandError,
    ServerError,
    TubeNotFoundError,
)
from .protocol import MAX_JOB_SIZE_LIMIT, NAME_CHARS, NAME_MAX, Op, ProtocolError, Reply, command
from .protocol import put_command as _put_command

T = TypeVar("T", covariant=True)

DEFAULT_PRIORITY = 1024
"""A put's, release's and bury's priority unless given (0 is the most urgent; below 1024
counts as urgent in ``stats``)."""
DEFAULT_TTR = 60
"""A put's time-to-run in seconds unless given."""
MAX_U32 = (1 << 32) - 1
"""The largest priority, delay, time-to-run, pause and kick bound."""
MAX_TIMEOUT = (1 << 31) - 1
"""The longest reserve-with-timeout, in seconds (beanstalkd reads it as a C int)."""
MAX_JOB_ID = (1 << 64) - 1
"""The largest job id the protocol carries."""

Stats: TypeAlias = dict[str, int | float | str]
"""A stats document: numbers as int or float, the rest (names, states, ``draining``) as str."""


class ReservedJob(NamedTuple):
    """A job this connection reserved: delete, release, bury or touch it by ``id``."""

    id: int
    body: bytes


class PeekedJob(NamedTuple):
    """A job as peek shows it (not reserved by the peek)."""

    id: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One command: ``request`` to send, then :meth:`result` of its one reply.

    ``outcomes`` maps the reply words that mean success to their value; any other reply is a
    :class:`BeanstalkError` (or a :class:`ProtocolError` when it is no reply to this command).
    ``wait`` is how long the server may hold the reply on purpose, in seconds (a
    reserve-with-timeout's; None: a reserve, until a job comes). ``job_id`` and ``tube`` say
    what a ``NOT_FOUND`` is about."""

    request: bytes
    outcomes: Mapping[str, Callable[[Reply], T]]
    wait: int | None = 0
    job_id: int | None = None
    tube: str | None = None

    @property
    def command(self) -> str:
        """The request's command line, without a put's body (for messages)."""
        return self.request.split(b"\r\n", 1)[0].decode("ascii")

    def result(self, reply: Reply) -> T:
        """What ``reply`` means: the command's value, or its error raised."""
        convert = self.outcomes.get(reply.word)
        try:
            if convert is not None:
                return convert(reply)
            error = self._failure(reply)
        except (IndexError, ValueError) as e:
            raise _unexpected(self, reply) from e
        raise error

    def reply_limit(self, timeout: float | None) -> float | None:
        """How long to wait for the reply when the network may take ``timeout`` seconds: the
        server's own ``wait`` plus ``timeout``; None: no limit."""
        if timeout is None or self.wait is None:
            return None
        return self.wait + timeout

    def _failure(self, reply: Reply) -> Exception:
        where = {"reply": reply.word, "command": self.command}
        if reply.word == "NOT_FOUND" and self.job_id is not None:
            return JobNotFoundError(
                "no such job, or another connection reserved it, or it is not in a state this "
                "command takes", job_id=self.job_id, **where,
                hint="peek or stats-job it to see where it is")
        if reply.word == "NOT_FOUND" and self.tube is not None:
            return TubeNotFoundError(f"the server has no tube {self.tube!r}", **where,
                                     hint="a tube exists while it has jobs or users")
        if reply.word == "BURIED" and self.command.startswith(("put ", "release ")):
            job_id = self.job_id if self.job_id is not None else _int(reply)
            return JobBuriedError("the server is out of memory: it buried the job",
                                  job_id=job_id, **where, hint="kick it later")
        known = _FAILURES.get(reply.word)
        if known is None:
            return _unexpected(self, reply)
        kind, message, hint = known
        return kind(message, **where, hint=hint)


_FAILURES: dict[str, tuple[type[BeanstalkError], str, str]] = {
    "JOB_TOO_BIG": (JobTooBigError, "the body is larger than the server's max-job-size",
                    "send a smaller body, or start the server with a larger -z"),
    "DRAINING": (DrainingError, "the server is in drain mode: it takes no new job",
                 "put it on another server"),
    "DEADLINE_SOON": (DeadlineSoonError, "a job this connection reserved has less than a "
                      "second of its time-to-run left",
                      "delete, release, bury or touch it, then reserve again"),
    "NOT_IGNORED": (NotIgnoredError, "it is the last tube this connection watches",
                    "watch another tube first"),
    "OUT_OF_MEMORY": (ServerError, "the server is out of memory", "retry later"),
    "INTERNAL_ERROR": (ServerError, "the server failed", "retry later; see the server's log"),
    "BAD_FORMAT": (RejectedCommandError, "the server could not parse the command",
                   "a client bug, or the server is not beanstalkd 1.12"),
    "UNKNOWN_COMMAND": (RejectedCommandError, "the server does not know the command",
                        "the server is not beanstalkd 1.12 (or older than it)"),
    "EXPECTED_CRLF": (RejectedCommandError, "the body did not end where its size said",
                      "a client bug: the size must count the body's bytes"),
}


def _unexpected(call: Call[object], reply: Reply) -> ProtocolError:
    line = " ".join((reply.word, *reply.args))
    return ProtocolError(f"{call.command}: {line!r} is no reply to this command",
                         hint="the connection lost its place, or the server is not "
                         "beanstalkd: close the connection (the clients do)")


# --- what the replies carry --------------------------------------------------------------


def _arg(reply: Reply) -> str:
    """The reply's one argument (``INSERTED 5``, ``USING emails``)."""
    if len(reply.args) != 1:
        raise ValueError(f"{reply.word} takes one argument")
    return reply.args[0]


def _int(reply: Reply) -> int:
    return int(_arg(reply))


def _none(reply: Reply) -> None:
    if reply.args:
        raise ValueError(f"{reply.word} takes no argument")


def _job(reply: Reply) -> tuple[int, bytes]:
    if len(reply.args) != 2 or reply.body is None:
        raise ValueError(f"{reply.word} takes an id, a size and a body")
    return int(reply.args[0]), reply.body


def _reserved(reply: Reply) -> ReservedJob:
    return ReservedJob(*_job(reply))


def _peeked(reply: Reply) -> PeekedJob:
    return PeekedJob(*_job(reply))


def _document(reply: Reply) -> list[str]:
    """The lines of an ``OK`` reply's YAML document."""
    if len(reply.args) != 1 or reply.body is None or not reply.body.startswith(b"---\n"):
        raise ValueError("OK takes a size and a YAML document")
    return reply.body[4:].decode("utf-8", "replace").splitlines()


def _unquote(value: str) -> str:
    """beanstalkd 1.13 quotes text values (``"default"``); 1.12 some (``version``)."""
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")


def _stats(text: frozenset[str]) -> Callable[[Reply], Stats]:
    """A stats document's reader: ``key: value`` lines; the keys in ``text`` stay str (tube
    names may look like numbers), the other values that look like numbers become numbers."""

    def read(reply: Reply) -> Stats:
        out: Stats = {}
        for line in _document(reply):
            key, sep, value = line.partition(": ")
            if not sep:
                raise ValueError(f"{line!r} is not a 'key: value' line")
            value = _unquote(value)
            if key in text:
                out[key] = value
            elif _INT.fullmatch(value):
                out[key] = int(value)
            elif _FLOAT.fullmatch(value):
                out[key] = float(value)
            else:
                out[key] = value
        return out

    return read


def _names(reply: Reply) -> list[str]:
    """A list-tubes document: ``- name`` lines."""
    lines = _document(reply)
    if not all(line.startswith("- ") for line in lines):
        raise ValueError("a list document has '- name' lines")
    return [_unquote(line[2:]) for line in lines]


_JOB_STATS = _stats(frozenset({"tube", "state"}))
_TUBE_STATS = _stats(frozenset({"name"}))
_SERVER_STATS = _stats(frozenset({"version", "id", "hostname", "os", "platform", "draining"}))
_FOUND: Mapping[str, Callable[[Reply], PeekedJob | None]] = {
    "FOUND": _peeked, "NOT_FOUND": _none}
_RESERVED: Mapping[str, Callable[[Reply], ReservedJob | None]] = {
    "RESERVED": _reserved, "TIMED_OUT": _none}


# --- the checks --------------------------------------------------------------------------


def _check_int(value: object, what: str, maximum: int) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise InvalidJobError(f"{what} {value!r} is not valid",
                              hint=f"use an int, 0 .. {maximum}")
    return value


def _check_tube(tube: object) -> str:
    if (type(tube) is not str or not tube.isascii() or not 0 < len(tube) <= NAME_MAX
            or tube[0] == "-" or not NAME_CHARS.issuperset(tube.encode())):
        raise InvalidJobError(
            f"tube name {tube!r} is not valid",
            hint=f"use 1 to {NAME_MAX} of A-Z a-z 0-9 - + / ; . $ _ ( ), not starting with '-'")
    return tube


def _check_body(body: object) -> bytes:
    if type(body) is not bytes:
        raise InvalidJobError(f"a job's body is bytes, not {type(body).__name__}",
                              hint="encode text first: text.encode()")
    if len(body) > MAX_JOB_SIZE_LIMIT:
        raise InvalidJobError(f"a body of {len(body)} bytes is larger than any beanstalkd "
                              f"takes ({MAX_JOB_SIZE_LIMIT})", hint="store it elsewhere and "
                              "put its name")
    return body


def _check_id(job_id: object) -> int:
    return _check_int(job_id, "job id", MAX_JOB_ID)


def _on_job(op: Op, job_id: int, *args: int, outcomes: Mapping[str, Callable[[Reply], T]]
            ) -> Call[T]:
    job_id = _check_id(job_id)
    return Call(command(op, job_id, *args), outcomes, job_id=job_id)


# --- the commands ------------------------------------------------------------------------


def put(body: bytes, *, priority: int = DEFAULT_PRIORITY, delay: int = 0,
        ttr: int = DEFAULT_TTR) -> Call[int]:
    """put: a new job in the used tube; its id. ``delay`` seconds before it is ready,
    ``ttr`` seconds to run once reserved (0 counts as 1)."""
    request = _put_command(_check_body(body), _check_int(priority, "priority", MAX_U32),
                           _check_int(delay, "delay", MAX_U32), _check_int(ttr, "ttr", MAX_U32))
    return Call(request, {"INSERTED": _int})


def use(tube: str) -> Call[str]:
    """use: put new jobs in ``tube``; the tube's name."""
    return Call(command(Op.USE, _check_tube(tube)), {"USING": _arg})


def reserve() -> Call[ReservedJob | None]:
    """reserve: the next ready job of the watched tubes, waiting as long as it takes (None
    only when the server times the wait out: a half-closed connection)."""
    return Call(command(Op.RESERVE), _RESERVED, wait=None)


def reserve_with_timeout(seconds: int) -> Call[ReservedJob | None]:
    """reserve-with-timeout: the next ready job, or None when none came within ``seconds``
    (0: only one that is ready now)."""
    seconds = _check_int(seconds, "reserve timeout", MAX_TIMEOUT)
    return Call(command(Op.RESERVE_WITH_TIMEOUT, seconds), _RESERVED, wait=seconds)


def reserve_job(job_id: int) -> Call[ReservedJob]:
    """reserve-job: reserve this job, whatever its tube, if no one has it reserved."""
    return _on_job(Op.RESERVE_JOB, job_id, outcomes={"RESERVED": _reserved})


def delete(job_id: int) -> Call[None]:
    """delete: remove the job (ready, delayed, buried, or reserved by this connection)."""
    return _on_job(Op.DELETE, job_id, outcomes={"DELETED": _none})


def release(job_id: int, *, priority: int = DEFAULT_PRIORITY, delay: int = 0) -> Call[None]:
    """release: give back a job this connection reserved, ready again after ``delay``
    seconds."""
    return _on_job(Op.RELEASE, job_id, _check_int(priority, "priority", MAX_U32),
                   _check_int(delay, "delay", MAX_U32), outcomes={"RELEASED": _none})


def bury(job_id: int, *, priority: int = DEFAULT_PRIORITY) -> Call[None]:
    """bury: put a job this connection reserved aside until a kick."""
    return _on_job(Op.BURY, job_id, _check_int(priority, "priority", MAX_U32),
                   outcomes={"BURIED": _none})


def touch(job_id: int) -> Call[None]:
    """touch: restart the time-to-run of a job this connection reserved."""
    return _on_job(Op.TOUCH, job_id, outcomes={"TOUCHED": _none})


def watch(tube: str) -> Call[int]:
    """watch: reserve from ``tube`` too; how many tubes are watched."""
    return Call(command(Op.WATCH, _check_tube(tube)), {"WATCHING": _int})


def ignore(tube: str) -> Call[int]:
    """ignore: stop reserving from ``tube``; how many tubes are still watched."""
    return Call(command(Op.IGNORE, _check_tube(tube)), {"WATCHING": _int})


def peek(job_id: int) -> Call[PeekedJob | None]:
    """peek: the job with this id, in any tube and state; None when there is none."""
    return Call(command(Op.PEEK, _check_id(job_id)), _FOUND)


def peek_ready() -> Call[PeekedJob | None]:
    """peek-ready: the next job a reserve of the used tube would get; None when none."""
    return Call(command(Op.PEEK_READY), _FOUND)


def peek_delayed() -> Call[PeekedJob | None]:
    """peek-delayed: the used tube's delayed job that is ready soonest; None when none."""
    return Call(command(Op.PEEK_DELAYED), _FOUND)


def peek_buried() -> Call[PeekedJob | None]:
    """peek-buried: the used tube's oldest buried job; None when none."""
    return Call(command(Op.PEEK_BURIED), _FOUND)


def kick(bound: int) -> Call[int]:
    """kick: up to ``bound`` jobs of the used tube to ready, the buried ones if there are
    any, else the delayed ones; how many moved."""
    return Call(command(Op.KICK, _check_int(bound, "kick bound", MAX_U32)), {"KICKED": _int})


def kick_job(job_id: int) -> Call[None]:
    """kick-job: this buried or delayed job to ready."""
    return _on_job(Op.KICK_JOB, job_id, outcomes={"KICKED": _none})


def stats_job(job_id: int) -> Call[Stats]:
    """stats-job: the job's figures (``state``, ``pri``, ``time-left``, ``reserves``...)."""
    return _on_job(Op.STATS_JOB, job_id, outcomes={"OK": _JOB_STATS})


def stats_tube(tube: str) -> Call[Stats]:
    """stats-tube: the tube's figures (``current-jobs-ready``, ``pause``...)."""
    tube = _check_tube(tube)
    return Call(command(Op.STATS_TUBE, tube), {"OK": _TUBE_STATS}, tube=tube)


def stats() -> Call[Stats]:
    """stats: the server's figures (``current-jobs-ready``, ``version``, ``draining``...)."""
    return Call(command(Op.STATS), {"OK": _SERVER_STATS})


def list_tubes() -> Call[list[str]]:
    """list-tubes: every tube's name."""
    return Call(command(Op.LIST_TUBES), {"OK": _names})


def list_tube_used() -> Call[str]:
    """list-tube-used: the used tube's name."""
    return Call(command(Op.LIST_TUBE_USED), {"USING": _arg})


def list_tubes_watched() -> Call[list[str]]:
    """list-tubes-watched: the watched tubes' names."""
    return Call(command(Op.LIST_TUBES_WATCHED), {"OK": _names})


def pause_tube(tube: str, delay: int) -> Call[None]:
    """pause-tube: no reserve gets a job of ``tube`` for ``delay`` seconds (0: 1 second)."""
    tube = _check_tube(tube)
    request = command(Op.PAUSE_TUBE, tube, _check_int(delay, "pause", MAX_U32))
    return Call(request, {"PAUSED": _none}, tube=tube)


def quit() -> bytes:
    """quit's request. It has no reply: the server closes the connection (and puts the jobs
    it reserved back to ready)."""
    return command(Op.QUIT)


__all__ = [
    "DEFAULT_PRIORITY", "DEFAULT_TTR", "MAX_JOB_ID", "MAX_TIMEOUT", "MAX_U32", "Call",
    "PeekedJob", "ReservedJob", "Stats", "bury", "delete", "ignore", "kick", "kick_job",
    "list_tube_used", "list_tubes", "list_tubes_watched", "pause_tube", "peek", "peek_buried",
    "peek_delayed", "peek_ready", "put", "quit", "release", "reserve", "reserve_job",
    "reserve_with_timeout", "stats", "stats_job", "stats_tube", "touch", "use", "watch",
]
