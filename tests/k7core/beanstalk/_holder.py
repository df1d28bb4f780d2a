"""A child that holds a reservation (not a test module).

``python -m tests.k7core.beanstalk._holder ADDRESS`` reserves a job of the default tube with
the blocking client, prints its id (or ``none``), then waits for its stdin to end: the test
SIGKILLs it meanwhile.
"""

from __future__ import annotations

import sys

from k7core.beanstalk import Client

client = Client(sys.argv[1], timeout=30)
job = client.reserve(timeout=30)
print("none" if job is None else job.id, flush=True)
sys.stdin.read()
