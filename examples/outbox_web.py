"""A web-style app with a transactional outbox: an HTTP handler writes an order and its job in
one SQLite transaction; a relay task moves committed jobs into a job store; a worker sends
the receipt, with retries. Run it as is: ``python examples/outbox_web.py`` (it serves on a
free port, sends itself a few requests, waits for the receipts and exits).

    POST /orders {"item": "tea", "qty": 2}   -> 201 {"order": 1}   (row + job, one commit)
    POST /orders {"item": "tea", "qty": 0}   -> 400                (rolled back: no job)
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

import k7async
from k7core import outbox
from k7core.workers import Backoff

box = outbox.Outbox()  # JSON payloads, table k7_outbox


def open_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT, "
               "qty INTEGER, receipt_sent INTEGER DEFAULT 0)")
    box.create(db)
    return db


def place_order(db: sqlite3.Connection, order: dict[str, Any]) -> int:
    """The handler's work: the order row and its job commit together, or neither does."""
    with db:  # one transaction: commit on success, rollback on an exception
        order_id = db.execute("INSERT INTO orders (item, qty) VALUES (?, ?)",
                              (order["item"], order["qty"])).lastrowid
        assert order_id is not None
        box.put(db, "receipts", {"order": order_id})
        if order["qty"] < 1:
            raise ValueError("qty must be at least 1")  # the row and the job roll back
    return order_id


async def handle_http(db: sqlite3.Connection, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    length = int(next((line.split(":")[1] for line in head.split("\r\n")
                       if line.lower().startswith("content-length:")), "0"))
    body = await reader.readexactly(length)
    reply: dict[str, object]
    try:
        order_id = place_order(db, json.loads(body))
        status, reply = "201 Created", {"order": order_id}
    except (ValueError, KeyError) as exc:
        status, reply = "400 Bad Request", {"error": str(exc)}
    data = json.dumps(reply).encode()
    writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(data)}\r\n"
                 "Connection: close\r\n\r\n".encode() + data)
    await writer.drain()
    writer.close()


async def post(port: int, order: dict[str, Any]) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(order).encode()
    writer.write(f"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    reply = (await reader.read()).decode()
    writer.close()
    return reply.split("\r\n")[0] + " " + reply.split("\r\n\r\n", 1)[1]


async def main(workdir: Path) -> None:
    db = open_db(workdir / "app.db")
    attempts: dict[int, int] = {}
    sent = anyio.Event()
    async with k7async.open_jobs(workdir / "jobs") as store, \
            k7async.AsyncWorker(store, backoff=Backoff(base=0.1, jitter=0.0)) as worker, \
            anyio.create_task_group() as tg:

        @worker.consumer("receipts", max_retries=5)
        async def send_receipt(job: dict[str, int]) -> None:
            n = attempts[job["order"]] = attempts.get(job["order"], 0) + 1
            if n == 1:
                raise ConnectionError("mail server busy")  # retried after the backoff
            with db:
                db.execute("UPDATE orders SET receipt_sent = 1 WHERE id = ?", (job["order"],))
            print(f"receipt sent for order {job['order']} (attempt {n})")
            if sum(1 for (done,) in db.execute("SELECT receipt_sent FROM orders")
                   if done) == 2:
                sent.set()

        await tg.start(k7async.run_relay, outbox.SqliteRelay(workdir / "app.db", store.store))
        server = await asyncio.start_server(lambda r, w: handle_http(db, r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for order in ({"item": "tea", "qty": 2}, {"item": "cake", "qty": 0},
                      {"item": "jam", "qty": 1}):
            print(f"POST {order} -> {await post(port, order)}")
        with anyio.fail_after(30):
            await sent.wait()
        server.close()
        tg.cancel_scope.cancel()
    rows = db.execute("SELECT id, item, receipt_sent FROM orders").fetchall()
    print("orders:", rows)
    db.close()
    assert rows == [(1, "tea", 1), (2, "jam", 1)], rows  # no row, no job for the cake


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)))
