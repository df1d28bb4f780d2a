"""Helpers of the job store's tests (not a test module): what a store says, the journal's
end, journal written without live jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import k7core
from k7core.jobs import JobStore
from k7core.jobs._files import JOURNAL


def journal_end(path: Path) -> int:
    """The journal's visible end, read by a read-only queue (the store holds the writer)."""
    with k7core.Queue(path / JOURNAL, readonly=True) as q:
        return q.end


def everything(store: JobStore, ids: list[int]) -> dict[str, Any]:
    """What the store says about jobs ``ids`` and every tube, for comparisons."""
    tubes = sorted(store.tubes())
    return {
        "jobs": {i: store.peek(i) for i in ids},
        "len": len(store),
        "tubes": tubes,
        "stats": {k: v for k, v in store.stats().items() if k != "total-jobs"},
        "per-tube": {t: (store.peek_ready(t), store.peek_delayed(t), store.peek_buried(t),
                         store.errors(t)) for t in tubes},
    }


def churn(store: JobStore, nbytes: int, tube: str = "churn") -> None:
    """Journal about ``nbytes`` of puts, each deleted at once (no live job left)."""
    body = b"c" * 4000
    for _ in range(nbytes // len(body) + 1):
        store.delete(store.put(body, tube=tube))
