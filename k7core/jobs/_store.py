"""JobStore: the job machine made durable, timed and thread-safe.

The store owns a directory::

    DIR/journal/                   a k7 queue: one frame per journaled mutation (``_codec``)
    DIR/snapshot-<offset>.k7jobs   the live jobs as of journal offset <offset> (``_codec``)

State at open is the newest snapshot that reads back whole plus the journal from the offset
it covers. Journal offsets are the mutation ids: a job's id is the offset of its PUT + 1.
One lock serializes every call: a mutation is checked, appended to the journal and applied
to the machine while the lock is held, so the machine and the journal never disagree.

Durability per ``fsync``: ``"flush"`` and ``"async"`` journal with that strategy. ``"sync"``
journals with ``"async"`` and each caller then waits, outside the lock, until the flusher
has msync'd its record: the records of every thread that appended meanwhile share that one
msync (group commit), and a call returns only once its record is on stable storage.

Two threads of the store's own: the *timer* (one per store, not one per job) applies
deadlines when they fall due and wakes the reservers (it reads the clock again at least
every ``CLOCK_RECHECK`` seconds while a deadline is pending: the clock may jump); the
*snapshotter* writes snapshots in the background from its own copy of the state (the
newest snapshot plus the journal since, replayed), so puts and reserves do not wait for
it, then trims the journal below the older of the two snapshots it keeps.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .._checks import check_int
from .._errors import (
    ClosedError,
    DataLossError,
    IntegrityError,
    MessageTooLargeError,
    QueueLockedError,
    StorageError,
)
from .._format import Fsync, parse_fsync
from .._queue import Queue
from .._resource import Resource
from .._storage import read_file
from ._codec import (
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
    replay_batch,
    snapshot_position,
)
from ._damage import frames_after_damage, middle_damage, raise_floor
from ._errors import CorruptJobDataError, InvalidJobError, JobNotFoundError
from ._files import (
    JOURNAL,
    journal_holder,
    list_snapshots,
    make_store_dir,
    remove_dead_temporaries,
    save_snapshot,
)
from ._machine import Job, JobMachine, JobState, PutPlan, check_seconds

log = logging.getLogger("k7core.jobs")

SNAPSHOTS_KEPT = 2
"""Snapshots kept: the newest, and the one before it in case the newest cannot be read (the
journal is kept from the older one's offset)."""
JOURNAL_SEGMENT = 16 << 20
MAX_BODY = JOURNAL_SEGMENT - (1 << 20)
"""The largest job body a put always stores (15 MiB: the rest of a journal segment is room
for the record's other fields)."""
SNAPSHOT_MIN_BYTES = 64 << 20
"""A snapshot is due once the journal has grown by this much since the last one, or by the
size of the last snapshot if that is more: disk use and open time follow the live jobs."""
READ_BATCH = 65536
FORGET_RECORD_KEYS = 512
"""Keys per FORGET record at most (512 keys of 1 KiB fit a journal frame easily)."""
CLOCK_RECHECK = 0.5
"""The longest the store sleeps on a distance read on its clock before reading it again
(seconds): a clock that jumps forward (a step of the wall clock, an injected test clock)
then brings a deadline that passed within this much, not after the distance computed
before the jump."""


@dataclass
class State:
    """What :func:`load_state` rebuilt."""

    machine: JobMachine
    covered: int
    """The journal offset the snapshot used covers (0: none was used)."""
    snapshot_size: int
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Snapshots that could not be read back (an older one was used), and why."""


class _Commit:
    """Records of several threads that one msync makes durable (``"sync"``).

    Its leader waits on the previous commit's ``done``; every other member thread blocks on
    a lock of its own, which :meth:`finish` releases. So a commit wakes each member once
    and directly: with a shared event, the members woken together would then queue for
    its lock, one more hand-over between threads each.
    """

    __slots__ = ("done", "error", "last", "members")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.members: list[threading.Lock] = []  # held; released by finish()
        self.last = -1  # the offset of its last record
        self.error: BaseException | None = None

    def join(self) -> threading.Lock:
        """A held lock for a member thread to block on until the commit is over."""
        lock = threading.Lock()
        lock.acquire()
        self.members.append(lock)
        return lock

    def finish(self) -> None:
        self.done.set()
        for lock in self.members:
            lock.release()


@dataclass(frozen=True)
class TubeOverview:
    """One tube at a glance: live jobs by state, and how long its oldest ready job has
    waited (seconds; None when it has no ready job)."""

    ready: int
    delayed: int
    reserved: int
    buried: int
    waiting: int
    oldest_ready_age: float | None


def overview(machine: JobMachine, now: float) -> dict[str, TubeOverview]:
    """Every tube of ``machine`` at a glance, by name."""
    out = {}
    for tube in sorted(machine.tubes()):
        n = machine.counts(tube)
        created = machine.oldest_ready_created_at(tube)
        out[tube] = TubeOverview(
            n[JobState.READY], n[JobState.DELAYED], n[JobState.RESERVED], n[JobState.BURIED],
            n[JobState.WAITING], None if created is None else max(now - created, 0.0),
        )
    return out


def load_state(path: Path, journal: Queue, upto: int | None = None) -> State:
    """The newest snapshot that reads back whole (an older one if it does not), plus the
    journal after it, up to ``upto`` (default: its end)."""
    skipped: list[tuple[Path, str]] = []
    machine, covered, size = JobMachine(), 0, 0
    for offset, file in list_snapshots(path):
        if upto is not None and offset > upto:
            continue
        try:
            data = read_file(file)
            if snapshot_position(data) != offset:
                raise CorruptJobDataError(f"snapshot {file.name} says it covers another offset")
            machine = load_snapshot(data)
        except (IntegrityError, StorageError) as exc:
            skipped.append((file, str(exc)))
            continue
        covered, size = offset, len(data)
        break
    earliest = journal.earliest()
    if covered < earliest:
        raise DataLossError(
            f"the journal of {path} starts at offset {earliest}, after the snapshot it "
            f"needs (offset {covered}): the mutations in between are lost",
            earliest=earliest, path=path, offset=covered,
            hint="restore the store's directory from a backup",
        )
    collecting = gc.isenabled()
    gc.disable()  # millions of new long-lived objects: collections would only slow this
    try:
        replay_journal(machine, journal, covered, journal.end if upto is None else upto)
    finally:
        if collecting:
            gc.enable()
    machine.reset_counters()
    return State(machine, covered, size, skipped)


def replay_journal(machine: JobMachine, journal: Queue, start: int, end: int) -> None:
    """Apply the journal's records in [start, end) to ``machine``."""
    offset = start
    while offset < end:
        batch = journal.read_columnar(offset, READ_BATCH)
        if not len(batch):
            raise CorruptJobDataError(
                f"the journal of the job store ends at {offset}, before {end}",
                path=journal.path, offset=offset,
                hint="restore the store's directory from a backup",
            )
        if not replay_batch(machine, batch.view, batch.starts, batch.lengths, batch.offsets,
                            end):
            return
        offset = batch.next


class JobStore(Resource):
    """A durable job store in directory ``path`` (created if missing); one process owns it.

    ``fsync``: ``"flush"`` (a call that returned survives the process being killed),
    ``"sync"`` (survives power loss; concurrent callers share one msync), ``"async"`` (the
    background flusher makes it durable within ``commit_interval``). A second JobStore on
    the same directory, in this process or another, gets :class:`k7core.QueueLockedError`.

    A journal that lost records it had written (a damaged frame with valid ones after it,
    or a journal that ends before its snapshot) is refused with
    :class:`JournalDamagedError`; ``repair=True`` opens it anyway, keeping what can be read
    and moving the next id past every id handed out (``_damage``; docs/jobs.md).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: str | Fsync = Fsync.FLUSH,
        commit_interval: float = 50e-6,
        snapshot_bytes: int = SNAPSHOT_MIN_BYTES,
        clock: Callable[[], float] = time.time,
        repair: bool = False,
    ) -> None:
        self._closed = True
        self._path = Path(path)
        self._fsync = parse_fsync(fsync, "fsync")
        self._sync = self._fsync is Fsync.SYNC
        self._snapshot_bytes = check_int(snapshot_bytes, "snapshot_bytes", 1)
        self._clock = clock
        self._lock = threading.Lock()
        # One snapshot at a time: snapshot() and the snapshotter would otherwise write the
        # same temporary file and delete each other's snapshots and journal.
        self._snapshot_lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # reservers wait here
        self._wake_timer = threading.Condition(self._lock)
        self._wake_snapshotter = threading.Condition(self._lock)
        self._waiters = 0  # reserves waiting, plus one per ready listener
        self._listeners: list[Callable[[], object]] = []
        self._tls = threading.local()  # "sync": the commit of this thread's last record
        self._open_commit: _Commit | None = None
        self._last_commit: _Commit | None = None
        # operations since open, for counters(): one int increment under the lock each
        self._reserves = self._deletes = self._releases = self._buries = self._kicks = 0
        self._timer_at: float | None = None
        self._snapshot_due = False
        self.snapshot_error: BaseException | None = None
        """The last background snapshot's failure, if it failed (the journal keeps all)."""
        make_store_dir(self._path)
        if not repair:
            cut = frames_after_damage(self._path / JOURNAL)
            if cut is not None:
                raise middle_damage(self._path, *cut)
        try:
            self._journal = Queue(
                self._path / JOURNAL, fsync=Fsync.ASYNC if self._sync else self._fsync,
                commit_interval=commit_interval, segment_size=JOURNAL_SEGMENT,
            )
        except QueueLockedError as exc:
            pid = journal_holder(self._path)
            raise QueueLockedError(
                f"job store {self._path} is open in another JobStore ("
                + ("of this process" if pid == os.getpid() else
                   "of another process" if pid is None else f"process {pid}") + ")",
                path=self._path,
                hint="close the other JobStore: one owns a store at a time; `k7 jobs stats`, "
                     "`peek` and `errors` read a store while it is open") from exc
        self._enqueue = self._journal.enqueue
        try:
            remove_dead_temporaries(self._path)
            state = load_state(self._path, self._journal)
            self.recovery_events, replaced = raise_floor(self._path, self._journal,
                                                         state.machine, bool(repair))
            """What open did to the journal: the queue's recovery (``torn-tail-cut``...),
            then ``journal-padded`` when it moved the next id past what was cut or lost."""
            if replaced is not None:  # a new snapshot, at the padded journal's end
                state.covered, state.snapshot_size = replaced
        except BaseException:
            self._journal.close()
            raise
        self._machine = state.machine
        self._machine.advance(clock())
        self._snapshot_base = state.covered
        self._snapshot_size = state.snapshot_size
        self._snapshot_at = self._next_snapshot_at()
        self.skipped_snapshots = state.skipped
        """Snapshots open could not read back (an older one was used), and why."""
        self._closed = False
        name = self._path.name
        self._timer = threading.Thread(target=self._run_timer, name=f"k7-jobs-timer-{name}",
                                       daemon=True)
        self._snapshotter = threading.Thread(target=self._run_snapshotter,
                                             name=f"k7-jobs-snapshot-{name}", daemon=True)
        self._timer.start()
        self._snapshotter.start()

    # ------------------------------------------------------------------ properties

    @property
    def path(self) -> Path:
        return self._path

    @property
    def fsync(self) -> Fsync:
        return self._fsync

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ the writes

    def put(
        self,
        body: bytes,
        *,
        tube: str = "default",
        priority: int = 1024,
        delay: float = 0.0,
        ttr: float = 60.0,
        key: str | None = None,
        depends_on: Iterable[int | tuple[str, str]] = (),
        mark: tuple[str, int] | None = None,
        remember: bool = False,
        group: str | None = None,
    ) -> int:
        """Store a job; return its id (ids are never reused). With ``key``, a live job of
        ``tube`` that has the same key (or a job whose key is remembered) is returned
        instead and nothing is stored. ``depends_on``: ids or ``(tube, key)`` pairs of live
        jobs; the job waits until all of them are deleted.

        ``mark=(name, position)`` is journaled with the put: :meth:`mark` then returns the
        position of the last put that carried ``name``, after a restart too (a crash loses
        only the newest records, so it is the last put that survived). A position below the
        mark's is an InvalidJobError. A put that stores nothing (its key is taken) still
        moves the mark.

        ``remember=True`` (with a ``key``): the key stays taken in ``tube`` after the job
        is deleted, until :meth:`forget`; a put with it stores nothing and returns this
        job's id. Nothing forgets on its own: the caller bounds them (:meth:`remembered`
        lists them).

        ``group``: the job joins this group of ``tube`` (yoltq's job groups), whose
        progress :meth:`group_progress` tells."""
        if mark is not None or remember is not False or group is not None:
            return self._put_with(body, tube, priority, delay, ttr, key, depends_on, mark,
                                  remember, group)
        with self._lock:
            if self._closed:
                self._check_open()
            plan = self._machine.check_put(tube, body, priority, delay, ttr, key, depends_on,
                                           self._clock())
            if isinstance(plan, int):
                return plan  # the live job with this key
            try:
                offset = self._enqueue(encode_put(*plan))
            except MessageTooLargeError as exc:
                raise _too_large(plan) from exc
            if offset >= self._snapshot_at or self._sync:  # _append, inlined: the hot path
                self._appended(offset)
            self._machine.apply_put(offset + 1, plan)
            if plan[4] or self._waiters:  # plan's ready_at: delayed; or a reserve waits
                self._went_back(plan[4])
        if self._sync:
            self._durable()
        return offset + 1

    def _put_with(
        self, body: bytes, tube: str, priority: int, delay: float, ttr: float,
        key: str | None, depends_on: Iterable[int | tuple[str, str]], mark: object,
        remember: object, group: str | None,
    ) -> int:
        """:meth:`put` with a mark, ``remember=True`` or a group."""
        with self._lock:
            self._check_open()
            machine = self._machine
            plan = machine.check_put(tube, body, priority, delay, ttr, key, depends_on,
                                     self._clock())
            checked = machine.check_extras(key, mark, remember, group)
            if isinstance(plan, int):  # the key is taken: nothing stored, the mark moves
                if checked is None or machine.mark(checked[0]) == checked[1]:
                    return plan
                offset = self._append(encode_mark(*checked))
                machine.apply_mark(*checked)
                job_id = plan
            else:
                try:
                    offset = self._append(encode_put_with(plan, checked, remember is True,
                                                          group))
                except MessageTooLargeError as exc:
                    raise _too_large(plan) from exc
                job_id = offset + 1
                machine.apply_put_with(job_id, plan, checked, remember is True, group)
                if plan[4] or self._waiters:
                    self._went_back(plan[4])
        if self._sync:
            self._durable()
        return job_id

    def mark(self, name: str) -> int | None:
        """The position of the last put that carried mark ``name`` (None: none did)."""
        with self._lock:
            self._check_open()
            return self._machine.mark(name)

    def forget(self, tube: str, keys: Iterable[str]) -> int:
        """Stop remembering ``keys`` of ``tube`` (put with ``remember=True``); return how
        many were remembered. A key whose job is done is free again; a live job keeps its
        key until it is deleted. Journaled in records of up to 512 keys: a crash during a
        large forget may leave only some forgotten (forget them again)."""
        with self._lock:
            self._check_open()
            found = self._machine.check_forget(tube, keys)
            offset = -1
            for i in range(0, len(found), FORGET_RECORD_KEYS):
                part = found[i:i + FORGET_RECORD_KEYS]
                offset = self._append(encode_forget(tube, part))
                self._machine.apply_forget(tube, part)
        if self._sync and offset >= 0:
            self._durable()
        return len(found)

    def remembered(self, tube: str, prefix: str = "") -> list[str]:
        """The remembered keys of ``tube`` (put with ``remember=True``, not forgotten; their
        jobs live or done) that start with ``prefix``, sorted."""
        with self._lock:
            self._check_open()
            return self._machine.remembered(tube, prefix)

    def group_progress(self, tube: str, group: str) -> dict[str, int]:
        """How far group ``group`` of ``tube`` is (yoltq's ``job-group-progress``): its live
        jobs per state (ready, delayed, reserved, buried, waiting) and ``done``, how many
        of its jobs were deleted. All 0 for a group nobody put to (or forgotten)."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.group_progress(tube, group)

    def groups(self, tube: str) -> list[str]:
        """The groups of ``tube`` that have live jobs or a done count, sorted."""
        with self._lock:
            self._check_open()
            return self._machine.groups(tube)

    def forget_group(self, tube: str, group: str) -> bool:
        """Drop group ``group`` of ``tube``: its done count, and its live jobs' membership
        (the jobs stay). The store keeps a group until this: call it when the group's
        progress is no longer wanted. Returns whether there was such a group."""
        with self._lock:
            self._check_open()
            if not self._machine.check_forget_group(tube, group):
                return False
            self._append(encode_forget_group(tube, group))
            self._machine.apply_forget_group(tube, group)
        if self._sync:
            self._durable()
        return True

    def delete(self, job_id: int) -> None:
        """Delete a job that is ready, delayed, buried or waiting (a reserved one only its
        owner may delete: :meth:`JobOwner.delete`); JobNotFoundError otherwise."""
        self._delete(job_id, None)

    def kick(self, tube: str, bound: int) -> int:
        """Move up to ``bound`` jobs of ``tube`` to ready: buried ones (oldest first) if it
        has any, else delayed ones (soonest first). Returns how many."""
        with self._lock:
            self._check_open()
            ids = self._machine.plan_kick(tube, bound)
            offset = -1
            for job_id in ids:
                offset = self._append(encode_kick(job_id))
                self._machine.apply_kick(job_id)
            self._kicks += len(ids)
            if ids and self._waiters:
                self._wake_reservers()
        if self._sync and offset >= 0:
            self._durable()
        return len(ids)

    def kick_job(self, job_id: int) -> None:
        """Move one buried or delayed job to ready; JobNotFoundError otherwise."""
        with self._lock:
            self._check_open()
            self._machine.check_kick_job(job_id)
            self._append(encode_kick(job_id))
            self._machine.apply_kick(job_id)
            self._kicks += 1
            if self._waiters:
                self._wake_reservers()
        if self._sync:
            self._durable()

    def pause_tube(self, tube: str, seconds: float) -> None:
        """Reserve no job of ``tube`` for ``seconds`` (not journaled: a pause ends with the
        store, as in beanstalkd)."""
        with self._lock:
            self._check_open()
            self._machine.pause_tube(tube, seconds, self._clock())
            self._rearm()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Under ``"sync"``: the calls this thread makes inside return without waiting for
        their msync; leaving the block waits once for all of them (one thread doing many
        calls, such as an owner thread serving many tasks, then pays one msync, not one per
        call). A call inside is durable only once the block has been left. Elsewhere, and
        nested, it changes nothing."""
        self._check_open()
        tls = self._tls
        if not self._sync or getattr(tls, "deferred", False):
            yield
            return
        tls.deferred, tls.commit = True, None
        try:
            yield
        finally:
            tls.deferred = False
            if tls.commit is not None:
                self._durable()

    def add_ready_listener(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` whenever jobs may have become reservable (a put, a release,
        a kick, a delay or a time-to-run or a pause running out, an owner closing...), for
        reservers that wait elsewhere (a server's event loop). It is called from the thread
        that made the change, with the store's lock held: it must be quick and must not
        call the store (post a wake-up to an event loop, set a flag)."""
        with self._lock:
            self._check_open()
            self._listeners.append(listener)
            self._waiters += 1

    def remove_ready_listener(self, listener: Callable[[], object]) -> None:
        """Undo :meth:`add_ready_listener` (ValueError if ``listener`` was not added)."""
        with self._lock:
            self._listeners.remove(listener)
            self._waiters -= 1

    def ref_tube(self, tube: str) -> None:
        """Count a user of ``tube`` (a server connection's use or watch): the tube exists,
        with its counters, until every ref is undone and it has no jobs (beanstalkd's rule).
        Not journaled."""
        with self._lock:
            self._check_open()
            self._machine.ref_tube(tube)

    def unref_tube(self, tube: str) -> None:
        """Undo one :meth:`ref_tube` (InvalidJobError if there is none to undo)."""
        with self._lock:
            if not self._closed:
                self._machine.unref_tube(tube)

    def has_tube(self, tube: str) -> bool:
        """True when beanstalkd would know ``tube``: it has jobs, users or a pause."""
        with self._lock:
            self._check_open()
            return self._machine.has_tube(tube)

    def owner(self) -> JobOwner:
        """A handle whose reservations are its own: only it may delete, release, bury or
        touch them, and closing it makes them ready at once."""
        self._check_open()
        return JobOwner(self)

    # ------------------------------------------------------------------ the reads

    def peek(self, job_id: int) -> Job | None:
        """The job (any state), or None if there is no such live job."""
        with self._lock:
            self._check_open()
            return self._machine.peek(job_id)

    def find(self, tube: str, key: str) -> int | None:
        """The id of the live job of ``tube`` that has ``key`` (None: no live job has it,
        even if the key is remembered)."""
        with self._lock:
            self._check_open()
            return self._machine.find(tube, key)

    def peek_ready(self, tube: str = "default") -> Job | None:
        """The job ``reserve`` would take next from ``tube``."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.peek_ready(tube)

    def peek_delayed(self, tube: str = "default") -> Job | None:
        """The delayed job of ``tube`` due first."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.peek_delayed(tube)

    def peek_buried(self, tube: str = "default") -> Job | None:
        """The buried job of ``tube`` that ``kick`` would move first."""
        with self._lock:
            self._check_open()
            return self._machine.peek_buried(tube)

    def errors(self, tube: str = "default") -> list[Job]:
        """The buried jobs of ``tube`` with their error texts (``Job.errors``)."""
        with self._lock:
            self._check_open()
            return self._machine.errors(tube)

    def tubes(self) -> list[str]:
        """The tubes that have jobs (or a pause), in no particular order."""
        with self._lock:
            self._check_open()
            return self._machine.tubes()

    def job_stats(self, job_id: int) -> dict[str, int | str]:
        """beanstalkd's stats-job for the job (JobNotFoundError if there is none)."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.job_stats(job_id, self._clock())

    def tube_stats(self, tube: str = "default") -> dict[str, int | str]:
        """beanstalkd's stats-tube figures the store knows (JobNotFoundError-free: an
        unknown tube has zeros)."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.tube_stats(tube, self._clock())

    def stats(self) -> dict[str, int]:
        """beanstalkd's job figures of ``stats`` (current-jobs-*, total-jobs, ...)."""
        with self._lock:
            self._check_open()
            self._advance()
            return self._machine.stats(self._clock())

    def overview(self) -> dict[str, TubeOverview]:
        """Per tube: live jobs by state and the age of the oldest ready job, in one look (for
        metrics and the command line)."""
        with self._lock:
            self._check_open()
            self._advance()
            return overview(self._machine, self._clock())

    def counters(self) -> dict[str, int]:
        """Operations since open, for metrics: ``puts`` (jobs stored: a put that found a
        live job with its key stores none), ``reserves`` (``reserve`` and ``reserve_job``),
        ``deletes``, ``releases``, ``buries``, ``kicks`` (jobs kicked, by ``kick`` and
        ``kick_job``) and ``timeouts`` (reservations whose time-to-run ran out)."""
        with self._lock:
            self._check_open()
            self._advance()
            st = self._machine.stats(self._clock())
            return {
                "puts": st["total-jobs"], "reserves": self._reserves, "deletes": self._deletes,
                "releases": self._releases, "buries": self._buries, "kicks": self._kicks,
                "timeouts": st["job-timeouts"],
            }

    def __len__(self) -> int:
        with self._lock:
            self._check_open()
            return len(self._machine)

    # ------------------------------------------------------------------ owners' calls

    def _reserve(
        self, owner: JobOwner, tubes: Iterable[str], timeout: float | None
    ) -> Job | None:
        if type(tubes) is not tuple:
            tubes = (tubes,) if isinstance(tubes, str) else tuple(tubes)
        if timeout is not None and (timeout != 0 or type(timeout) is not int):
            timeout = check_seconds(timeout, "timeout")
        deadline = None  # taken when the first try finds nothing
        machine = self._machine
        with self._lock:
            while True:
                if self._closed or owner._closed:
                    self._check_open()
                    owner._check_open()  # closed by another thread while this one waited
                now = self._clock()
                machine.advance(now)
                job = machine.reserve(owner, tubes, now)
                if job is not None:
                    self._reserves += 1
                    self._arm(job.ready_at)
                    return job
                if deadline is None:
                    if timeout == 0:
                        return None
                    deadline = math.inf if timeout is None else time.monotonic() + timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._waiters += 1
                try:
                    self._ready.wait(None if math.isinf(left) else left)
                finally:
                    self._waiters -= 1

    def _reserve_job(self, owner: JobOwner, job_id: int) -> Job:
        offset = -1
        with self._lock:
            self._check_open()
            now = self._clock()
            machine = self._machine
            machine.advance(now)
            if machine.check_reserve_job(job_id):
                offset = self._append(encode_ready(job_id))
                machine.apply_ready(job_id)
            job = machine.reserve_job(job_id, owner, now)
            self._reserves += 1
            self._arm(job.ready_at)
        if self._sync and offset >= 0:
            self._durable()
        return job

    def _delete(self, job_id: int, owner: JobOwner | None) -> None:
        with self._lock:
            if self._closed:
                self._check_open()
            machine = self._machine
            machine.check_delete(job_id, owner)
            frees = machine.has_dependents(job_id)
            offset = self._enqueue(encode_delete(job_id))
            if offset >= self._snapshot_at or self._sync:  # _append, inlined: the hot path
                self._appended(offset)
            machine.apply_delete(job_id)
            self._deletes += 1
            if frees:  # jobs waiting on it go on: ready, or delayed (maybe due already)
                self._advance()
                self._rearm()
                if self._waiters:
                    self._wake_reservers()
        if self._sync:
            self._durable()

    def _release(
        self, owner: JobOwner, job_id: int, priority: int | None, delay: float,
        error: str | None,
    ) -> None:
        with self._lock:
            self._check_open()
            now = self._clock()
            if priority is None:
                priority = self._owned_priority(job_id, owner)
            plan = self._machine.check_release(job_id, owner, priority, delay, error, now)
            self._append(encode_release(*plan))
            self._machine.apply_release(*plan)
            self._releases += 1
            self._went_back(plan.ready_at)
        if self._sync:
            self._durable()

    def _bury(
        self, owner: JobOwner, job_id: int, priority: int | None, error: str | None
    ) -> None:
        with self._lock:
            self._check_open()
            if priority is None:
                priority = self._owned_priority(job_id, owner)
            plan = self._machine.check_bury(job_id, owner, priority, error)
            self._append(encode_bury(*plan))
            self._machine.apply_bury(*plan)
            self._buries += 1
        if self._sync:
            self._durable()

    def _owned_priority(self, job_id: int, owner: JobOwner) -> int:
        """The priority of a job ``owner`` has reserved (a release or bury that keeps it);
        JobNotFoundError if it has not."""
        job = self._machine.peek(job_id)
        if job is None or job_id not in self._machine.reserved_by(owner):
            raise JobNotFoundError(f"job {job_id} is not reserved by this owner",
                                   job_id=job_id,
                                   hint="release, bury and touch apply to your reservations")
        return job.priority

    def _touch(self, owner: JobOwner, job_id: int) -> None:
        with self._lock:
            self._check_open()
            self._machine.touch(job_id, owner, self._clock())

    def _release_owner(self, owner: JobOwner) -> None:
        with self._lock:
            if self._closed:
                return
            self._machine.release_owner(owner)
            if self._waiters:  # its jobs are ready; a reserve of its own must stop
                self._wake_reservers()

    def _time_left(self, owner: JobOwner) -> float | None:
        with self._lock:
            self._check_open()
            end = self._machine.soonest_end(owner)
            return None if end is None else end - self._clock()

    def _reserved_by(self, owner: JobOwner) -> list[int]:
        with self._lock:
            self._check_open()
            return self._machine.reserved_by(owner)

    # ------------------------------------------------------------------ the journal

    def _append(self, record: bytes) -> int:
        """Journal one record (the lock is held); return its offset. Under ``"sync"`` the
        record joins the open commit, which :meth:`_durable` then waits for."""
        offset = self._enqueue(record)
        if offset >= self._snapshot_at or self._sync:
            self._appended(offset)
        return offset

    def _appended(self, offset: int) -> None:
        """What an append at ``offset`` may set going: a snapshot; the commit it joins."""
        if offset >= self._snapshot_at and not self._snapshot_due:
            self._snapshot_due = True
            self._wake_snapshotter.notify()
        if self._sync:
            commit = self._open_commit
            tls = self._tls
            if commit is None:
                commit = self._open_commit = _Commit()
                tls.lead = True
            elif getattr(tls, "commit", None) is not commit:
                tls.lead = False  # (a second record of a batch keeps the first's role)
                tls.wake = commit.join()
            commit.last = offset
            tls.commit = commit

    def _durable(self) -> None:
        """``"sync"``: return once this thread's last record is msync'd.

        The records appended while the previous commit is on its way form the next one; its
        first member (the leader) waits for the previous one, closes its own, waits until
        the flusher has msync'd its last record and wakes exactly its members. So each
        thread wakes once per call, and every commit costs the flusher one msync.
        """
        tls = self._tls
        if getattr(tls, "deferred", False):
            return  # batch() waits once, at its end
        commit: _Commit = tls.commit
        tls.commit = None
        if not tls.lead:
            tls.wake.acquire()
        else:
            with self._lock:
                previous = self._last_commit
            if previous is not None:
                previous.done.wait()
            with self._lock:
                if self._open_commit is commit:
                    self._open_commit = None
                self._last_commit = commit
                last = commit.last
            try:
                journal = self._journal
                while journal.wait(last, 0.2) <= last:
                    with self._lock:  # the flusher is late, or failed: msync here
                        if self._closed:
                            break  # close() msyncs what was appended
                        journal.sync()
            except BaseException as exc:
                commit.error = exc
                raise
            finally:
                commit.finish()
        if commit.error is not None:
            raise StorageError(
                f"job store {self._path}: the msync of the journal failed ({commit.error})",
                errno_=getattr(commit.error, "errno", 0) or 0, path=self._path,
                hint="the call may not be durable; check the disk, then reopen the store",
            ) from commit.error

    def _next_snapshot_at(self) -> int:
        """The journal offset past which a snapshot is due: the journal grew by
        ``snapshot_bytes`` since the last one, or by its size if that is more. So the
        journal to replay at open stays about as large as the live jobs' snapshot (open
        time follows the live jobs), and writing snapshots costs a bounded share of the
        work (one snapshot per live set's worth of journal)."""
        return self._snapshot_base + max(self._snapshot_bytes, self._snapshot_size)

    def snapshot(self) -> int:
        """Write a snapshot now (in this thread) and trim the journal; return the journal
        offset it covers. The background snapshotter does the same as the journal grows."""
        self._check_open()
        return self._write_snapshot()

    def _write_snapshot(self) -> int:
        """Snapshot the journal up to its visible end, from a state of the snapshot's own."""
        with self._snapshot_lock:
            return self._write_snapshot_locked()

    def _write_snapshot_locked(self) -> int:
        with self._lock:
            covered = self._journal.end
            base = self._snapshot_base
            if covered > base:  # the snapshot must not outlive the journal it covers
                self._journal.sync()
        if covered <= base:
            return base
        state = load_state(self._path, self._journal, upto=covered)
        try:
            size = save_snapshot(self._path, state.machine, covered)
        finally:
            state.machine.dismantle()
        kept = [covered]
        unreadable = {file for file, _ in self.skipped_snapshots}
        for offset, file in list_snapshots(self._path):
            if offset >= covered:
                continue
            if len(kept) < SNAPSHOTS_KEPT and file not in unreadable:  # a backup that reads
                kept.append(offset)
            else:
                with contextlib.suppress(FileNotFoundError):
                    file.unlink()
        with self._lock:
            if not self._closed:
                self._journal.delete_before(min(kept))
            self._snapshot_base, self._snapshot_size = covered, size
            self._snapshot_at = self._next_snapshot_at()
        return covered

    # ------------------------------------------------------------------ time

    def _advance(self) -> None:
        """Apply the deadlines due now (lock held); wake reservers if jobs became ready."""
        if self._machine.advance(self._clock()) and self._waiters:
            self._wake_reservers()

    def _went_back(self, ready_at: float) -> None:
        """A job became ready (``ready_at`` 0) or delayed until ``ready_at`` (lock held)."""
        if ready_at:
            self._arm(ready_at)
        elif self._waiters:
            self._wake_reservers()

    def _wake_reservers(self) -> None:
        """Jobs may have become reservable (lock held): wake the waiting reserves, call the
        ready listeners."""
        self._ready.notify_all()
        for listener in self._listeners:
            listener()

    def _arm(self, deadline: float) -> None:
        """Wake the timer if ``deadline`` comes before what it waits for (lock held)."""
        if self._timer_at is None or deadline < self._timer_at:
            self._timer_at = deadline
            self._wake_timer.notify()

    def _rearm(self) -> None:
        deadline = self._machine.next_deadline()
        if deadline is not None:
            self._arm(deadline)

    def _run_timer(self) -> None:
        with self._lock:
            while not self._closed:
                self._advance()
                deadline = self._machine.next_deadline()
                self._timer_at = deadline
                wait = (None if deadline is None
                        else min(max(deadline - self._clock(), 0.0), CLOCK_RECHECK))
                self._wake_timer.wait(wait)

    def _run_snapshotter(self) -> None:
        while True:
            with self._lock:
                while not (self._snapshot_due or self._closed):
                    self._wake_snapshotter.wait()
                if self._closed:
                    return
            try:
                self._write_snapshot()
                if self.snapshot_error is not None:
                    log.warning("job store %s: snapshots are written again", self._path)
                self.snapshot_error = None
            except Exception as exc:  # kept for the caller to see; the journal holds all
                if self.snapshot_error is None:  # once, not at every write of a full disk
                    log.error("job store %s: a snapshot failed, tried again at each write "
                              "(the journal keeps every job): %s", self._path, exc)
                self.snapshot_error = exc
            with self._lock:
                self._snapshot_due = False

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop the threads and close the journal (msync'd under ``"sync"`` and
        ``"async"``). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ready.notify_all()
            self._wake_timer.notify_all()
            self._wake_snapshotter.notify_all()
        self._timer.join()
        self._snapshotter.join()
        with self._lock:
            self._journal.close()
            # Records are out of the cycle collector's reach (see _machine): drop them here,
            # so that an owner a record still refers to cannot keep them alive with the store.
            self._machine = JobMachine()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"job store {self._path} is closed", path=self._path,
                              hint="open it again")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<k7core.jobs.JobStore {str(self._path)!r} {self._fsync.value} {state}>"


def _too_large(plan: PutPlan) -> InvalidJobError:
    return InvalidJobError(
        f"a job body of {len(plan[8])} bytes does not fit in the journal's segments of "
        f"{JOURNAL_SEGMENT} bytes", hint="store a large payload elsewhere and put a "
        "reference to it")


class JobOwner(Resource):
    """Reservations that belong to one holder (a worker, a connection); from
    :meth:`JobStore.owner`. Only it may delete, release, bury or touch the jobs it reserved;
    :meth:`close` makes every one of them ready at once."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once this owner or its store is closed."""
        return self._closed or self._store.closed

    def reserve_job(self, job_id: int) -> Job:
        """Reserve this job (ready, delayed or buried; beanstalkd's reserve-job);
        JobNotFoundError otherwise."""
        self._check_open()
        return self._store._reserve_job(self, job_id)

    def reserve(
        self, tubes: Iterable[str] = ("default",), timeout: float | None = None
    ) -> Job | None:
        """Reserve the most urgent ready job of ``tubes`` (smallest priority, then oldest),
        waiting up to ``timeout`` seconds (None: without limit, 0: not at all) for one;
        None when none came."""
        if self._closed:
            self._check_open()
        return self._store._reserve(self, tubes, timeout)

    def delete(self, job_id: int) -> None:
        """Delete a job this owner reserved (or one that is not reserved)."""
        if self._closed:
            self._check_open()
        self._store._delete(job_id, self)

    def release(
        self, job_id: int, *, priority: int | None = None, delay: float = 0.0,
        error: str | None = None,
    ) -> None:
        """Give a reserved job back: ready, or delayed by ``delay`` seconds; ``priority``
        (default: its own), ``error`` recorded in its history."""
        self._check_open()
        self._store._release(self, job_id, priority, delay, error)

    def bury(self, job_id: int, *, priority: int | None = None, error: str | None = None) -> None:
        """Put a reserved job aside until it is kicked; ``error`` recorded in its history."""
        self._check_open()
        self._store._bury(self, job_id, priority, error)

    def touch(self, job_id: int) -> None:
        """Give a reserved job a full time-to-run again from now."""
        self._check_open()
        self._store._touch(self, job_id)

    def time_left(self) -> float | None:
        """Seconds until the first of this owner's reservations runs out (negative when
        overdue), None when it has none (beanstalkd's DEADLINE_SOON looks at this)."""
        self._check_open()
        return self._store._time_left(self)

    def reserved(self) -> list[int]:
        """The ids this owner has reserved."""
        self._check_open()
        return self._store._reserved_by(self)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this job owner is closed", hint="take a new store.owner()")

    def close(self) -> None:
        """Make every job this owner reserved ready at once. Idempotent."""
        if not self._closed:
            self._closed = True
            self._store._release_owner(self)

