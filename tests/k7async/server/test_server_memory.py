"""The server's memory per connection is bounded (a server child process, its peak RSS read
from /proc): a client that keeps sending while its reserve waits is not read without limit,
and one that pipelines requests without reading their replies is not answered without
limit (beanstalkd stops reading a connection it is answering). Every way connections are
driven: asyncio protocols run in the loop ("flush") or on the owner thread ("sync"), and
tasks over anyio streams (trio)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k7core.beanstalk import Client

from ._proc import DEADLINE, ServerProcess, Wire

MiB = 1 << 20
BOUND = 64 * MiB
"""The most a server may grow (peak RSS) for one such client."""
STALL = 3.0
"""Seconds without a byte taken that say the server stopped reading."""

CASES = {"asyncio-flush": ("asyncio", "flush"), "asyncio-sync": ("asyncio", "sync"),
         "trio-flush": ("trio", "flush")}


@pytest.fixture(params=list(CASES))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    backend, fsync = CASES[request.param]
    with ServerProcess.serve(tmp_path / "jobs", "--backend", backend, fsync=fsync) as proc:
        yield proc


def peak_rss(server: ServerProcess) -> int:
    """The server's peak resident set (VmHWM), in bytes."""
    text = Path(f"/proc/{server.proc.pid}/status").read_text()
    [line] = [x for x in text.splitlines() if x.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def client(server: ServerProcess) -> Client:
    assert isinstance(server.address, tuple)
    return Client(server.address, timeout=DEADLINE)


def poll(what: str, condition: object) -> None:
    """Wait (bounded) until ``condition()`` is true."""
    deadline = time.monotonic() + DEADLINE
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {DEADLINE} s for {what}"
        threading.Event().wait(0.01)


def push(sock: socket.socket, data: bytes, total: int) -> int:
    """Send ``data`` again and again, up to ``total`` bytes or until the server takes
    nothing for STALL seconds; returns how many bytes it took."""
    sock.setblocking(False)
    sent, view = 0, memoryview(data)
    offset = 0
    while sent < total:
        if not select.select([], [sock], [], STALL)[1]:
            break  # the server stopped reading
        n = sock.send(view[offset:])
        sent += n
        offset = (offset + n) % len(data)
    sock.setblocking(True)
    return sent


def test_input_sent_while_a_reserve_waits_is_not_read_without_limit(
        server: ServerProcess) -> None:
    before = peak_rss(server)
    wire = Wire(server.connect())
    wire.send(b"watch nobody\r\nignore default\r\nreserve\r\n")
    assert wire.line().startswith(b"WATCHING")
    assert wire.line().startswith(b"WATCHING")
    with client(server) as c:
        poll("the reserve to wait", lambda: c.stats()["current-waiting"] == 1)
        body = b"x" * 65000
        put = b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body)
        total = 200 * MiB
        taken = push(wire.sock, put * 16, total)
        grown = peak_rss(server) - before
        assert taken < total, "the server read all 200 MiB while the reserve waited"
        assert grown < BOUND, f"the server grew by {grown / MiB:.0f} MiB"
        c.use("nobody")
        job_id = c.put(b"now")  # the reserve still answers
        assert wire.line() == b"RESERVED %d 3" % job_id
        assert wire.body(3) == b"now"
        for _ in range(3):  # then the puts sent behind it are read and run
            assert wire.line().startswith(b"INSERTED ")
    wire.sock.close()


def test_pipelined_requests_whose_replies_are_not_read_are_not_answered_without_limit(
        server: ServerProcess) -> None:
    n = 2000  # replies of 64 KiB: 125 MiB if answered at once
    with client(server) as c:
        job_id = c.put(b"j" * 65535)
        before = peak_rss(server)
        wire = Wire(server.connect())
        wire.send(b"peek %d\r\n" % job_id * n)

        last = [-1]

        def settled() -> bool:  # answered as far as it goes while nothing is read
            now = int(c.stats()["cmd-peek"])
            if now == last[0]:
                return True
            last[0] = now
            threading.Event().wait(0.5)
            return False

        poll("the server to stop answering", settled)
        grown = peak_rss(server) - before
        assert grown < BOUND, f"the server grew by {grown / MiB:.0f} MiB ({last[0]} peeks)"
        for _ in range(n):  # every reply comes, in order, once read
            assert wire.line() == b"FOUND %d 65535" % job_id
            assert wire.body(65535) == b"j" * 65535
        grown = peak_rss(server) - before
        assert grown < BOUND, f"the server grew by {grown / MiB:.0f} MiB"
        assert int(c.stats()["cmd-peek"]) == n
    wire.sock.close()
