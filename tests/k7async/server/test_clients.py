"""Real beanstalkd clients (greenstalk, pystalk, from PyPI) against the server as a child
process: scripted sessions over TCP and a Unix socket, drain mode (SIGUSR1), a clean stop
(SIGTERM) after which a restart has every acknowledged job, k7-beanstalkd's flags, and the
greenstalk example."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import greenstalk
import pystalk
import pytest

import k7beanstalkd
from k7core.beanstalk import DEFAULT_MAX_JOB_SIZE, DEFAULT_PORT
from tests._queuehelp import ROOT, child_env, run_python

from ._proc import DEADLINE, K7_BEANSTALKD, ServerProcess

pytestmark = pytest.mark.timeout(60)


def test_greenstalk_session(tmp_path: Path) -> None:
    with ServerProcess.serve(tmp_path / "jobs") as server, \
            greenstalk.Client(server.address, use="emails", watch="emails") as c:
        assert (c.using(), c.watching()) == ("emails", ["emails"])
        a = c.put("first", priority=10, ttr=60)
        b = c.put("second", priority=5)
        d = c.put("later", delay=3600)
        assert c.peek(a).body == "first"
        assert c.peek_ready().id == b  # the most urgent
        assert c.peek_delayed().id == d

        job = c.reserve(timeout=0)
        assert (job.id, job.body) == (b, "second")
        c.touch(job)
        assert c.stats_job(job)["state"] == "reserved"
        c.release(job, priority=20)  # now behind "first"
        job = c.reserve(timeout=0)
        assert job.id == a
        c.bury(job, priority=10)
        assert c.peek_buried().id == a
        assert c.stats_tube("emails")["current-jobs-buried"] == 1
        assert c.kick(10) == 1
        assert c.stats_job(a)["state"] == "ready"
        job = c.reserve(timeout=0)
        assert job.id == a
        c.delete(job)
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(a)
        c.kick_job(d)  # delayed -> ready
        assert c.stats_job(d)["state"] == "ready"

        assert c.watch("other") == 2
        assert c.ignore("emails") == 1
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)  # "other" is empty
        with pytest.raises(greenstalk.NotIgnoredError):
            c.ignore("other")
        assert c.watch("emails") == 2
        assert sorted(c.tubes()) == ["default", "emails", "other"]

        stats = c.stats()
        assert (stats["current-jobs-ready"], stats["cmd-put"], stats["total-jobs"]) == (2, 3, 3)
        assert [c.reserve(timeout=0).body for _ in range(2)] == ["second", "later"]
        c.use("default")
        assert c.using() == "default"
        assert c.stats()["current-jobs-reserved"] == 2


def test_pystalk_session(tmp_path: Path) -> None:
    with ServerProcess.serve(tmp_path / "jobs") as server:
        assert not isinstance(server.address, str)
        client = pystalk.BeanstalkClient(*server.address, socket_timeout=DEADLINE)
        try:
            with client.using("work") as inserter:
                _, first = inserter.put_job("one", pri=10)
                _, second = inserter.put_job("two", pri=20)
                inserter.put_job("three", pri=30, delay=3600)
            assert client.current_tube == "default"
            client.watch("work")  # and, as pystalk does, ignore "default"
            assert client.watchlist == {"work"}
            client.use("work")  # peek-* look at the tube used
            assert client.peek_ready().job_id == first
            assert client.peek_delayed().job_data == b"three"

            job = client.reserve_job(0)
            assert (job.job_id, job.job_data) == (first, b"one")
            client.release_job(job, pri=40)
            job = client.reserve_job(0)
            assert job.job_id == second
            client.bury_job(job)
            assert client.peek_buried().job_id == second
            assert client.kick_jobs(5) == (b"KICKED", 1)
            assert [j.job_id for j in client.reserve_iter()] == [first, second]
            client.delete_job(first)
            client.bury_job(second)
            client.kick_job(second)
            assert client.stats_job(second)["state"] == "ready"

            stats = client.stats_tube("work")
            assert (stats["current-jobs-ready"], stats["current-jobs-delayed"]) == (1, 1)
            assert client.stats()["cmd-delete"] == 1
            assert "work" in client.list_tubes()
            client.watch("default")
            client.ignore("work")  # "default" is empty
            with pytest.raises(pystalk.BeanstalkError) as err:
                client.ignore("default")  # the last one
            assert err.value.message == "NOT_IGNORED"
            with pytest.raises(pystalk.BeanstalkError) as err:
                client.reserve_job(0)
            assert err.value.message == "TIMED_OUT"
            with pytest.raises(pystalk.BeanstalkError):
                client.stats_tube("never-used")  # NOT_FOUND
        finally:
            client.close()


def test_greenstalk_over_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "k7.sock"
    with ServerProcess.beanstalkd("-l", f"unix:{path}", "-b", str(tmp_path / "jobs")) as server:
        assert server.address == str(path)
        with greenstalk.Client(str(path), encoding=None) as c:
            ids = [c.put(bytes([i]) * 3) for i in range(3)]
            jobs = [c.reserve(timeout=0) for _ in ids]
            assert [(j.id, j.body) for j in jobs] == [(i, bytes([n]) * 3)
                                                     for n, i in enumerate(ids)]
            for j in jobs:
                c.delete(j)
            assert c.stats()["current-jobs-ready"] == 0
        assert server.stop() == 0


def test_drain_then_stop_then_restart_keeps_every_acknowledged_job(tmp_path: Path) -> None:
    directory = tmp_path / "jobs"
    with ServerProcess.serve(directory) as server, greenstalk.Client(server.address) as c:
        ready = c.put("ready", priority=7)
        delayed = c.put("delayed", delay=3600)
        buried = c.put("buried")
        reserved = c.put("reserved")
        gone = c.put("deleted")
        for job_id in (buried, reserved, gone):
            c.reserve_job(job_id)
        c.bury(greenstalk.Job(buried, ""))
        c.delete(gone)

        server.signal(signal.SIGUSR1)
        for _ in range(100_000):  # a round trip per look: no sleep
            if c.stats()["draining"] == "true":
                break
        else:
            pytest.fail("SIGUSR1 did not put the server in drain mode")
        with pytest.raises(greenstalk.DrainingError):
            c.put("refused")
        assert c.peek(ready).body == "ready"  # everything else still works
        assert server.stop() == 0  # while "reserved" is still reserved

    with ServerProcess.serve(directory) as server, greenstalk.Client(server.address) as c:
        states = {job_id: (c.peek(job_id).body, c.stats_job(job_id)["state"])
                  for job_id in (ready, delayed, buried, reserved)}
        assert states == {ready: ("ready", "ready"), delayed: ("delayed", "delayed"),
                          buried: ("buried", "buried"), reserved: ("reserved", "ready")}
        assert c.stats_job(ready)["pri"] == 7
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(gone)
        stats = c.stats()
        assert stats["draining"] == "false"  # drain mode is not kept
        assert sum(stats[k] for k in ("current-jobs-ready", "current-jobs-delayed",
                                      "current-jobs-buried", "current-jobs-reserved")) == 4
        assert c.put("after") > gone  # ids are not reused
        assert server.stop() == 0


def run_beanstalkd(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([K7_BEANSTALKD, *flags], capture_output=True, text=True,
                          timeout=DEADLINE, check=False)


def test_k7_beanstalkd_version() -> None:
    done = run_beanstalkd("-v")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("beanstalkd 1.12"), done.stdout


def test_k7_beanstalkd_binds_before_it_loads_the_server(tmp_path: Path) -> None:
    """At the moment ``k7-beanstalkd`` binds its socket (an audit hook sees the bind), none
    of the server's modules is loaded: their imports (~0.2 s) come after it."""
    out = run_python(
        "import os, sys, k7beanstalkd\n"
        "def hook(event, args):\n"
        "    if event == 'socket.bind':\n"
        "        print(sorted(m for m in sys.modules\n"
        "                     if m.split('.')[0] in ('k7core', 'k7async', 'anyio')), flush=True)\n"
        "        os._exit(0)\n"
        "sys.addaudithook(hook)\n"
        "k7beanstalkd.main(sys.argv[1:])\n",
        "-l", "127.0.0.1", "-p", "0", "-b", str(tmp_path / "jobs"))
    assert out.strip() == "[]", out
    defaults = k7beanstalkd.parser().parse_args([])
    assert (defaults.port, defaults.max_job_size) == (DEFAULT_PORT, DEFAULT_MAX_JOB_SIZE)


def test_an_unknown_driver_setting_is_refused_clearly(tmp_path: Path) -> None:
    done = subprocess.run([K7_BEANSTALKD, "-l", "127.0.0.1", "-p", "0", "-b", str(tmp_path)],
                          capture_output=True, text=True, timeout=DEADLINE, check=False,
                          env=dict(os.environ, K7_SERVER_DRIVER="fast"))
    assert done.returncode != 0 and not done.stdout, done
    assert "K7_SERVER_DRIVER='fast'" in done.stderr and "Traceback" not in done.stderr, done


def test_a_client_that_connects_during_start_up_is_served(tmp_path: Path) -> None:
    """Client test suites connect 0.1 s after starting the server: the kernel queues such a
    connection (the socket is bound first), and it is answered once the server runs."""
    path = tmp_path / "early.sock"
    with ServerProcess.start_only([K7_BEANSTALKD, "-l", f"unix:{path}"]) as server:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                assert time.monotonic() < deadline and server.proc.poll() is None, \
                    server.stderr()
                time.sleep(0.001)  # polling for another process's bind: no event to wait on
        with sock:
            assert not server.said_anything(), "connected only once the server was ready"
            sock.settimeout(DEADLINE)
            sock.sendall(b"put 0 0 60 5\r\nearly\r\nreserve\r\n")
            replies = b""
            while not replies.endswith(b"early\r\n"):
                chunk = sock.recv(4096)
                assert chunk, replies
                replies += chunk
            assert replies.startswith(b"INSERTED "), replies
            assert b"\r\nRESERVED " in replies, replies


def test_k7_beanstalkd_keeps_a_file_that_is_not_a_socket(tmp_path: Path) -> None:
    other = tmp_path / "not-a-socket"
    other.write_text("keep me")
    done = run_beanstalkd("-l", f"unix:{other}")
    assert done.returncode != 0 and str(other) in done.stderr, done
    assert other.read_text() == "keep me"


@pytest.mark.parametrize(("flags", "says"), [
    (("-Q",), "-Q"),
    (("-p", "port"), "-p"),
    (("-p", "99999"), "-p"),
    (("-l", "unix:"), "unix:"),
    (("-u", "no-such-user-k7"), "no-such-user-k7"),
    (("-b", __file__), __file__),  # not a directory
])
def test_k7_beanstalkd_bad_flag(flags: tuple[str, ...], says: str) -> None:
    done = run_beanstalkd(*flags)
    assert done.returncode != 0
    assert says in done.stderr and not done.stdout, done
    assert "Traceback" not in done.stderr and "listen" not in done.stderr, done.stderr


def test_k7_beanstalkd_caps_the_job_size_as_beanstalkd_does() -> None:
    with ServerProcess.beanstalkd("-l", "127.0.0.1", "-p", "0", "-z", "2000000000") as server, \
            greenstalk.Client(server.address) as c:
        limit = c.stats()["max-job-size"]
        assert 0 < limit < 2_000_000_000
        assert c.put("x" * limit) > 0
        with pytest.raises(greenstalk.JobTooBigError):
            c.put("x" * (limit + 1))
        assert f"maximum job size was set to {limit}" in server.stderr()


def test_greenstalk_example() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "beanstalk_greenstalk.py")],
                          capture_output=True, text=True, timeout=DEADLINE, check=False,
                          env=child_env())
    assert done.returncode == 0, done.stderr
    assert "server stopped (exit 0)" in done.stdout and "deleted job" in done.stdout, done.stdout
