"""The child processes of the outbox tests (not a test module).

``python -m tests.k7core.outbox._outboxchild create KIND WHERE``: connects to the SQLite file
or PostgreSQL DSN ``WHERE`` (KIND ``sqlite`` or ``pg``), begins a transaction, prints
``ready``, waits for a line on stdin, then creates the outbox and puts a row in that
transaction, commits and prints ``created`` (or the error's text).

``python -m tests.k7core.outbox._outboxchild relay KIND WHERE STORE BATCH RELAYS KILL``: runs
RELAYS relay threads (``with relay:``, batches of BATCH rows) of that outbox into a job store
in directory STORE (``fsync="flush"``), printing ``ready`` and then ``P <job id>`` after
each put returned, until killed. KILL ``none``, or ``<call>-<when>:<n>`` with call ``put``,
``forget`` or ``mark`` and when ``before`` or ``after``: the store SIGKILLs its own process
before (or after) its n-th call of that method.

``python -m tests.k7core.outbox._outboxchild beanstalk KIND WHERE ADDRESS BATCH KILL``: a
``BeanstalkRelay`` of that outbox into the beanstalkd server at ADDRESS (batches of BATCH
rows). KILL ``thread``: runs the relay's thread, prints ``ready``, until killed; otherwise
prints ``ready``, runs ``relay_once`` until no row is left, prints ``idle`` and exits, and
KILL ``<command>-<when>:<n>`` (a beanstalkd command such as ``put`` or ``kick-job``, when
``before`` or ``after``) SIGKILLs the process before (or after) its n-th call of that
command.

``python -m tests.k7core.outbox._outboxchild pglock DSN``: a relay's session (its
application name) that updates the outbox's ``k7_outbox_meta`` row and never commits, prints
``held`` and sleeps until killed (a relay the test freezes between its take and its commit).

``python -m tests.k7core.outbox._outboxchild lock PATH``: opens the SQLite file PATH, takes
its exclusive lock (``BEGIN EXCLUSIVE``: no other connection reads or writes it), prints
``held`` and sleeps until killed (a process the test freezes with SIGSTOP).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sqlite3
import sys
import threading
from contextlib import ExitStack, closing
from typing import Any

import psycopg

from k7core.beanstalk import Call, Client
from k7core.jobs import JobStore
from k7core.outbox import BeanstalkRelay, Outbox, PostgresRelay, Relay, SqliteRelay
from k7core.outbox._postgres import relay_application_name


def create(kind: str, where: str) -> None:
    conn: sqlite3.Connection | psycopg.Connection[Any] = (
        sqlite3.connect(where) if kind == "sqlite" else psycopg.connect(where))
    with conn:
        os.write(1, b"ready\n")
        sys.stdin.readline()
        box = Outbox()
        try:
            box.create(conn)
            box.put(conn, "t", os.getpid())
            conn.commit()
        except Exception as exc:  # reported to the parent, which fails the test
            os.write(1, f"{type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n")
            return
        os.write(1, b"created\n")


class KillingStore(JobStore):
    """A job store that SIGKILLs its process at one chosen call (``kill``, as KILL above),
    and prints each put."""

    def __init__(self, path: str, kill: str) -> None:
        super().__init__(path, fsync="flush")
        self._killer_calls = {"put": 0, "forget": 0, "mark": 0}
        self._killer_lock = threading.Lock()
        self._killer_at: tuple[str, str, int] | None = None
        if kill != "none":
            call, _, rest = kill.partition("-")
            when, _, n = rest.partition(":")
            self._killer_at = (call, when, int(n))

    def _before(self, call: str) -> int:
        """Count the call; die if it is the chosen one's "before". Returns its number, for
        its "after" (two relay threads may both be between their before and after)."""
        with self._killer_lock:
            self._killer_calls[call] += 1
            k = self._killer_calls[call]
            if self._killer_at == (call, "before", k):
                os.kill(os.getpid(), signal.SIGKILL)
            return k

    def _after(self, call: str, k: int) -> None:
        if self._killer_at == (call, "after", k):
            os.kill(os.getpid(), signal.SIGKILL)

    def put(self, body: bytes, **options: Any) -> int:
        k = self._before("put")
        job_id = super().put(body, **options)
        os.write(1, b"P %d\n" % job_id)
        self._after("put", k)
        return job_id

    def forget(self, tube: str, keys: Any) -> int:
        k = self._before("forget")
        n = super().forget(tube, keys)
        self._after("forget", k)
        return n

    def mark(self, name: str) -> int | None:
        k = self._before("mark")
        position = super().mark(name)
        self._after("mark", k)
        return position


def relay(kind: str, where: str, path: str, batch: str, relays: str, kill: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck child's stacks
    with KillingStore(path, kill) as store, ExitStack() as stack:
        os.write(1, b"ready\n")
        for _ in range(int(relays)):
            r: Relay = (SqliteRelay(where, store, batch=int(batch)) if kind == "sqlite"
                        else PostgresRelay(where, store, batch=int(batch)))
            stack.enter_context(r)
        threading.Event().wait()


def beanstalk(kind: str, where: str, address: str, batch: str, kill: str) -> None:
    if kill != "none" and kill != "thread":
        command, _, rest = kill.rpartition("-")
        when, _, n = rest.partition(":")
        word, count = command.encode() + b" ", [0]
        plain = Client.call

        def call(self: Client, c: Call[Any]) -> Any:
            if c.request.startswith(word):
                count[0] += 1
            if count[0] == int(n) and when == "before" and c.request.startswith(word):
                os.kill(os.getpid(), signal.SIGKILL)
            result = plain(self, c)
            if count[0] == int(n) and when == "after" and c.request.startswith(word):
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        Client.call = call  # type: ignore[method-assign, assignment]
    relay = BeanstalkRelay(where, address, batch=int(batch))
    os.write(1, b"ready\n")
    if kill == "thread":
        with relay:
            threading.Event().wait()
    with closing(relay):
        while relay.relay_once():
            pass
    os.write(1, b"idle\n")


def lock(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    os.write(1, b"held\n")
    while True:
        threading.Event().wait(60)


def pglock(dsn: str) -> None:
    """A relay's session in the middle of its transaction on ``<table>_meta`` (as a relay
    stopped between its ``take`` and its commit holds it)."""
    conn = psycopg.connect(dsn, application_name=relay_application_name())
    conn.execute("UPDATE k7_outbox_meta SET upto = upto")
    os.write(1, b"held\n")
    while True:
        threading.Event().wait(60)


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "create":
        create(*args)
    elif mode == "relay":
        relay(*args)
    elif mode == "beanstalk":
        beanstalk(*args)
    elif mode == "lock":
        lock(*args)
    elif mode == "pglock":
        pglock(*args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
