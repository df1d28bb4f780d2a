"""The child process of the relay crash test (not a test module): an outbox relay's puts.

Run as ``python -m tests.k7core.jobs._relaychild DIR FSYNC SNAPSHOT_BYTES``. It opens a
JobStore on DIR, reads mark ``relay`` as a relay does at start, prints ``ready <next>``
(the first position it will put), then puts outbox row after row, forever, each with mark
``("relay", position)`` and printing ``P <position> <id>`` once the put returned (one
``os.write`` per line). Row ``p``'s job has body ``row <p>`` and key ``row-<p>``; every
third row is put with ``remember=True``; a row whose position is a multiple of 10 is a
duplicate of row ``p - 1`` (its key): the put stores nothing and moves the mark (a MARK
record). The parent SIGKILLs it.
"""

from __future__ import annotations

import os
import sys

from k7core.jobs import JobStore

MARK = "relay"
TUBE = "outbox"


def is_duplicate(position: int) -> bool:
    """Row ``position`` repeats the key of the row before it."""
    return position % 10 == 0


def key(position: int) -> str:
    """The key row ``position`` is put with."""
    return f"row-{position - 1 if is_duplicate(position) else position}"


def remembers(position: int) -> bool:
    """Row ``position`` is put with ``remember=True``."""
    return position % 3 == 0


def main() -> None:
    path, fsync, snapshot_bytes = sys.argv[1:4]
    with JobStore(path, fsync=fsync, snapshot_bytes=int(snapshot_bytes)) as store:
        position = (store.mark(MARK) or 0) + 1
        os.write(1, b"ready %d\n" % position)
        while True:
            job_id = store.put(b"row %d" % position, tube=TUBE, key=key(position),
                               remember=remembers(position), mark=(MARK, position))
            os.write(1, b"P %d %d\n" % (position, job_id))
            position += 1


if __name__ == "__main__":
    main()
