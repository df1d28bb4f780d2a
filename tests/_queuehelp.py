"""Helpers shared by the test packages (``tests/`` is on sys.path through its conftest)."""

from __future__ import annotations

import k7core


def read_all(q: k7core.Queue) -> list[bytes]:
    """Every payload of the queue, in order (call once nothing writes any more)."""
    out: list[bytes] = []
    offset = 0
    while True:
        batch = q.read_columnar(offset, 65536)
        if not len(batch):
            return out
        out.extend(bytes(batch.payload(i)) for i in range(len(batch)))
        offset = batch.next
