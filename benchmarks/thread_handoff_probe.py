"""What one hand-over between two Python threads costs on this machine: two threads pass two
locks back and forth N times (each wakes the other and blocks). Prints the round trip: two
hand-overs, each a wake-up from a lock plus the GIL changing threads. It bounds any design in
which each of many threads blocks once per call, such as 100 threads making durable puts.

``python benchmarks/thread_handoff_probe.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import threading
import time


def round_trip(rounds: int) -> float:
    """Seconds per round trip, over ``rounds`` of them."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        for _ in range(rounds):
            ping.acquire()
            pong.release()

    thread = threading.Thread(target=other)
    thread.start()
    t0 = time.perf_counter()
    for _ in range(rounds):
        ping.release()
        pong.acquire()
    elapsed = time.perf_counter() - t0
    thread.join()
    return elapsed / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20_000)
    args = ap.parse_args()
    rt = round_trip(args.rounds)
    print(f"{args.rounds:,} round trips: {rt * 1e6:.1f} us each, "
          f"{rt * 1e6 / 2:.1f} us per hand-over")


if __name__ == "__main__":
    main()
