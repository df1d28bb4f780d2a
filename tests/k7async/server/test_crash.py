"""SIGKILL the server in the middle of a load of puts, reserves and deletes from several
connections, restart it on the same directory: every job whose INSERTED a client read, and
that no client saw DELETED, is there with its body; no job a client saw DELETED comes back.

Each client is a thread with its own socket that records what the server acknowledged. The
kill comes when the clients have read ``KILL_AFTER`` replies (an event, not a timer), while
they are still sending. A delete that was sent but not answered may or may not have
happened; so may a put: those are left out of the checks on single jobs, and bound the count.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from ._proc import DEADLINE, ServerProcess, Wire

pytestmark = pytest.mark.timeout(60)

CLIENTS = 4
KILL_AFTER = 1500


class Seen:
    """What the clients were told, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inserted: dict[int, bytes] = {}
        self.deleted: set[int] = set()
        self.deleting: set[int] = set()  # delete sent, no reply (yet)
        self.replies = 0
        self.enough = threading.Event()
        self.errors: list[BaseException] = []

    def ack(self) -> None:
        self.replies += 1
        if self.replies >= KILL_AFTER:
            self.enough.set()


def client(server: ServerProcess, n: int, seen: Seen) -> None:
    """Put jobs, reserve and delete every other one, until the server is gone."""
    rng = random.Random(n)
    wire = Wire(server.connect())
    try:
        for i in range(1_000_000):
            body = f"client {n} job {i} ".encode() + rng.randbytes(rng.randrange(200)).hex(
                ).encode()
            wire.send(b"put %d 0 120 %d\r\n%s\r\n" % (rng.randrange(1000), len(body), body))
            reply = wire.line()
            assert reply.startswith(b"INSERTED "), reply
            with seen.lock:
                seen.inserted[int(reply.split()[1])] = body
                seen.ack()
            if i % 2:
                continue
            wire.send(b"reserve-with-timeout 0\r\n")
            reply, got = wire.reply()
            if reply == b"TIMED_OUT":
                continue
            assert reply.startswith(b"RESERVED "), reply
            job_id = int(reply.split()[1])
            with seen.lock:
                assert seen.inserted.get(job_id) in (None, got)  # None: a put in flight
                seen.deleting.add(job_id)
                seen.ack()
            wire.send(b"delete %d\r\n" % job_id)
            reply = wire.line()
            assert reply == b"DELETED", reply
            with seen.lock:
                seen.deleting.discard(job_id)
                seen.deleted.add(job_id)
                seen.ack()
    except OSError:
        return  # the server was killed: ConnectionResetError, BrokenPipeError, EOF
    except BaseException as exc:
        seen.errors.append(exc)
        seen.enough.set()
    finally:
        wire.close()


def peek_all(wire: Wire, ids: Iterable[int]) -> dict[int, bytes | None]:
    """``peek`` each job (pipelined): its body, or None for NOT_FOUND."""
    ids = list(ids)
    wire.send(b"".join(b"peek %d\r\n" % i for i in ids))
    out: dict[int, bytes | None] = {}
    for job_id in ids:
        line, body = wire.reply()
        assert line in (b"NOT_FOUND", b"FOUND %d %d" % (job_id, len(body or b""))), line
        out[job_id] = body
    return out


def stats(wire: Wire) -> dict[str, str]:
    wire.send(b"stats\r\n")
    _, doc = wire.reply()
    assert doc is not None
    pairs = (line.split(": ", 1) for line in doc.decode().splitlines()[1:])
    return {key: value for key, value in pairs}


@pytest.mark.parametrize("fsync", ["flush", "sync"])
def test_sigkill_under_load_keeps_every_acknowledged_job(tmp_path: Path, fsync: str) -> None:
    directory = tmp_path / "jobs"
    seen = Seen()
    with ServerProcess.serve(directory, fsync=fsync) as server:
        threads = [threading.Thread(target=client, args=(server, n, seen), daemon=True)
                   for n in range(CLIENTS)]
        for t in threads:
            t.start()
        assert seen.enough.wait(DEADLINE), f"only {seen.replies} replies:\n{server.stderr()}"
        server.kill()
        for t in threads:
            t.join(DEADLINE)
        assert server.proc.returncode == -signal.SIGKILL
    assert not seen.errors, seen.errors
    assert not any(t.is_alive() for t in threads)
    kept = seen.inserted.keys() - seen.deleted - seen.deleting
    assert seen.deleted and len(kept) > CLIENTS  # the load did both

    with ServerProcess.serve(directory, fsync=fsync) as server:
        wire = Wire(server.connect())
        found = peek_all(wire, sorted(kept | seen.deleted))
        lost = {i for i in kept if found[i] != seen.inserted[i]}
        assert not lost, f"{len(lost)} of {len(kept)} acknowledged jobs lost or changed"
        back = {i for i in seen.deleted if found[i] is not None}
        assert not back, f"{len(back)} deleted jobs came back"
        # beyond those: at most a put in flight per client, a delete in flight undone
        counts = stats(wire)
        live = sum(int(counts[f"current-jobs-{state}"])
                   for state in ("ready", "reserved", "delayed", "buried"))
        assert len(kept) <= live <= len(kept) + len(seen.deleting) + CLIENTS
        assert int(counts["current-jobs-reserved"]) == 0  # reservations died with the kill
        wire.close()
        assert server.stop() == 0
