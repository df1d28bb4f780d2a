"""Fixtures of the outbox tests: one real PostgreSQL server for the session (the ``pgserver``
wheel's binaries, in a temporary directory, stopped at the end), a database of its own for
each test, real SQLite files and a job store under ``tmp_path``."""

from __future__ import annotations

import importlib
import itertools
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from k7core.jobs import JobStore
from tests.k7core.outbox._outboxhelp import App, connect

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A PostgreSQL 16 server of this session (pgserver), stopped and deleted when the
    session ends. Its directory is not under pytest's temporary directory: run as root,
    the server runs as user ``pgserver``, which must reach it (pytest's is private)."""
    where = tempfile.mkdtemp(prefix="k7-outbox-pg-")
    try:
        with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
            warnings.simplefilter("ignore")
            pgserver = importlib.import_module("pgserver")
            server = pgserver.get_server(where, cleanup_mode="stop")
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            # a server of the tests: no crash of it to survive, commits need no flush
            admin.execute("ALTER SYSTEM SET fsync = off")
            admin.execute("ALTER SYSTEM SET synchronous_commit = off")
            admin.execute("SELECT pg_reload_conf()")
        try:
            yield server
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def dsn(pg_server: Any) -> Iterator[str]:
    """The DSN of a new, empty database of this test's own (dropped after it)."""
    name = f"t{next(_databases)}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield str(pg_server.get_uri(name))
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A SQLite database file (not yet created)."""
    return tmp_path / "app.db"


@pytest.fixture(params=["sqlite", "pg"])
def app(request: pytest.FixtureRequest, db_path: Path) -> Iterator[App]:
    """The application's connection, to a SQLite file and to this test's PostgreSQL
    database (the test runs once with each)."""
    dsn = request.getfixturevalue("dsn") if request.param == "pg" else ""
    a = connect(request.param, db_path, dsn)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    with JobStore(tmp_path / "jobs", fsync="flush") as s:
        yield s
