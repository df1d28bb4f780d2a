"""Child programs of the consumer-group tests (not a test module): run as
``python -m tests.k7core.topics._group_children MODE ARGS...``.

``produce DIR NAME COUNT PAUSE``: send COUNT records (key ``NAME-k<i % 20>``, value
``NAME:<i>``), pausing PAUSE seconds after every 50, then print ``done``.

``consume DIR GROUP MEMBER LOG [STRATEGY]``: join the group, print ``joined``, then poll and
ack record by record, appending ``try P OFF`` before each ack and ``ack P OFF VALUE`` after
an ack that took effect (``lost P OFF`` otherwise) to LOG; a line ``quit`` on stdin makes it
leave the group (close), print ``left`` and exit.

``freeze-in-lock LOCKFILE``: take a lock of the topics layer (a group's, a topic's
metadata lock, an exchange's) as its holders do, print ``held``, and stop itself (SIGSTOP)
holding it; once continued, exit (the lock with it).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

from k7core.topics import Topic
from k7core.topics._lockfile import holding


def _produce(argv: list[str]) -> None:
    path, name, count, pause = argv[0], argv[1], int(argv[2]), float(argv[3])
    with Topic(path) as topic:
        for i in range(count):
            topic.send(f"{name}:{i}".encode(), key=f"{name}-k{i % 20}")
            if i % 50 == 49:
                time.sleep(pause)  # the workload's pace: records keep flowing for seconds
    os.write(1, b"done\n")


def _consume(argv: list[str]) -> None:
    path, group, member, log = argv[0], argv[1], argv[2], argv[3]
    strategy = argv[4] if len(argv) > 4 else "sticky"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with Topic(path, readonly=True) as topic:
        c = topic.consumer(group, member, strategy=strategy)
        os.write(1, b"joined\n")
        while True:
            if select.select([0], [], [], 0)[0]:
                cmd = sys.stdin.readline().strip()
                if cmd in ("quit", ""):
                    c.close()
                    break
            for r in c.poll(50, 0.05):
                os.write(fd, f"try {r.partition} {r.offset}\n".encode())
                if c.ack(r):
                    os.write(fd, f"ack {r.partition} {r.offset} {r.value.decode()}\n".encode())
                else:
                    os.write(fd, f"lost {r.partition} {r.offset}\n".encode())
    os.write(1, b"left\n")


def _freeze_in_lock(argv: list[str]) -> None:
    with holding(Path(argv[0]), 0o600, 60.0, "a test's lock"):
        os.write(1, b"held\n")
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    modes = {"produce": _produce, "consume": _consume, "freeze-in-lock": _freeze_in_lock}
    modes[sys.argv[1]](sys.argv[2:])
