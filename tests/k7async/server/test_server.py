"""The server in this process (asyncio and trio): waiting reserves in the event loop with no
thread each, reservations released when a connection goes, DEADLINE_SOON, TIMED_OUT on a
hang-up, delays and pauses that wake waiting reserves, drain mode, stop."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from k7async.server import Listen, Server, ServerConfig, serve
from k7async.server._session import ServerState, Session
from k7core.beanstalk import Reply, ReplyParser, put_command
from k7core.jobs import CLOCK_RECHECK, JOURNAL_SEGMENT, JobStore

pytestmark = pytest.mark.anyio


class Client:
    """A raw protocol client over one connection."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.parser = ReplyParser()

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def reply(self) -> Reply:
        while (got := self.parser.next()) is None:
            self.parser.feed(await self.stream.receive())
        return got

    async def ask(self, data: bytes) -> Reply:
        await self.send(data)
        return await self.reply()


@pytest.fixture(params=["flush", "sync"])
def fsync(request: pytest.FixtureRequest) -> str:
    """Both ways a connection's requests run under asyncio: in the event loop ("flush") and
    on the store's owner thread, one hand-over per loop turn ("sync")."""
    return str(request.param)


@asynccontextmanager
async def running(tmp_path: Path, **opts: object) -> AsyncIterator[Server]:
    started: list[Server] = []
    ready = anyio.Event()

    def on_ready(server: Server) -> None:
        started.append(server)
        ready.set()

    config = ServerConfig(tmp_path / "jobs", listen=(Listen("127.0.0.1", 0),), signals=False,
                          **opts)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve(config, on_ready=on_ready))
        await ready.wait()
        try:
            yield started[0]
        finally:
            started[0].stop()


@asynccontextmanager
async def connect(server: Server) -> AsyncIterator[Client]:
    host, port = server.addresses[0].rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        yield Client(stream)


async def test_waiting_reserves_take_no_thread_each(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as producer:
        await producer.ask(b"list-tubes\r\n")  # the server is warm (its threads exist)
        threads = set(threading.enumerate())
        n = 150
        got: list[Reply] = []

        async def worker() -> None:
            async with connect(server) as c:
                got.append(await c.ask(b"reserve\r\n"))
                assert got[-1].word == "RESERVED"
                assert (await c.ask(b"delete %s\r\n" % got[-1].args[0].encode())
                        ).word == "DELETED"

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(worker)
            with anyio.fail_after(20):
                while b"current-waiting: %d\n" % n not in (
                        (await producer.ask(b"stats\r\n")).body or b""):
                    await anyio.sleep(0.01)  # until the server counts them all waiting
            assert set(threading.enumerate()) <= threads  # 150 waiting, no thread each
            for i in range(n):
                assert (await producer.ask(put_command(b"job %d" % i))).word == "INSERTED"
        assert sorted(r.body or b"" for r in got) == sorted(b"job %d" % i for i in range(n))


async def test_a_closed_connection_releases_its_jobs_at_once(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as b:
        async with connect(server) as a:
            assert (await a.ask(put_command(b"x", ttr=3600))).word == "INSERTED"
            job = await a.ask(b"reserve\r\n")
            assert job.word == "RESERVED"
        with anyio.fail_after(10):  # long before its time-to-run of an hour
            again = await b.ask(b"reserve\r\n")
        assert (again.word, again.args, again.body) == ("RESERVED", job.args, b"x")
        stats = await b.ask(b"stats-job %s\r\n" % job.args[0].encode())
        assert stats.body is not None and b"\nreserves: 2\n" in stats.body


async def test_quit_releases_too(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as b:
        async with connect(server) as a:
            await a.ask(put_command(b"x", ttr=3600))
            job = await a.ask(b"reserve\r\n")
            await a.send(b"quit\r\n")
            with pytest.raises(anyio.EndOfStream):  # closed by the server
                await a.stream.receive()
        with anyio.fail_after(10):
            assert (await b.ask(b"reserve\r\n")).args == job.args


async def test_deadline_soon_for_a_waiting_reserve(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c:
        await c.ask(put_command(b"short", ttr=2))
        assert (await c.ask(b"reserve\r\n")).word == "RESERVED"
        with anyio.fail_after(5):
            assert (await c.ask(b"reserve\r\n")).word == "DEADLINE_SOON"
        assert (await c.ask(b"reserve-with-timeout 0\r\n")).word == "DEADLINE_SOON"


async def test_timed_out_and_hang_up(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server:
        async with connect(server) as c:
            assert (await c.ask(b"reserve-with-timeout 0\r\n")).word == "TIMED_OUT"
            assert (await c.ask(b"reserve-with-timeout 1\r\n")).word == "TIMED_OUT"
            await c.send(b"reserve\r\n")
            await c.stream.send_eof()  # half-closed while waiting: beanstalkd says TIMED_OUT
            with anyio.fail_after(5):
                assert (await c.reply()).word == "TIMED_OUT"
        async with connect(server) as c:
            assert (await c.ask(b"stats\r\n")).body is not None


async def test_a_delay_and_a_pause_wake_waiting_reserves(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c, connect(server) as w:
        assert (await c.ask(put_command(b"later", delay=1))).word == "INSERTED"
        with anyio.fail_after(5):
            assert (await w.ask(b"reserve\r\n")).body == b"later"
        assert (await c.ask(b"pause-tube default 1\r\n")).word == "PAUSED"
        await c.ask(put_command(b"after the pause"))
        assert (await w.ask(b"reserve-with-timeout 0\r\n")).word == "TIMED_OUT"
        with anyio.fail_after(5):
            assert (await w.ask(b"reserve\r\n")).body == b"after the pause"


async def test_pipelined_commands_wait_behind_a_reserve(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c, connect(server) as p:
        await c.send(b"reserve\r\nlist-tube-used\r\nuse other\r\n")
        await p.ask(put_command(b"go"))
        assert [(await c.reply()).word for _ in range(3)] == ["RESERVED", "USING", "USING"]


async def test_drain_mode(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c:
        assert (await c.ask(put_command(b"before"))).word == "INSERTED"
        server.drain()
        assert (await c.ask(put_command(b"after"))).word == "DRAINING"
        stats = await c.ask(b"stats\r\n")
        assert stats.body is not None and b"\ndraining: true\n" in stats.body
        assert (await c.ask(b"reserve-with-timeout 0\r\n")).body == b"before"


@pytest.mark.parametrize("fsync", ["flush", "sync"])
async def test_many_connections_put_at_once(tmp_path: Path, fsync: str) -> None:
    """Under "sync" the runs of every connection at a moment share one msync; each reply
    still comes only after its own put is durable (test_crash checks durability)."""
    async with running(tmp_path, fsync=fsync) as server:
        ids: list[int] = []

        async def producer(k: int) -> None:
            async with connect(server) as c:
                await c.send(b"".join(put_command(b"%d-%d" % (k, i)) for i in range(20)))
                for _ in range(20):
                    r = await c.reply()
                    assert r.word == "INSERTED"
                    ids.append(int(r.args[0]))

        async with anyio.create_task_group() as tg:
            for k in range(30):
                tg.start_soon(producer, k)
        assert len(set(ids)) == 600
        async with connect(server) as c:
            stats = await c.ask(b"stats\r\n")
            assert stats.body is not None and b"\ncurrent-jobs-ready: 600\n" in stats.body


async def test_stop_ends_serve_and_the_store_reopens(tmp_path: Path, fsync: str) -> None:
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c:
        job = await c.ask(put_command(b"kept"))
    assert server.stopped.is_set()
    async with running(tmp_path, fsync=fsync) as server, connect(server) as c:
        assert (await c.ask(b"peek %s\r\n" % job.args[0].encode())).body == b"kept"


async def test_metrics(tmp_path: Path, fsync: str) -> None:
    from prometheus_client.registry import CollectorRegistry

    from k7async.server.metrics import ServerCollector

    async with running(tmp_path, fsync=fsync) as server, connect(server) as c:
        registry = CollectorRegistry()
        ServerCollector(server, registry=registry)
        await c.ask(put_command(b"x"))
        await c.ask(b"reserve-with-timeout 0\r\n")
        value = registry.get_sample_value
        assert value("k7_server_connections") == 1
        assert value("k7_server_connections_total") == 1
        assert value("k7_server_commands_total", {"command": "put"}) == 1
        assert value("k7_server_commands_total", {"command": "reserve-with-timeout"}) == 1
        assert value("k7_server_commands_total", {"command": "delete"}) == 0
        assert value("k7_server_draining") == 0


def test_a_waiting_reserve_reads_the_clock_again_for_deadline_soon(tmp_path: Path) -> None:
    """A waiting reserve sleeps until DEADLINE_SOON is due, by the store's clock; the clock
    can jump (a step of the wall clock), so it sleeps at most CLOCK_RECHECK before looking
    again, not the whole distance read before the jump."""
    now = [1_000_000.0]
    with JobStore(tmp_path / "jobs", clock=lambda: now[0]) as store:
        session = Session(ServerState(store, 65535, JOURNAL_SEGMENT))
        job_id = store.put(b"long", ttr=3600)
        assert session.owner.reserve(timeout=0) is not None
        assert session.try_reserve() is None  # the reserve waits
        wake = session.wake_in()
        assert wake is not None and 0 < wake <= CLOCK_RECHECK
        now[0] += 3599.5  # a jump: the reservation is now inside the margin
        assert session.try_reserve() == b"DEADLINE_SOON\r\n"
        session.owner.delete(job_id)
        session.close()
