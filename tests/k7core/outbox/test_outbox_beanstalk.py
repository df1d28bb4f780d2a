"""The outbox relayed into beanstalkd servers (Debian's beanstalkd and ``k7 serve``), from
SQLite and PostgreSQL: committed rows arrive once as jobs, delays are kept, rows a
beanstalkd cannot take are skipped, one relay of an outbox moves rows at a time, and a
relay SIGKILLed at each step of a batch (and of the recovery after one) leaves each row
exactly once in the server and no parked job behind."""

from __future__ import annotations

import json
import logging
import random
import signal
import sqlite3
import subprocess
import time
from contextlib import closing
from typing import Any

import anyio
import psycopg
import pytest

import k7async
from k7core.beanstalk import Client, TubeNotFoundError
from k7core.jobs import JobStore
from k7core.outbox import BeanstalkRelay, Outbox, OutboxRewoundError, OutboxTargetError, relay
from tests._childproc import Child
from tests._queuehelp import K7
from tests.k7async.server._servers import SERVERS, ServerProcess, address, served
from tests.k7core.outbox._outboxhelp import TUBE, App, counted, payloads, relay_all, setup, until

CHILD = "tests.k7core.outbox._outboxchild"


server = pytest.fixture(params=SERVERS)(served)

DELAY = 600
"""The delay of the kill tests' delayed rows: long enough that it has not run out when
their job goes live, however slow a busy machine is (1 s had, and the relay kicked the job
instead of the reserve-job the test kills at)."""


def take(server: ServerProcess, n: int | None, timeout: int = 10) -> list[Any]:
    """The payloads of the next ``n`` jobs of TUBE (waiting up to ``timeout`` s for
    each; None: those ready now), reserved and deleted."""
    out: list[Any] = []
    with Client(address(server), timeout=10) as c:
        c.watch(TUBE)
        c.ignore("default")
        while n is None or len(out) < n:
            job = c.reserve(timeout)
            if job is None and n is None:
                break
            assert job is not None, f"only {out} came"
            out.append(json.loads(job.body))
            c.delete(job.id)
    return out


def take_delayed(server: ServerProcess) -> list[Any]:
    """The payloads of the delayed jobs of TUBE, each checked to be delayed :data:`DELAY`
    at most (not parked), and deleted."""
    out = []
    with Client(address(server), timeout=10) as c:
        c.use(TUBE)
        while (job := c.peek_delayed()) is not None:
            assert int(c.stats_job(job.id)["delay"]) <= DELAY, "a parked job"
            out.append(json.loads(job.body))
            c.delete(job.id)
    return out


def jobs_left(server: ServerProcess) -> dict[str, dict[str, int]]:
    """The tubes holding jobs, with their counts by state (parked jobs count as delayed)."""
    out = {}
    with Client(address(server), timeout=10) as c:
        for tube in c.list_tubes():
            try:
                st = c.stats_tube(tube)
            except TubeNotFoundError:
                continue
            n = {s: int(st[f"current-jobs-{s}"]) for s in ("ready", "delayed", "reserved",
                                                           "buried")}
            if any(n.values()):
                out[tube] = n
    return out


def test_committed_rows_arrive_once_and_rows_with_keys_are_skipped(
        app: App, server: ServerProcess, caplog: pytest.LogCaptureFixture) -> None:
    box = setup(app)
    for n in range(5):
        box.put(app.conn, TUBE, {"n": n}, priority=10 + n, ttr=30)
    app.commit()
    box.put(app.conn, TUBE, {"n": "rolled back"})
    app.rollback()
    box.put(app.conn, TUBE, {"n": "keyed"}, key="k")
    box.put(app.conn, TUBE, {"n": "dependent"}, depends_on=[1])
    box.put(app.conn, TUBE, {"n": "grouped"}, group="g")
    app.commit()
    r = relay(app.where, address(server), batch=2)
    assert isinstance(r, BeanstalkRelay)
    with closing(r), caplog.at_level(logging.ERROR, "k7core.outbox"):
        assert relay_all(r) == 8
    assert (r.relayed, r.skipped) == (5, 3)
    assert "has a key" in caplog.text and "has dependencies" in caplog.text
    assert "has a job group" in caplog.text
    with Client(address(server), timeout=10) as c:
        c.use(TUBE)
        first = c.peek_ready()
        assert first is not None
        st = c.stats_job(first.id)
        assert (st["state"], st["pri"], st["ttr"]) == ("ready", 10, 30)
    assert take(server, 5, timeout=0) == [{"n": n} for n in range(5)]  # by priority
    assert jobs_left(server) == {}
    app.rollback()
    assert app.count() == 0 and app.count(f"{app.table}_sent") == 0


def test_delays_are_kept(app: App, server: ServerProcess) -> None:
    box = setup(app)
    box.put(app.conn, TUBE, {"n": "later"}, delay=1)
    box.put(app.conn, TUBE, {"n": "now"})
    app.commit()
    with closing(BeanstalkRelay(app.where, address(server))) as r:
        assert relay_all(r) == 2
    counts = jobs_left(server)[TUBE]
    assert (counts["ready"], counts["delayed"]) == (1, 1)
    assert take(server, 1, timeout=0) == [{"n": "now"}]
    with Client(address(server), timeout=10) as c:
        c.use(TUBE)
        delayed = c.peek_delayed()
        assert delayed is not None
        assert int(c.stats_job(delayed.id)["delay"]) <= 1  # not parked: what the row had left
    assert take(server, 1, timeout=5) == [{"n": "later"}]


def test_one_relay_of_an_outbox_moves_rows_at_a_time(app: App, server: ServerProcess) -> None:
    box = setup(app)
    first = BeanstalkRelay(app.where, address(server))
    second = BeanstalkRelay(app.where, address(server))
    with closing(first), closing(second):
        assert first.relay_once() == 0  # its turn: it holds the lock from now on
        box.put(app.conn, TUBE, {"n": 1})
        app.commit()
        assert second.relay_once() == 0  # waits its turn
        assert app.count() == 1
        assert first.relay_once() == 1
        first.close()
        box.put(app.conn, TUBE, {"n": 2})
        app.commit()
        # PostgreSQL frees the first's session lock when its backend has ended, a moment
        # after the close: the second takes over at one of its next looks
        relayed = 0

        def took_over() -> bool:
            nonlocal relayed
            relayed += second.relay_once()
            return relayed > 0

        until(took_over)
        assert relayed == 1
    assert take(server, 2, timeout=0) == [{"n": 1}, {"n": 2}]


ROWS = [{"n": n, "delay": DELAY if n in (2, 5) else 0} for n in range(7)]
KILLS = [  # the children's deaths, one after the other, before a last relay drains
    ["put-after:1"],  # the probe put: a parked job in the probe tube, no intent yet
    ["put-after:3"],  # the second row's job put, its id not recorded
    ["kick-job-before:1"],  # the ids recorded, no job live
    ["reserve-job-after:1"],  # a delayed row's job reserved: ready early, still once
    ["release-after:1"],  # jobs live (ready, delayed), the rows not deleted yet
    ["put-after:3", "peek-after:1"],  # killed again in the recovery, while adopting
]


@pytest.mark.parametrize("kills", KILLS, ids=["+".join(k) for k in KILLS])
def test_a_relay_killed_at_each_step_leaves_each_row_once(
        app: App, server: ServerProcess, kills: list[str], caplog: pytest.LogCaptureFixture
        ) -> None:
    box = setup(app)
    for values in ROWS:
        box.put(app.conn, TUBE, values, delay=values["delay"])
    app.commit()
    for kill in kills:
        with Child("beanstalk", app.kind, app.where, address(server), "3", kill,
                   program=CHILD) as child:
            assert child.line() == b"ready"
            child.wait()
            assert child.proc.returncode == -signal.SIGKILL, (kill, child.stderr())
    with closing(BeanstalkRelay(app.where, address(server), batch=3)) as r, \
            caplog.at_level(logging.WARNING, "k7core.outbox"):
        relay_all(r)
    ready = take(server, None, timeout=0)
    delayed = take_delayed(server)  # the rest, without waiting
    assert counted(ready + delayed) == counted(ROWS)
    assert all(v["delay"] for v in delayed)
    if any(k.startswith("put-after:3") for k in kills):
        assert "adopted parked job" in caplog.text  # not put again
    assert jobs_left(server) == {}  # no duplicate, no parked job was left behind
    app.rollback()
    assert app.count() == 0 and app.count(f"{app.table}_sent") == 0


def test_the_command_line_relays_into_a_server(app: App, server: ServerProcess) -> None:
    box = setup(app)
    for n in range(3):
        box.put(app.conn, TUBE, {"n": n})
    app.commit()
    proc = subprocess.Popen([str(K7), "outbox", "relay", app.where, address(server)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"relaying k7_outbox to beanstalk://")
        assert take(server, 3) == [{"n": n} for n in range(3)]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert out == b"stopped: 3 jobs relayed\n"


def test_a_relay_task_relays_each_commit_as_it_comes(app: App, server: ServerProcess) -> None:
    """The relay's thread (through ``k7async.run_relay``) wakes at each commit."""
    box = setup(app)

    async def main() -> list[Any]:
        async with anyio.create_task_group() as tg:
            relay = BeanstalkRelay(app.where, address(server))
            await tg.start(k7async.run_relay, relay)
            got = []
            for n in range(3):
                box.put(app.conn, TUBE, {"n": n})
                app.commit()
                got += await anyio.to_thread.run_sync(take, server, 1)
            tg.cancel_scope.cancel()
        assert relay.closed and relay.relayed == 3
        return got

    assert anyio.run(main) == [{"n": n} for n in range(3)]


def test_an_outbox_feeds_one_server_or_store(app: App, server: ServerProcess,
                                            store: JobStore) -> None:
    """A store relay of an outbox a BeanstalkRelay feeds is refused, and the other way
    round after a reset; nothing is relayed twice."""
    box = setup(app)
    box.put(app.conn, TUBE, {"n": 0})
    app.commit()
    with closing(BeanstalkRelay(app.where, address(server))) as r:
        assert relay_all(r) == 1
    box.put(app.conn, TUBE, {"n": 1})
    app.commit()
    with closing(app.relay(store)) as r, pytest.raises(
            OutboxTargetError, match="feeds the beanstalkd server"):
        r.relay_once()
    assert len(store) == 0
    Outbox().reset(app.conn)
    app.commit()
    with closing(app.relay(store)) as r:
        assert relay_all(r) == 1
    box.put(app.conn, TUBE, {"n": 2})
    app.commit()
    with closing(BeanstalkRelay(app.where, address(server))) as r, pytest.raises(
            OutboxTargetError, match="feeds the job store"):
        r.relay_once()
    assert take(server, None, timeout=0) == [{"n": 0}]
    assert payloads(store) == [{"n": 1}] and app.count() == 1


def test_ids_that_went_back_under_a_batch_in_flight_are_refused(
        app: App, server: ServerProcess) -> None:
    """A relay killed with its batch's ids recorded in <table>_sent, then the table's ids
    made to start again: the recovery would take new rows for those recorded; refused."""
    box = setup(app)
    for n in range(3):
        box.put(app.conn, TUBE, {"n": n})
    app.commit()
    with Child("beanstalk", app.kind, app.where, address(server), "3", "kick-job-before:1",
               program=CHILD) as child:
        assert child.line() == b"ready"
        child.wait()
        assert child.proc.returncode == -signal.SIGKILL, child.stderr()
    assert app.count(f"{app.table}_sent") == 3
    if app.kind == "sqlite":
        app.execute("DELETE FROM sqlite_sequence WHERE name = ?", (app.table,))
    else:
        app.execute(f"ALTER SEQUENCE {app.table}_id_seq RESTART")
    app.commit()
    with closing(BeanstalkRelay(app.where, address(server))) as r, pytest.raises(
            OutboxRewoundError, match="went back"):
        r.relay_once()
    assert app.count() == 3 and take(server, None, timeout=0) == []


def test_a_missing_outbox_is_a_clear_error(app: App, server: ServerProcess) -> None:
    with closing(BeanstalkRelay(app.where, address(server))) as r, \
            pytest.raises(FileNotFoundError, match=r"Outbox\.create"):
        r.relay_once()
    app.rollback()
    with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable)):
        app.count(f"{app.table}_sent")  # nothing made in a database without an outbox


def test_a_relay_killed_at_random_moments_leaves_each_row_once(
        app: App, server: ServerProcess) -> None:
    box = setup(app)
    rng = random.Random(f"beanstalk-kill-{app.kind}-{server.name}")
    committed: list[Any] = []
    n = 0
    for _ in range(6):
        with Child("beanstalk", app.kind, app.where, address(server),
                   str(rng.choice([1, 3, 8])), "thread", program=CHILD) as child:
            assert child.line() == b"ready"
            for _ in range(rng.randint(2, 6)):  # while it relays
                rows = [{"n": n + i} for i in range(rng.randint(1, 8))]
                n += len(rows)
                for values in rows:
                    box.put(app.conn, TUBE, values)
                if rng.random() < 0.2:
                    app.rollback()
                else:
                    app.commit()
                    committed += rows
            time.sleep(rng.random() * 0.05)  # a random moment of its relaying
            child.kill_and_drain()
            assert "Traceback" not in child.stderr(), child.stderr()
    with closing(BeanstalkRelay(app.where, address(server))) as r:
        relay_all(r)
    assert counted(take(server, None, timeout=0)) == counted(committed)
    assert jobs_left(server) == {}
    app.rollback()
    assert app.count() == 0 and app.count(f"{app.table}_sent") == 0
