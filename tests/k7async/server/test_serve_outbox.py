"""``k7 serve --outbox``: the server relays an application's outbox into the store it serves,
so a plain beanstalkd client (greenstalk) reserves the committed jobs, and only those."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import greenstalk
import pytest

from k7core.outbox import Outbox
from tests.k7async.server._proc import ServerProcess


def _serve(tmp_path: Path, source: str) -> list[str]:
    return [sys.executable, "-m", "k7core", "serve", str(tmp_path / "jobs"),
            "-l", "127.0.0.1:0", "--outbox", source]


def test_the_server_relays_committed_rows_to_beanstalkd_clients(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "app.db")
    box = Outbox()
    box.create(db)
    with db:
        box.put(db, "mail", {"n": 1})
    with ServerProcess(_serve(tmp_path, f"sqlite:{tmp_path / 'app.db'}")) as server:
        assert isinstance(server.address, tuple)
        with greenstalk.Client(server.address, watch="mail") as client:
            job = client.reserve(timeout=10)
            assert json.loads(job.body) == {"n": 1}
            client.delete(job)
            with pytest.raises(ZeroDivisionError), db:
                box.put(db, "mail", {"n": -1})
                raise ZeroDivisionError  # rolled back: never a job
            with db:
                box.put(db, "mail", {"n": 2})
            job = client.reserve(timeout=10)
            assert json.loads(job.body) == {"n": 2}
            client.delete(job)
            with pytest.raises(greenstalk.TimedOutError):
                client.reserve(timeout=1)
    db.close()


def test_an_outbox_that_is_not_there_stops_the_server_with_the_reason(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    server = ServerProcess.start_only(_serve(tmp_path, str(tmp_path / "empty.db")))
    try:
        assert server.proc.wait(timeout=60) != 0
        assert "Outbox.create" in server.stderr()
    finally:
        server.close()
