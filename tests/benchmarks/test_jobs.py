"""The job-queue benchmark module (issue 14): the plain-socket beanstalkd client against the
real server, each peer adapter's put / reserve / delete, the producer timing, and the skip
notes of the k7 cases while ``k7core.jobs.JobStore`` is not built. No speed is checked."""

from __future__ import annotations

import importlib
import shutil
import threading
from pathlib import Path

import pytest

from benchmarks import _jobs

needs_beanstalkd = pytest.mark.skipif(shutil.which("beanstalkd") is None,
                                      reason="beanstalkd not on the PATH")


@needs_beanstalkd
def test_beanstalk_client_reads_replies_exactly(tmp_path: Path) -> None:
    server = _jobs.BeanstalkdServer(tmp_path / "binlog", ("-f", "0"))
    try:
        client = _jobs.BeanstalkClient(server.port)
        try:
            client.use(_jobs.TUBE)  # the tube a new connection watches
            body = b"a\r\nRESERVED 1 2\r\n" + bytes(range(256))  # CRLF and noise inside
            first = client.put(body)
            second = client.put(b"")
            assert second > first
            assert client.reserve(0) == (first, body)
            assert client.reserve(0) == (second, b"")
            assert client.reserve(0) is None  # TIMED_OUT
            client.delete(first)
            with pytest.raises(_jobs.BeanstalkError, match="NOT_FOUND"):
                client.delete(first)
            client.delete(second)
        finally:
            client.close()
    finally:
        server.close()
    assert server.proc.returncode is not None
    assert (tmp_path / "binlog" / "binlog.1").exists()


def _peers_available() -> list[_jobs.Peer]:
    out = []
    for p in _jobs.peers():
        if p.binary and shutil.which(p.binary) is None:
            continue
        if p.module:
            try:
                importlib.import_module(p.module)
            except ImportError:
                continue
        out.append(p)
    return out


@pytest.mark.parametrize("peer", _peers_available(), ids=lambda p: p.name)
def test_peer_cycle(peer: _jobs.Peer, tmp_path: Path) -> None:
    q = peer.make(tmp_path)
    try:
        for _ in range(3):
            q.put(_jobs.BODY)
        for _ in range(3):
            q.delete(q.reserve())
        with pytest.raises(RuntimeError):
            q.reserve()
        if peer.producers:
            side = q.producer()
            try:
                side.put(_jobs.BODY)
            finally:
                if side is not q:
                    side.close()
            q.delete(q.reserve())
    finally:
        q.close()


def test_peer_labels() -> None:
    for p in _jobs.peers():
        assert p.durability in (_jobs.OS_BUFFERED, _jobs.FSYNC_PER_PUT), p
        assert p.setting and p.maps, p
        if p.producers:
            assert p.durability == _jobs.FSYNC_PER_PUT, p  # durable puts only


def test_producers_rate_counts_every_put() -> None:
    lock = threading.Lock()
    seen: list[bytes] = []

    def put(body: bytes) -> None:
        with lock:
            seen.append(body)

    assert _jobs.producers_rate([put] * 10, 7) > 0
    assert len(seen) == 70 and set(seen) == {_jobs.BODY}


def test_the_k7_cases_are_there() -> None:
    cases, skipped = _jobs.cases(_jobs.QUICK, with_peers=False)
    assert not skipped
    assert sorted(c.name for c in cases) == sorted([
        _jobs.K7_INPROC, _jobs.K7_PRODUCERS, _jobs.K7_TASKS,
        _jobs.k7_reopen_name(_jobs.QUICK.reopen), _jobs.K7_RAM])
