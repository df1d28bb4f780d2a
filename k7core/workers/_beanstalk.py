"""A beanstalkd server (ours or beanstalkd itself) as a worker's source.

What the worker needs is written once, as *steps*: generators that yield the
:mod:`k7core.beanstalk.calls` to make and get each one's result back (or its error thrown
in). :func:`drive` runs them on a blocking :class:`k7core.beanstalk.Client`;
``k7async`` runs the same steps on its ``AsyncClient``.

beanstalkd keeps no error texts, so a failed job is put again with its errors in the body's
envelope (``_codec``) and the old one deleted after: the retry gets a new id (a crash in
between leaves both: at least once, never lost). A job to bury is put again parked (delayed a
year), reserved by id and buried. beanstalkd has no unique keys or dependencies: a put with
them is refused. Listing the buried jobs of a tube reserves each by id and buries it again,
which moves it to the end of the buried list: once round, the order is back.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from .._errors import K7Error
from ..beanstalk import Client, JobNotFoundError, ReservedJob, TubeNotFoundError, calls
from ..beanstalk.calls import Call
from ..jobs._machine import ERRORS_KEPT
from ._codec import pack, unpack
from ._source import Deps, JobView

T = TypeVar("T")

Steps = Generator[Call[Any], Any, T]
"""A procedure: yields calls, is sent each result, returns its own."""

PARKED = 365 * 86400
"""The delay a job to bury is put with before it is reserved and buried (seconds)."""
UNKNOWN_PRIORITY = -1


def drive(client: Client, steps: Steps[T]) -> T:
    """Run ``steps`` on a blocking client."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = steps.send(result) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            result, error = client.call(call), None
        except Exception as exc:
            result, error = None, exc


def _seconds(delay: float) -> int:
    return min(calls.MAX_TIMEOUT, math.ceil(delay))


def _view(job_id: int, tube: str, body: bytes, priority: int, created_at: float | None,
          now: float, ttr: float) -> JobView:
    try:
        envelope = unpack(body)
    except ValueError:  # the worker buries it as undecodable
        return JobView(job_id, tube, body, priority, (), created_at or now, ttr)
    return JobView(job_id, tube, body, priority, envelope.errors,
                   envelope.created_at or created_at or now, ttr)


def _with_error(job: JobView, error: str) -> bytes:
    """The job's body with ``error`` added to its envelope (the last ERRORS_KEPT kept)."""
    envelope = unpack(job.body)
    errors = (*envelope.errors, error)[-ERRORS_KEPT:]
    return pack(envelope.payload, envelope.context, errors, job.created_at)


def watch_steps(watching: tuple[str, ...], tubes: tuple[str, ...]) -> Steps[tuple[str, ...]]:
    """Watch ``tubes`` and nothing else (a connection starts watching ``default``)."""
    for tube in tubes:
        if tube not in watching:
            yield calls.watch(tube)
    for tube in watching:
        if tube not in tubes:
            yield calls.ignore(tube)
    return tubes


def reserve_steps(tubes: tuple[str, ...], timeout: float | None,
                  now: Callable[[], float]) -> Steps[JobView | None]:
    got: ReservedJob | None = yield (calls.reserve() if timeout is None
                                     else calls.reserve_with_timeout(_seconds(timeout)))
    if got is None:
        return None
    if len(tubes) == 1:  # one round trip: the ttr is asked at the first touch, if any
        return _view(got.id, tubes[0], got.body, UNKNOWN_PRIORITY, None, now(), 0.0)
    st = yield calls.stats_job(got.id)
    return _view(got.id, str(st["tube"]), got.body, UNKNOWN_PRIORITY, None, now(),
                 float(st["ttr"]))


def release_steps(job: JobView, delay: float, error: str | None) -> Steps[int]:
    st = yield calls.stats_job(job.id)
    priority = int(st["pri"])
    if error is None:
        yield calls.release(job.id, priority=priority, delay=_seconds(delay))
        return job.id
    yield calls.use(job.tube)
    new_id: int = yield calls.put(_with_error(job, error), priority=priority,
                                  delay=_seconds(delay), ttr=int(st["ttr"]))
    yield calls.delete(job.id)
    return new_id


def bury_steps(job: JobView, error: str) -> Steps[int]:
    st = yield calls.stats_job(job.id)
    priority = int(st["pri"])
    yield calls.use(job.tube)
    new_id: int = yield calls.put(_with_error(job, error), priority=priority, delay=PARKED,
                                  ttr=int(st["ttr"]))
    yield calls.reserve_job(new_id)
    yield calls.bury(new_id, priority=priority)
    yield calls.delete(job.id)
    return new_id


def touch_steps(job: JobView) -> Steps[float]:
    """Touch ``job``; its ttr, asked of the server the first time (``job.ttr`` 0)."""
    yield calls.touch(job.id)
    if job.ttr:
        return job.ttr
    st = yield calls.stats_job(job.id)
    return float(st["ttr"])


def no_store_feature() -> K7Error:
    """The error of a job store feature asked of a beanstalkd server."""
    return K7Error("a beanstalkd server has no unique keys, dependencies or job groups",
                   hint="use them with an in-process k7core.jobs.JobStore")


def take_steps(job_id: int, now: Callable[[], float]) -> Steps[JobView]:
    got: ReservedJob = yield calls.reserve_job(job_id)
    st = yield calls.stats_job(job_id)
    return _view(job_id, str(st["tube"]), got.body, int(st["pri"]),
                 now() - float(st["age"]), now(), float(st["ttr"]))


def put_steps(body: bytes, tube: str, priority: int, delay: float, ttr: float,
              key: str | None, depends_on: Deps, group: str | None = None) -> Steps[int]:
    if key is not None or depends_on or group is not None:
        raise no_store_feature()
    yield calls.use(tube)
    job_id: int = yield calls.put(body, priority=priority, delay=_seconds(delay),
                                  ttr=max(1, _seconds(ttr)))
    return job_id


def buried_steps(tube: str, limit: int | None, now: Callable[[], float]
                 ) -> Steps[list[JobView]]:
    try:
        st = yield calls.stats_tube(tube)
    except TubeNotFoundError:
        return []
    n = int(st["current-jobs-buried"])
    yield calls.use(tube)
    out: list[JobView] = []
    for _ in range(n if limit is None else min(n, limit)):
        first = yield calls.peek_buried()
        if first is None:
            break
        yield calls.reserve_job(first.id)
        job = yield calls.stats_job(first.id)
        yield calls.bury(first.id, priority=int(job["pri"]))  # to the end of the list
        out.append(_view(first.id, tube, first.body, int(job["pri"]),
                         now() - float(job["age"]), now(), float(job["ttr"])))
    return out


def kick_steps(tube: str, bound: int) -> Steps[int]:
    """Up to ``bound`` buried jobs of ``tube`` ready, each by ``kick-job`` (a bare ``kick``
    kicks delayed jobs when none is buried), at most as many as were buried at the start
    (a job buried again meanwhile is not kicked twice)."""
    try:
        st = yield calls.stats_tube(tube)
    except TubeNotFoundError:
        return 0
    yield calls.use(tube)
    kicked = 0
    for _ in range(min(bound, int(st["current-jobs-buried"]))):
        first = yield calls.peek_buried()
        if first is None:
            break
        try:
            yield calls.kick_job(first.id)
        except JobNotFoundError:  # kicked or deleted by another client meanwhile
            continue
        kicked += 1
    return kicked


def exists_steps(job_id: int) -> Steps[bool]:
    try:
        yield calls.stats_job(job_id)
    except JobNotFoundError:
        return False
    return True


def counts_steps() -> Steps[dict[str, dict[str, int]]]:
    out = {}
    for tube in (yield calls.list_tubes()):
        try:
            st = yield calls.stats_tube(tube)
        except TubeNotFoundError:
            continue
        n = {state: int(st[f"current-jobs-{state}"])
             for state in ("ready", "delayed", "reserved", "buried")}
        if any(n.values()):
            out[tube] = {**n, "waiting": 0}
    return out


class BeanstalkSession:
    """One connection's reservations."""

    def __init__(self, address: str, timeout: float | None,
                 clock: Callable[[], float]) -> None:
        self._client = Client(address, timeout=timeout)
        self._watching: tuple[str, ...] = ("default",)
        self._clock = clock

    def reserve(self, tubes: tuple[str, ...], timeout: float) -> JobView | None:
        if tubes != self._watching:
            self._watching = drive(self._client, watch_steps(self._watching, tubes))
        return drive(self._client, reserve_steps(tubes, timeout, self._clock))

    def delete(self, job: JobView) -> None:
        self._client.delete(job.id)

    def release(self, job: JobView, delay: float, error: str | None) -> int:
        return drive(self._client, release_steps(job, delay, error))

    def bury(self, job: JobView, error: str) -> int:
        return drive(self._client, bury_steps(job, error))

    def touch(self, job: JobView) -> float:
        return drive(self._client, touch_steps(job))

    def take(self, job_id: int) -> JobView:
        return drive(self._client, take_steps(job_id, self._clock))

    def close(self) -> None:
        self._client.close()


class BeanstalkSource:
    """A beanstalkd server at ``address`` (``beanstalk://host:port``, ``host:port``,
    ``unix:/path``): a connection per consumer slot, one more for puts and questions.
    ``timeout``: seconds a reply may take beyond what the server holds it for."""

    def __init__(self, address: str, *, timeout: float | None = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.address = address
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._client = Client(address, timeout=timeout)

    def session(self) -> BeanstalkSession:
        return BeanstalkSession(self.address, self._timeout, self._clock)

    def _run(self, steps: Steps[T]) -> T:
        with self._lock:  # a procedure's use() holds until its last call
            return drive(self._client, steps)

    def put(self, body: bytes, *, tube: str, priority: int, delay: float, ttr: float,
            key: str | None, depends_on: Deps, group: str | None = None) -> int:
        return self._run(put_steps(body, tube, priority, delay, ttr, key, depends_on, group))

    def buried(self, tube: str, limit: int | None = None) -> list[JobView]:
        return self._run(buried_steps(tube, limit, self._clock))

    def kick(self, tube: str, bound: int) -> int:
        return self._run(kick_steps(tube, bound))

    def exists(self, job_id: int) -> bool:
        return self._run(exists_steps(job_id))

    def counts(self) -> dict[str, dict[str, int]]:
        return self._run(counts_steps())

    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        raise no_store_feature()

    def forget_group(self, tube: str, group: str) -> bool:
        raise no_store_feature()

    def close(self) -> None:
        self._client.close()
