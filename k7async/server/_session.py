"""What a connection does to the job store: a :class:`Session` per connection runs its
requests (on the store's owner thread) and :class:`ServerState` holds what beanstalkd counts
across connections (commands, connections, drain mode) and builds ``stats``.

Synchronous and free of I/O: the event loop side (``_server``) moves bytes and waits.
"""

from __future__ import annotations

import logging
import os
import resource
import secrets
import time
from collections.abc import Callable
from typing import Any

from k7core import K7Error
from k7core.beanstalk import VERSION, Op, Request
from k7core.beanstalk import protocol as wire
from k7core.jobs import CLOCK_RECHECK, Job, JobNotFoundError, JobOwner, JobStore

log = logging.getLogger("k7async.server")

DEADLINE_MARGIN = 1.0
"""beanstalkd's safety margin: a reserve gets DEADLINE_SOON while one of the connection's
reservations has less than this many seconds left."""

_STATS_COMMANDS = (Op.PUT, Op.PEEK, Op.PEEK_READY, Op.PEEK_DELAYED, Op.PEEK_BURIED,
                   Op.RESERVE, Op.RESERVE_WITH_TIMEOUT, Op.DELETE, Op.RELEASE, Op.USE,
                   Op.WATCH, Op.IGNORE, Op.BURY, Op.KICK, Op.TOUCH, Op.STATS, Op.STATS_JOB,
                   Op.STATS_TUBE, Op.LIST_TUBES, Op.LIST_TUBE_USED, Op.LIST_TUBES_WATCHED,
                   Op.PAUSE_TUBE)
"""The cmd-* lines of ``stats``, in STATS_FMT's order (reserve-job and kick-job are counted
but, as in beanstalkd, not shown)."""


INPUT_LIMIT = 1 << 20
"""Bytes of a connection's input read ahead of its answers (more when ``max_job_size``
needs it: a put's whole body is read before it runs). While that much is unparsed, the
server reads no more from the connection, as beanstalkd stops reading a connection it is
answering: a client that keeps sending behind a reserve that waits, or without reading its
replies, does not grow the server."""
OUTPUT_CHUNK = 256 << 10
"""Reply bytes one run makes at most; the requests after wait until the connection has
sent them (a client that pipelines large peeks and does not read them is answered as far as
its socket takes, not at once)."""


class Quit:
    """A run ended at a quit: close once the replies are sent."""


QUIT = Quit()


class Blocked:
    """A reserve that found no job: the connection waits (``timeout`` seconds, < 0 without
    limit) in the event loop, then goes on with the requests after it."""

    __slots__ = ("timeout",)

    def __init__(self, timeout: int) -> None:
        self.timeout = timeout


class ServerState:
    """Counts and settings shared by every connection of one server."""

    def __init__(self, store: JobStore, max_job_size: int, journal_segment: int) -> None:
        self.store = store
        self.max_job_size = max_job_size
        self.input_limit = max(INPUT_LIMIT, max_job_size + wire.LINE_MAX + 2)
        """Unparsed input bytes past which a connection is not read (INPUT_LIMIT)."""
        self.journal_segment = journal_segment
        self.draining = False
        self.commands = [0] * (max(Op) + 1)  # by Op; written by the owner thread only
        self.sessions: set[Session] = set()  # open connections
        self.total_connections = 0
        self.started = time.monotonic()
        self.instance = secrets.token_hex(8)
        self.uname = os.uname()

    def stats(self) -> dict[str, object]:
        """The ``stats`` document's fields, in beanstalkd 1.12's order."""
        jobs = self.store.stats()
        sessions = list(self.sessions)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out: dict[str, object] = {k: jobs[k] for k in (
            "current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
            "current-jobs-delayed", "current-jobs-buried")}
        for op in _STATS_COMMANDS:
            out[f"cmd-{op.word}"] = self.commands[op]
        out["job-timeouts"] = jobs["job-timeouts"]
        out["total-jobs"] = jobs["total-jobs"]
        out["max-job-size"] = self.max_job_size
        out["current-tubes"] = jobs["current-tubes"]
        out["current-connections"] = len(sessions)
        out["current-producers"] = sum(s.producer for s in sessions)
        out["current-workers"] = sum(s.worker for s in sessions)
        out["current-waiting"] = sum(s.waiting for s in sessions)
        out["total-connections"] = self.total_connections
        out["pid"] = os.getpid()
        out["version"] = f'"{VERSION}"'
        out["rusage-utime"] = _seconds(usage.ru_utime)
        out["rusage-stime"] = _seconds(usage.ru_stime)
        out["uptime"] = int(time.monotonic() - self.started)
        out["binlog-oldest-index"] = 0
        out["binlog-current-index"] = 0
        out["binlog-records-migrated"] = 0
        out["binlog-records-written"] = 0
        out["binlog-max-size"] = self.journal_segment
        out["draining"] = "true" if self.draining else "false"
        out["id"] = self.instance
        out["hostname"] = self.uname.nodename
        out["os"] = self.uname.version
        out["platform"] = self.uname.machine
        return out

    def tube_stats(self, tube: str) -> dict[str, int | str]:
        stats = self.store.tube_stats(tube)
        sessions = list(self.sessions)
        stats["current-using"] = sum(s.use == tube for s in sessions)
        stats["current-watching"] = sum(tube in s.watch for s in sessions)
        stats["current-waiting"] = sum(s.waiting and tube in s.watch for s in sessions)
        return stats


def _seconds(value: float) -> str:
    micros = int(value * 1e6)
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


class Session:
    """One connection: the tube it uses, the tubes it watches (beanstalkd's order: an
    ignored tube's place goes to the last one), its reservations (a :class:`JobOwner`).

    :meth:`run` is called one connection at a time: on the store's owner thread (under
    ``"sync"``, and on the streams path), or in the event loop (asyncio protocols, not
    ``"sync"``); the event loop touches a session only while no run of it is under way.
    """

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.store = state.store
        self.owner: JobOwner = self.store.owner()
        self.use = "default"
        self.watch: list[str] = ["default"]
        self.producer = False
        self.worker = False
        self.waiting = False
        self.closed = False
        self.store.ref_tube("default")  # used
        self.store.ref_tube("default")  # watched
        self._handlers: dict[Op, Callable[[Request], bytes | Blocked]] = {
            Op.PUT: self._put, Op.PEEK: self._peek, Op.PEEK_READY: self._peek_ready,
            Op.PEEK_DELAYED: self._peek_delayed, Op.PEEK_BURIED: self._peek_buried,
            Op.RESERVE: self._reserve, Op.RESERVE_WITH_TIMEOUT: self._reserve,
            Op.RESERVE_JOB: self._reserve_job, Op.DELETE: self._delete,
            Op.RELEASE: self._release, Op.BURY: self._bury, Op.KICK: self._kick,
            Op.KICK_JOB: self._kick_job, Op.TOUCH: self._touch, Op.STATS: self._stats,
            Op.STATS_JOB: self._stats_job, Op.STATS_TUBE: self._stats_tube,
            Op.LIST_TUBES: self._list_tubes, Op.LIST_TUBE_USED: self._list_tube_used,
            Op.LIST_TUBES_WATCHED: self._list_tubes_watched, Op.USE: self._use,
            Op.WATCH: self._watch, Op.IGNORE: self._ignore, Op.PAUSE_TUBE: self._pause_tube,
        }

    def run(self, requests: list[Request], start: int, limit: int = OUTPUT_CHUNK
            ) -> tuple[bytes, int, Blocked | Quit | None]:
        """Answer ``requests[start:]`` in order, up to a reserve that has to wait, a quit,
        or ``limit`` bytes of replies. Returns the replies, the index of the first request
        not answered, and why it stopped: a :class:`Blocked` wait, QUIT, or None (all
        answered, or the limit: run again from that index once the replies are sent)."""
        out: list[bytes] = []
        size = 0
        commands = self.state.commands
        handlers = self._handlers
        i = start
        n = len(requests)
        while i < n:
            request = requests[i]
            op = request.op
            if request.counted:
                commands[op] += 1
            if request.reply:
                if op is Op.PUT and request.reply is wire.EXPECTED_CRLF:
                    self.producer = True
                out.append(request.reply)
            elif op is Op.QUIT:
                return b"".join(out), i, QUIT
            else:
                try:
                    reply = handlers[op](request)
                except JobNotFoundError:
                    reply = wire.NOT_FOUND
                except K7Error as exc:
                    log.error("%s failed: %s", op.word, exc)
                    reply = wire.INTERNAL_ERROR
                if type(reply) is Blocked:
                    return b"".join(out), i, reply
                assert isinstance(reply, bytes)
                out.append(reply)
                size += len(reply)
                if size >= limit:
                    return b"".join(out), i + 1, None
            i += 1
        return b"".join(out), i, None

    # --- the commands ----------------------------------------------------------------------

    def _put(self, r: Request) -> bytes:
        self.producer = True
        if self.state.draining:
            return wire.DRAINING
        return wire.inserted(self.store.put(r.body, tube=self.use, priority=r.priority,
                                            delay=r.delay, ttr=r.ttr))

    def _found(self, job: Job | None) -> bytes:
        return wire.NOT_FOUND if job is None else wire.found(job.id, job.body)

    def _peek(self, r: Request) -> bytes:
        return self._found(self.store.peek(r.job_id))

    def _peek_ready(self, r: Request) -> bytes:
        return self._found(self.store.peek_ready(self.use))

    def _peek_delayed(self, r: Request) -> bytes:
        return self._found(self.store.peek_delayed(self.use))

    def _peek_buried(self, r: Request) -> bytes:
        return self._found(self.store.peek_buried(self.use))

    def _reserve(self, r: Request) -> bytes | Blocked:
        self.worker = True
        reply = self.try_reserve()
        if reply is not None:
            return reply
        if r.timeout == 0:
            return wire.TIMED_OUT
        return Blocked(r.timeout)

    def try_reserve(self) -> bytes | None:
        """A reserve's answer now (RESERVED, or DEADLINE_SOON when one of this connection's
        reservations is about to run out), or None: wait."""
        job = self.owner.reserve(self.watch, timeout=0)
        if job is not None:
            return wire.reserved(job.id, job.body)
        left = self.owner.time_left()
        if left is not None and left <= DEADLINE_MARGIN:
            return wire.DEADLINE_SOON
        return None

    def wake_in(self) -> float | None:
        """Seconds until a waiting reserve of this connection must look again whether to
        answer DEADLINE_SOON: when that is due, or after CLOCK_RECHECK (the store's clock
        may jump meanwhile)."""
        left = self.owner.time_left()
        return None if left is None else min(max(left - DEADLINE_MARGIN, 0.0), CLOCK_RECHECK)

    def _reserve_job(self, r: Request) -> bytes:
        job = self.owner.reserve_job(r.job_id)
        self.worker = True
        return wire.reserved(job.id, job.body)

    def _delete(self, r: Request) -> bytes:
        self.owner.delete(r.job_id)
        return wire.DELETED

    def _release(self, r: Request) -> bytes:
        self.owner.release(r.job_id, priority=r.priority, delay=r.delay)
        return wire.RELEASED

    def _bury(self, r: Request) -> bytes:
        self.owner.bury(r.job_id, priority=r.priority)
        return wire.BURIED

    def _kick(self, r: Request) -> bytes:
        return wire.kicked(self.store.kick(self.use, r.bound))

    def _kick_job(self, r: Request) -> bytes:
        self.store.kick_job(r.job_id)
        return wire.KICKED

    def _touch(self, r: Request) -> bytes:
        self.owner.touch(r.job_id)
        return wire.TOUCHED

    def _stats(self, r: Request) -> bytes:
        return wire.ok(wire.yaml_map(self.state.stats()))

    def _stats_job(self, r: Request) -> bytes:
        stats: dict[str, Any] = dict(self.store.job_stats(r.job_id))
        if stats["state"] == "waiting":  # not a beanstalkd state: its clients see it held
            stats["state"] = "buried"
        return wire.ok(wire.yaml_map(stats))

    def _stats_tube(self, r: Request) -> bytes:
        if not self.store.has_tube(r.name):
            return wire.NOT_FOUND
        return wire.ok(wire.yaml_map(self.state.tube_stats(r.name)))

    def _list_tubes(self, r: Request) -> bytes:
        return wire.ok(wire.yaml_list(self.store.tubes()))

    def _list_tube_used(self, r: Request) -> bytes:
        return wire.using(self.use)

    def _list_tubes_watched(self, r: Request) -> bytes:
        return wire.ok(wire.yaml_list(self.watch))

    def _use(self, r: Request) -> bytes:
        self.store.ref_tube(r.name)
        self.store.unref_tube(self.use)
        self.use = r.name
        return wire.using(r.name)

    def _watch(self, r: Request) -> bytes:
        if r.name not in self.watch:
            self.store.ref_tube(r.name)
            self.watch.append(r.name)
        return wire.watching(len(self.watch))

    def _ignore(self, r: Request) -> bytes:
        watch = self.watch
        if r.name in watch:
            if len(watch) < 2:
                return wire.NOT_IGNORED
            i = watch.index(r.name)
            last = watch.pop()
            if i < len(watch):
                watch[i] = last
            self.store.unref_tube(r.name)
        return wire.watching(len(watch))

    def _pause_tube(self, r: Request) -> bytes:
        if not self.store.has_tube(r.name):
            return wire.NOT_FOUND
        # beanstalkd pauses for 1 ns when asked for 0 (stats: pause 0); the store's 0 is 1 s
        self.store.pause_tube(r.name, r.delay or 1e-9)
        return wire.PAUSED

    # --- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """The connection is gone: its reservations are ready at once, its tubes unused.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.owner.close()
        if not self.store.closed:
            self.store.unref_tube(self.use)
            for tube in self.watch:
                self.store.unref_tube(tube)
