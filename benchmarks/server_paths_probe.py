"""The per-request costs of the server's own Python steps, without sockets: parsing a put
(``RequestParser.feed`` + ``next`` until None) and storing it (``JobStore.put`` under
``"flush"``), best of 5 loops; for reading a profile of the server against its parts.

    python benchmarks/server_paths_probe.py [--body 100] [--count 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

from k7core.beanstalk import RequestParser, put_command
from k7core.jobs import JobStore


def best_of(step: Callable[[], object], count: int, reps: int = 5) -> float:
    """The shortest mean time of ``step`` over ``reps`` loops of ``count`` calls (s)."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(count):
            step()
        best = min(best, (time.perf_counter() - start) / count)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--body", type=int, default=100, help="body size (bytes)")
    p.add_argument("--count", type=int, default=100_000)
    args = p.parse_args()
    body = b"x" * args.body
    message = put_command(body, 1024, 0, 60)
    parser = RequestParser()

    def parse() -> None:
        parser.feed(message)
        while parser.next() is not None:
            pass

    print(f"parse a put ({args.body}-byte body): {best_of(parse, args.count) * 1e6:.2f} µs")
    with tempfile.TemporaryDirectory(prefix="k7-paths-") as directory, \
            JobStore(directory, fsync="flush") as store:
        def put() -> None:
            store.put(body, tube="default", priority=1024, delay=0, ttr=60)

        took = best_of(put, min(args.count, 20_000))
        print(f"JobStore.put, \"flush\" ({args.body}-byte body): {took * 1e6:.2f} µs")


if __name__ == "__main__":
    main()
