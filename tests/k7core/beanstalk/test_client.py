"""The blocking client (``k7core.beanstalk.Client``) against real servers as child
processes: ours (``k7 serve``) and Debian's beanstalkd 1.12, over TCP and a Unix socket. The
scripted session (``_session.session``) gives the same transcript on both; a reservation goes
back to ready as soon as its connection closes, is quit, or its process is SIGKILLed; and
the connection's failures (a silent server, a closed one, one that is no beanstalkd) close
the client with the error that says so."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k7core import ClosedError, K7Error
from k7core.beanstalk import (
    BeanstalkConnectionError,
    BeanstalkTimeoutError,
    Client,
    DrainingError,
    ProtocolError,
    ReservedJob,
)
from tests._childproc import Child
from tests._queuehelp import wait_until
from tests.k7async.server._proc import DEADLINE, ServerProcess

from ._session import LONG, SERVERS, Transcript, server, session

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=SERVERS)
def served(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[tuple[ServerProcess, str]]:
    with server(request.param, tmp_path) as got:
        yield got


def run_session(address: str) -> list[tuple[str, object]]:
    transcript = Transcript(session())
    with Client(address, timeout=DEADLINE) as client:
        while (step := transcript.step) is not None:
            try:
                result = getattr(client, step.method)(*step.args, **step.kwargs)
            except K7Error as e:
                result = e
            transcript.give(result)
    return transcript.lines


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_session_gives_the_same_on_both_servers(transport: str, tmp_path: Path) -> None:
    got = {}
    for which in ("ours", "real"):
        (tmp_path / which).mkdir()
        with server(f"{which}-{transport}", tmp_path / which) as (_, address):
            got[which] = run_session(address)
    assert len(got["ours"]) > 60
    for n, (ours, real) in enumerate(zip(got["ours"], got["real"], strict=True)):
        assert ours == real, f"step {n}"


@pytest.mark.parametrize("how", ["close", "quit"])
def test_closing_releases_the_reservation_at_once(served: tuple[ServerProcess, str],
                                                  how: str) -> None:
    _, address = served
    with Client(address, timeout=DEADLINE) as other:
        job_id = other.put(b"held", ttr=LONG)
        holder = Client(address, timeout=DEADLINE)
        assert holder.reserve(timeout=0) == ReservedJob(job_id, b"held")
        assert other.reserve(timeout=0) is None
        getattr(holder, how)()
        assert holder.closed
        holder.close()  # idempotent
        holder.quit()
        # ready again now, not in an hour: a reserve that waits gets it
        assert other.reserve(timeout=int(DEADLINE)) == ReservedJob(job_id, b"held")
        with pytest.raises(ClosedError, match="closed"):
            holder.stats()


def test_a_killed_holder_releases_its_reservation_at_once(
        served: tuple[ServerProcess, str]) -> None:
    _, address = served
    with Client(address, timeout=DEADLINE) as other:
        job_id = other.put(b"held", ttr=LONG)
        with Child(address, program="tests.k7core.beanstalk._holder") as child:
            assert child.line() == str(job_id).encode()
            assert other.reserve(timeout=0) is None
            child.kill_and_drain()
        assert other.reserve(timeout=int(DEADLINE)) == ReservedJob(job_id, b"held")


def test_a_reserve_waits_its_time_whatever_the_client_timeout(
        served: tuple[ServerProcess, str]) -> None:
    _, address = served
    with Client(address, timeout=0.1) as client:
        start = time.monotonic()
        assert client.reserve(timeout=1) is None
        assert time.monotonic() - start >= 1.0
        assert client.list_tube_used() == "default"  # and the connection is still good


def test_drain_mode_refuses_puts(served: tuple[ServerProcess, str]) -> None:
    proc, address = served
    with Client(address, timeout=DEADLINE) as client:
        job_id = client.put(b"before")
        proc.signal(signal.SIGUSR1)
        wait_until(lambda: client.stats()["draining"] == "true", DEADLINE, "drain mode")
        with pytest.raises(DrainingError, match=r"put .*: DRAINING: .*drain mode"):
            client.put(b"during")
        assert client.reserve(timeout=0) == ReservedJob(job_id, b"before")  # still served


@pytest.mark.parametrize("how", ["close", "quit"])
def test_close_from_another_thread_ends_a_waiting_reserve(tmp_path: Path, how: str) -> None:
    with ServerProcess.serve(tmp_path / "jobs") as proc:
        address = f"beanstalk://{proc.address[0]}:{proc.address[1]}"
        with Client(address, timeout=DEADLINE) as other:
            waiting = Client(address)  # no timeout: reserve() waits as long as it takes
            got: list[BaseException] = []

            def reserve() -> None:
                try:
                    waiting.reserve()
                except BaseException as e:
                    got.append(e)

            thread = threading.Thread(target=reserve)
            thread.start()
            wait_until(lambda: other.stats()["current-waiting"] == 1, DEADLINE, "the reserve")
            getattr(waiting, how)()
            thread.join(DEADLINE)
            assert [type(e) for e in got] == [ClosedError]
            assert "closed during 'reserve'" in str(got[0])


def test_a_reply_that_does_not_come_closes_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # its backlog completes connects
        host, port = silent.getsockname()[:2]
        client = Client((host, port), timeout=0.2)
        with pytest.raises(BeanstalkTimeoutError, match=r"within 0\.2 s; the client is closed"):
            client.stats()
        assert client.closed
        with pytest.raises(BeanstalkConnectionError, match="broke earlier: 'stats' got"):
            client.stats()
        client.close()
        with pytest.raises(ClosedError):
            client.stats()

        client = Client(f"{host}:{port}", timeout=0.2)
        start = time.monotonic()
        with pytest.raises(BeanstalkTimeoutError, match=r"within 1\.2 s"):
            client.reserve(timeout=1)  # the server's second, then the network's 0.2
        assert time.monotonic() - start >= 1.2
        client.close()


def test_a_server_that_hangs_up_or_is_no_beanstalkd() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()[:2]
        with Client(address, timeout=DEADLINE) as client:
            conn, _ = listener.accept()
            conn.close()
            with pytest.raises(BeanstalkConnectionError, match="broke during 'stats'"):
                client.stats()
            assert client.closed

        with Client(address, timeout=DEADLINE) as client:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                with pytest.raises(ProtocolError, match="no reply to this command"):
                    client.put(b"x")
                assert client.closed
                with pytest.raises(BeanstalkConnectionError, match="broke earlier"):
                    client.put(b"x")


def test_no_server_there() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused
        with pytest.raises(BeanstalkConnectionError, match=r"cannot connect to 127\.0\.0\.1:"):
            Client(unused.getsockname()[:2])
    with pytest.raises(BeanstalkConnectionError, match="cannot connect to unix:/nonexistent"):
        Client("unix:/nonexistent/b.sock")
