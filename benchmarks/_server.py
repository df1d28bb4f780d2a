"""beanstalkd servers side by side: Debian's beanstalkd 1.12 against ours (``k7async.server``
over ``k7core.jobs``), driven by the same load generator. Every case name starts with
``server`` (``python -m benchmarks --only server``).

Servers (child processes on 127.0.0.1, data under the case's temporary directory, stopped by
SIGTERM), each in beanstalkd's own flags:

- ``beanstalkd -b``: ``beanstalkd -b DIR`` (binlog, fsync at most every 50 ms; os buffered);
- ``beanstalkd -b -f0``: ``beanstalkd -b DIR -f 0`` (an fsync of every record before the
  reply; fsync per put);
- ``k7 flush``: ``python -m k7async.server -b DIR -F`` (k7's ``"flush"``: the job is in the
  mmap before the reply; os buffered);
- ``k7 sync``: ``python -m k7async.server -b DIR -f 0`` (``"sync"``: msync before the reply,
  one msync for the requests of every connection at that moment; fsync per put).

The load generator: client processes (multiprocessing, ``spawn``) on plain blocking
sockets (:class:`~benchmarks._jobs.BeanstalkClient`), none of k7's code on the client side.
Each run is time-bounded: the processes connect, meet at a barrier, then work for
``seconds``; a pipelined connection keeps ``depth`` requests in flight and, at the deadline,
reads the replies still owed. jobs/s = the jobs of every process / (last end - first start);
each run starts a fresh server on a fresh directory. Cases, for every server:

- ``put``: P processes, one connection each, one put at a time (``put 1024 0 60 100``);
- ``put pipelined``: the same with ``depth`` puts in flight per connection;
- ``reserve+delete`` and ``reserve+delete pipelined``: the directory is a copy of one
  prefilled once per case (by the same program with its os-buffered flags), then P processes
  ``reserve-with-timeout 0`` + ``delete`` (pipelined: ``depth`` reserves, then their
  deletes) until the deadline or the tube is empty;
- ``put latency``: one connection, one put at a time: p50 and p99 in µs, and its jobs/s;
- ``put, N connections`` (the fsync-per-put servers only: group commit needs concurrency):
  N connections spread over the P processes, one put in flight on each.

Each throughput case also records the server's CPU time per job (user + system, from
``/proc/PID/stat``): what a job costs the server, whatever the clients cost.
"""

from __future__ import annotations

import multiprocessing
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from ._harness import Case, Run, Samples, Skipped, percentile
from ._jobs import BODY, FSYNC_PER_PUT, OS_BUFFERED, BeanstalkClient, BeanstalkdServer

PUT = b"put 1024 0 60 %d\r\n%b\r\n" % (len(BODY), BODY)
RESERVE = b"reserve-with-timeout 0\r\n"


@dataclass(frozen=True)
class Server:
    name: str
    k7: bool  # ours (python -m k7async.server) or beanstalkd
    flags: tuple[str, ...]  # beanstalkd's durability flags
    fill_flags: tuple[str, ...]  # the os-buffered flags that prefill its directory
    durability: str
    setting: str


BEANSTALKD = Server("beanstalkd -b", False, (), (), OS_BUFFERED,
                    "beanstalkd -b DIR: binlog, fsync at most every 50 ms")
BEANSTALKD_F0 = Server("beanstalkd -b -f0", False, ("-f", "0"), (), FSYNC_PER_PUT,
                       "beanstalkd -b DIR -f 0: fsync of every record before the reply")
K7_FLUSH = Server("k7 flush", True, ("-F",), ("-F",), OS_BUFFERED,
                  "k7-beanstalkd -b DIR -F (fsync flush): in the mmap before the reply")
K7_SYNC = Server("k7 sync", True, ("-f", "0"), ("-F",), FSYNC_PER_PUT,
                 "k7-beanstalkd -b DIR -f 0 (fsync sync): msync before the reply, group commit")
SERVERS = (BEANSTALKD, BEANSTALKD_F0, K7_FLUSH, K7_SYNC)


@dataclass(frozen=True)
class Sizes:
    seconds: float  # each measured run
    procs: int  # client processes
    depth: int  # pipelined: requests in flight per connection
    conns: int  # the many-connections case: connections over the processes
    prefill: int  # ready jobs before reserve+delete


QUICK = Sizes(seconds=0.1, procs=2, depth=8, conns=8, prefill=1_000)
FULL = Sizes(seconds=2.0, procs=4, depth=64, conns=100, prefill=150_000)


# Record names (benchmarks/targets.py builds the same names).
def put_name(server: str, procs: int) -> str:
    return f"server {server} put, {procs} clients"


def pipelined_name(server: str, procs: int, depth: int) -> str:
    return f"server {server} put pipelined {depth}, {procs} clients"


def take_name(server: str, procs: int, depth: int = 1) -> str:
    pipelined = f" pipelined {depth}" if depth > 1 else ""
    return f"server {server} reserve+delete{pipelined}, {procs} clients"


def latency_name(server: str) -> str:
    return f"server {server} put latency, 1 client"


def conns_name(server: str, conns: int) -> str:
    return f"server {server} put, {conns} connections"


# ----------------------------------------------------------------------------- servers


class K7Server:
    """``python -m k7async.server -l 127.0.0.1 -p 0 -b DIR [flags]`` (``k7-beanstalkd``) as
    a child process; the port is the one it prints. ``prefix``: a command to run it under
    (``python -m cProfile -o FILE``, say) instead of the plain interpreter."""

    def __init__(self, directory: Path, flags: tuple[str, ...],
                 prefix: tuple[str, ...] = (sys.executable,)) -> None:
        log = open(directory.parent / "k7-server.log", "ab")  # noqa: SIM115 (the child's)
        with log:
            self.proc = subprocess.Popen(
                [*prefix, "-m", "k7async.server", "-l", "127.0.0.1", "-p", "0", "-b",
                 str(directory), *flags],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"k7 server did not start ({line!r}); see {log.name}")
        self.port = int(line.rsplit(":", 1)[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


ServerProcess = K7Server | BeanstalkdServer


def start(server: Server, directory: Path, flags: tuple[str, ...] | None = None
          ) -> ServerProcess:
    flags = server.flags if flags is None else flags
    if server.k7:
        return K7Server(directory, flags)
    return BeanstalkdServer(directory, flags)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def put_pipelined(client: BeanstalkClient, n: int, window: int = 256, put: bytes = PUT
                  ) -> None:
    """``n`` puts (the command ``put``) on one connection, ``window`` at a time (the
    prefill)."""
    while n > 0:
        k = min(n, window)
        client.sock.sendall(put * k)
        for _ in range(k):
            line = client.rfile.readline(256)
            if not line.startswith(b"INSERTED "):
                raise RuntimeError(f"prefill put: {line!r}")
        n -= k


# ------------------------------------------------------------------------- the clients


@dataclass(frozen=True)
class Load:
    """What one client process does in one run."""

    kind: str  # "put", "take" or "latency"
    port: int
    seconds: float
    conns: int = 1  # connections of this process
    depth: int = 1  # requests in flight per connection


@dataclass(frozen=True)
class Result:
    jobs: int
    t0: float  # time.monotonic() at the barrier's release
    t1: float  # after the last reply
    latencies: tuple[float, ...] = ()  # µs, sorted ("latency" only)


def _put_one(client: BeanstalkClient, deadline: float) -> int:
    sendall, readline, n = client.sock.sendall, client.rfile.readline, 0
    while time.monotonic() < deadline:
        sendall(PUT)
        if not readline(256).startswith(b"INSERTED "):
            raise RuntimeError("put: not INSERTED")
        n += 1
    return n


def _put_latency(client: BeanstalkClient, deadline: float) -> list[float]:
    sendall, readline, clock = client.sock.sendall, client.rfile.readline, time.perf_counter
    out: list[float] = []
    end = deadline - time.monotonic() + clock()  # the deadline on the perf_counter clock
    while (t := clock()) < end:
        sendall(PUT)
        if not readline(256).startswith(b"INSERTED "):
            raise RuntimeError("put: not INSERTED")
        out.append((clock() - t) * 1e6)
    return out


def _put_many(clients: list[BeanstalkClient], depth: int, deadline: float) -> int:
    """Puts on every connection, ``depth`` in flight on each, until the deadline; then the
    replies still owed. Each reply must be ``INSERTED <id>``."""
    sel = selectors.DefaultSelector()
    owed: dict[socket.socket, list[Any]] = {}  # sock -> [replies owed, partial line]
    for c in clients:
        c.sock.sendall(PUT * depth)
        owed[c.sock] = [depth, b""]
        sel.register(c.sock, selectors.EVENT_READ)
    n, stopping, pending = 0, False, depth * len(clients)
    while pending:
        for key, _ in sel.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            state = owed[sock]
            data = state[1] + sock.recv(65536)
            if not data:
                raise RuntimeError("put: connection closed")
            cut = data.rfind(b"\r\n") + 2
            got = data.count(b"\r\n", 0, cut)
            if data.count(b"INSERTED ", 0, cut) != got:
                raise RuntimeError(f"put: a reply other than INSERTED in {data[:cut]!r}")
            state[1] = data[cut:]
            state[0] -= got
            n += got
            pending -= got
            stopping = stopping or time.monotonic() >= deadline
            if got and not stopping:
                sock.sendall(PUT * got)
                state[0] += got
                pending += got
    sel.close()
    return n


def _take(client: BeanstalkClient, depth: int, deadline: float) -> int:
    """``depth`` reserves, then their deletes, until the deadline or the tube is empty."""
    sendall, readline, read = client.sock.sendall, client.rfile.readline, client.rfile.read
    reserves, n = RESERVE * depth, 0
    while time.monotonic() < deadline:
        sendall(reserves)
        ids: list[bytes] = []
        for _ in range(depth):
            line = readline(256)
            if line.startswith(b"RESERVED "):
                _, job_id, size = line.split()
                read(int(size) + 2)
                ids.append(job_id)
            elif line != b"TIMED_OUT\r\n":
                raise RuntimeError(f"reserve: {line!r}")
        if ids:
            sendall(b"".join(b"delete %b\r\n" % i for i in ids))
            for _ in ids:
                if readline(256) != b"DELETED\r\n":
                    raise RuntimeError("delete: not DELETED")
            n += len(ids)
        if len(ids) < depth:
            break  # the tube is empty
    return n


def _serve_loads(pipe: Connection, barrier: Barrier) -> None:
    """A client process: runs each :class:`Load` it receives, answers a :class:`Result`
    (or the text of the exception); ``None`` ends it."""
    while (load := pipe.recv()) is not None:
        clients: list[BeanstalkClient] = []
        try:
            clients = [BeanstalkClient(load.port) for _ in range(load.conns)]
            barrier.wait()
            t0 = time.monotonic()
            deadline = t0 + load.seconds
            latencies: list[float] = []
            if load.kind == "latency":
                latencies = _put_latency(clients[0], deadline)
                n = len(latencies)
            elif load.kind == "take":
                n = _take(clients[0], load.depth, deadline)
            elif load.conns == 1 and load.depth == 1:
                n = _put_one(clients[0], deadline)
            else:
                n = _put_many(clients, load.depth, deadline)
            pipe.send(Result(n, t0, time.monotonic(), tuple(sorted(latencies))))
        except BaseException:
            barrier.abort()
            pipe.send(traceback.format_exc())
        finally:
            for c in clients:
                c.close()


class Clients:
    """``procs`` client processes (spawned once, used by every run of a case)."""

    def __init__(self, procs: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(procs + 1)
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(procs):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_serve_loads, args=(theirs, self.barrier), daemon=True)
            p.start()
            theirs.close()
            self.pipes.append(mine)
            self.procs.append(p)

    def run(self, loads: list[Load]) -> list[Result]:
        """One :class:`Load` for each of the first ``len(loads)`` processes, released
        together."""
        if len(loads) < len(self.procs):  # the others pass the barrier with no work
            raise ValueError("one load per client process")
        for pipe, load in zip(self.pipes, loads, strict=True):
            pipe.send(load)
        with suppress(Exception):  # a client failed: its message is below
            self.barrier.wait(timeout=120)
        out = [pipe.recv() for pipe in self.pipes]
        errors = [r for r in out if isinstance(r, str)]
        if errors:
            self.barrier.reset()
            raise RuntimeError(f"{len(errors)} client(s) failed:\n{errors[0]}")
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            with suppress(OSError):
                pipe.send(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def rate(results: list[Result]) -> float:
    return sum(r.jobs for r in results) / (max(r.t1 for r in results) -
                                          min(r.t0 for r in results))


# ------------------------------------------------------------------------------ cases


def _params(server: Server, **extra: Any) -> dict[str, Any]:
    return {"body": len(BODY), **extra, "durability": server.durability,
            "setting": server.setting}


def _case(server: Server, name: str, procs: int, prefill: int,
          measure: Callable[[Clients, int], list[Result]], params: dict[str, Any],
          extra: Callable[[list[Result]], Samples] | None = None) -> Case:
    """A case: ``procs`` client processes for all its runs; each run a fresh server on a
    fresh directory (a copy of one holding ``prefill`` ready jobs, when > 0) and
    ``measure(clients, port)``. Records jobs/s and the server's CPU µs per job (and
    ``extra(results)``)."""

    @contextmanager
    def setup(root: Path) -> Iterator[Run]:
        template = root / "template" / "data"
        template.mkdir(parents=True)
        if prefill:
            filler = start(server, template, server.fill_flags)
            try:
                client = BeanstalkClient(filler.port)
                try:
                    put_pipelined(client, prefill)
                finally:
                    client.close()
            finally:
                filler.close()
        clients = Clients(procs)
        runs = 0

        def run() -> Samples:
            nonlocal runs
            runs += 1
            data = root / f"run{runs}" / "data"
            shutil.copytree(template, data)
            try:
                proc = start(server, data)
                try:
                    cpu0 = cpu_seconds(proc.proc.pid)
                    results = measure(clients, proc.port)
                    cpu = cpu_seconds(proc.proc.pid) - cpu0
                finally:
                    proc.close()
            finally:
                shutil.rmtree(data.parent, ignore_errors=True)
            jobs = sum(r.jobs for r in results)
            samples: Samples = {name: ("jobs/s", rate(results)),
                                f"{name} (server CPU per job)": ("us", cpu / jobs * 1e6)}
            if extra is not None:
                samples.update(extra(results))
            return samples

        try:
            yield run
        finally:
            clients.close()

    return Case(name, "k7" if server.k7 else "peer", setup, params)


def _loads(kind: str, port: int, s: Sizes, depth: int = 1) -> list[Load]:
    return [Load(kind, port, s.seconds, depth=depth) for _ in range(s.procs)]


def _spread(port: int, s: Sizes) -> list[Load]:
    """``s.conns`` connections over the processes, one put in flight on each."""
    share = [s.conns // s.procs + (i < s.conns % s.procs) for i in range(s.procs)]
    return [Load("put", port, s.seconds, conns=k) for k in share]


def _latency(name: str) -> Callable[[list[Result]], Samples]:
    def extra(results: list[Result]) -> Samples:
        lat = list(results[0].latencies)
        return {f"{name} p50": ("us", percentile(lat, 0.5)),
                f"{name} p99": ("us", percentile(lat, 0.99))}
    return extra


def _server_cases(server: Server, s: Sizes) -> list[Case]:
    p, d = s.procs, s.depth
    out = [
        _case(server, put_name(server.name, p), p, 0,
              lambda c, port: c.run(_loads("put", port, s)),
              _params(server, clients=p, depth=1, seconds=s.seconds)),
        _case(server, pipelined_name(server.name, p, d), p, 0,
              lambda c, port: c.run(_loads("put", port, s, d)),
              _params(server, clients=p, depth=d, seconds=s.seconds)),
        _case(server, take_name(server.name, p), p, s.prefill,
              lambda c, port: c.run(_loads("take", port, s)),
              _params(server, clients=p, depth=1, prefilled=s.prefill, seconds=s.seconds)),
        _case(server, take_name(server.name, p, d), p, s.prefill,
              lambda c, port: c.run(_loads("take", port, s, d)),
              _params(server, clients=p, depth=d, prefilled=s.prefill, seconds=s.seconds)),
        _case(server, latency_name(server.name), 1, 0,
              lambda c, port: c.run([Load("latency", port, s.seconds)]),
              _params(server, clients=1, depth=1, seconds=s.seconds),
              _latency(latency_name(server.name))),
    ]
    if server.durability == FSYNC_PER_PUT:
        out.append(_case(server, conns_name(server.name, s.conns), p, 0,
                         lambda c, port: c.run(_spread(port, s)),
                         _params(server, clients=p, connections=s.conns, depth=1,
                                 seconds=s.seconds)))
    return out


def cases(s: Sizes, with_peers: bool) -> tuple[list[Case], list[Skipped]]:
    """Every server's cases, the same load for each server in a row (so that a ratio compares
    runs minutes apart at most)."""
    per_server: list[list[Case]] = []
    skipped: list[Skipped] = []
    for server in SERVERS:
        if server.k7:
            per_server.append(_server_cases(server, s))
        elif not with_peers:
            skipped.append(Skipped(f"server {server.name}", "--no-peers"))
        elif shutil.which("beanstalkd") is None:
            skipped.append(Skipped(f"server {server.name}",
                                   "beanstalkd not on the PATH (apt-get install beanstalkd)"))
        else:
            per_server.append(_server_cases(server, s))
    out: list[Case] = []
    for i in range(max(len(c) for c in per_server)):
        out += [c[i] for c in per_server if i < len(c)]
    return out, skipped
