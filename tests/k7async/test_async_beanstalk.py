"""The async client (``k7async.beanstalk``) under asyncio and trio, against real servers as
child processes: ours (``k7 serve``) and Debian's beanstalkd 1.12, over TCP and a Unix
socket. The blocking client's scripted session gives the same transcript on both servers
through this client too; closing or cancelling puts the connection's reservation back to
ready at once; a cancelled call breaks the connection, a task cancelled while it waits its
turn does not."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from k7async.beanstalk import AsyncClient, connect
from k7core import ClosedError, K7Error
from k7core.beanstalk import (
    BeanstalkConnectionError,
    BeanstalkTimeoutError,
    ProtocolError,
    ReservedJob,
)
from tests.k7async.server._proc import DEADLINE, ServerProcess
from tests.k7core.beanstalk._session import LONG, SERVERS, Transcript, server, session

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture(params=SERVERS)
def served(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[tuple[ServerProcess, str]]:
    with server(request.param, tmp_path) as got:
        yield got


async def run_session(address: str) -> list[tuple[str, object]]:
    transcript = Transcript(session())
    async with await connect(address, timeout=DEADLINE) as client:
        while (step := transcript.step) is not None:
            try:
                result = await getattr(client, step.method)(*step.args, **step.kwargs)
            except K7Error as e:
                result = e
            transcript.give(result)
    return transcript.lines


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_the_session_gives_the_same_on_both_servers(transport: str,
                                                          tmp_path: Path) -> None:
    got = {}
    for which in ("ours", "real"):
        (tmp_path / which).mkdir()
        with server(f"{which}-{transport}", tmp_path / which) as (_, address):
            got[which] = await run_session(address)
    assert len(got["ours"]) > 60
    for n, (ours, real) in enumerate(zip(got["ours"], got["real"], strict=True)):
        assert ours == real, f"step {n}"


async def hold(address: str, other: AsyncClient) -> tuple[AsyncClient, int]:
    """A new client holding the reservation of a job ``other`` put."""
    job_id = await other.put(b"held", ttr=LONG)
    holder = await connect(address, timeout=DEADLINE)
    assert await holder.reserve(timeout=0) == ReservedJob(job_id, b"held")
    assert await other.reserve(timeout=0) is None
    return holder, job_id


@pytest.mark.parametrize("how", ["aclose", "quit"])
async def test_closing_releases_the_reservation_at_once(served: tuple[ServerProcess, str],
                                                        how: str) -> None:
    _, address = served
    async with await connect(address, timeout=DEADLINE) as other:
        holder, job_id = await hold(address, other)
        await getattr(holder, how)()
        assert holder.closed
        await holder.aclose()  # idempotent
        await holder.quit()
        # ready again now, not in an hour: a reserve that waits gets it
        assert await other.reserve(timeout=int(DEADLINE)) == ReservedJob(job_id, b"held")
        with pytest.raises(ClosedError, match="closed"):
            await holder.stats()


async def test_a_cancelled_call_breaks_the_connection(served: tuple[ServerProcess, str]
                                                      ) -> None:
    """The reserve was sent, its reply may yet come: the client closes the connection, and
    the server puts the job it held back to ready."""
    _, address = served
    async with await connect(address, timeout=DEADLINE) as other:
        holder, job_id = await hold(address, other)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(holder.reserve)  # nothing ready for it: it waits
            await anyio.wait_all_tasks_blocked()  # it sent "reserve" and waits for the reply
            tasks.cancel_scope.cancel()
        assert holder.closed
        with pytest.raises(BeanstalkConnectionError, match="broke earlier: 'reserve' got"):
            await holder.stats()
        assert await other.reserve(timeout=int(DEADLINE)) == ReservedJob(job_id, b"held")
        await holder.aclose()


async def test_calls_take_turns_and_waiting_for_a_turn_can_be_cancelled(tmp_path: Path
                                                                       ) -> None:
    with server("ours-tcp", tmp_path) as (_, address):
        async with await connect(address, timeout=DEADLINE) as other, \
                await connect(address, timeout=DEADLINE) as client:
            got: list[object] = []
            turn = anyio.CancelScope()

            async def reserve() -> None:
                got.append(await client.reserve())

            async def stats() -> None:
                with turn:
                    got.append(await client.stats())

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(reserve)
                await anyio.wait_all_tasks_blocked()  # the reserve waits for a job
                tasks.start_soon(stats)
                await anyio.wait_all_tasks_blocked()  # the stats waits for its turn
                turn.cancel()
                await anyio.wait_all_tasks_blocked()
                assert turn.cancelled_caught and not client.closed
                job_id = await other.put(b"job")
            assert got == [ReservedJob(job_id, b"job")]
            assert (await client.stats())["current-jobs-reserved"] == 1


@pytest.mark.parametrize("how", ["aclose", "quit"])
async def test_aclose_from_another_task_ends_a_waiting_reserve(tmp_path: Path,
                                                               how: str) -> None:
    with server("real-unix", tmp_path) as (_, address):
        client = await connect(address)
        got: list[BaseException] = []

        async def reserve() -> None:
            try:
                await client.reserve()
            except BaseException as e:
                got.append(e)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reserve)
            await anyio.wait_all_tasks_blocked()
            await getattr(client, how)()
        assert [type(e) for e in got] == [ClosedError]
        assert "closed during 'reserve'" in str(got[0])


async def test_a_reply_that_does_not_come_closes_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # its backlog completes connects
        host, port = silent.getsockname()[:2]
        async with await connect((host, port), timeout=0.2) as client:
            with pytest.raises(BeanstalkTimeoutError, match=r"within 0\.2 s; the client is"):
                await client.stats()
            assert client.closed
            with pytest.raises(BeanstalkConnectionError, match="broke earlier: 'stats' got"):
                await client.stats()
        async with await connect(f"beanstalk://{host}:{port}", timeout=0.2) as client:
            start = time.monotonic()
            with pytest.raises(BeanstalkTimeoutError, match=r"within 1\.2 s"):
                await client.reserve(timeout=1)  # the server's second, then the network's
            assert time.monotonic() - start >= 1.2


async def test_a_server_that_hangs_up_or_is_no_beanstalkd() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()[:2]
        async with await connect(address, timeout=DEADLINE) as client:
            conn, _ = listener.accept()
            conn.close()
            with pytest.raises(BeanstalkConnectionError, match="broke during 'stats'"):
                await client.stats()
            assert client.closed

        async with await connect(address, timeout=DEADLINE) as client:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                with pytest.raises(ProtocolError, match="no reply to this command"):
                    await client.put(b"x")
                assert client.closed


async def test_no_server_there() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused
        with pytest.raises(BeanstalkConnectionError, match=r"cannot connect to 127\.0\.0\.1:"):
            await connect(unused.getsockname()[:2])
    with pytest.raises(BeanstalkConnectionError, match="cannot connect to unix:/nonexistent"):
        await connect("unix:/nonexistent/b.sock")
