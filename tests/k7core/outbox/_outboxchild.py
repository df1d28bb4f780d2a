"""The child processes of the outbox tests (not a test module).

``python -m tests.k7core.outbox._outboxchild create KIND WHERE``: connects to the SQLite file
or PostgreSQL DSN ``WHERE`` (KIND ``sqlite`` or ``pg``), begins a transaction, prints
``ready``, waits for a line on stdin, then creates the outbox and puts a row in that
transaction, commits and prints ``created`` (or the error's text).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any

import psycopg

from k7core.outbox import Outbox


def create(kind: str, where: str) -> None:
    conn: sqlite3.Connection | psycopg.Connection[Any] = (
        sqlite3.connect(where) if kind == "sqlite" else psycopg.connect(where))
    with conn:
        os.write(1, b"ready\n")
        sys.stdin.readline()
        box = Outbox()
        try:
            box.create(conn)
            box.put(conn, "t", os.getpid())
            conn.commit()
        except Exception as exc:  # reported to the parent, which fails the test
            os.write(1, f"{type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n")
            return
        os.write(1, b"created\n")


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "create":
        create(*args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
