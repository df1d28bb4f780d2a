"""Throughput probe of the k7async bridges (what a message costs when it crosses threads).

    python benchmarks/async_probe.py [--messages N] [--backend asyncio|trio|both] [--repeat R]
                                     [--dir DIR]

A thin wrapper around the suite's k7async cases (``benchmarks/_async.py``, which says what
each case measures); ``python -m benchmarks --only k7async`` runs them in the suite (asyncio
in ``--quick`` mode, asyncio and trio in the full run). Each case: one warm-up run, then
``--repeat`` runs; the median is printed with the lowest and highest value.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

if not __package__:  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._async import Sizes, cases
from benchmarks._harness import PAYLOAD, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median shown)")
    parser.add_argument("--dir", type=Path, default=None, help="parent directory for the queues")
    args = parser.parse_args()
    backends = ("asyncio", "trio") if args.backend == "both" else (args.backend,)
    # awaited enqueue [sync]: 100 tasks x messages / 2000 each (100 x 100 for 200,000)
    sizes = Sizes(messages=args.messages, sync_tasks=100,
                  sync_per_task=max(1, args.messages // 2000), backends=backends)
    print(
        f"python {sys.version.split()[0]}, anyio {version('anyio')}, trio {version('trio')}, "
        f"{args.messages} messages of {len(PAYLOAD)} bytes, median of {args.repeat} runs "
        "[min .. max]"
    )
    root = Path(tempfile.mkdtemp(prefix="k7async-probe-", dir=args.dir))
    try:
        for i, case in enumerate(cases(sizes)):
            d = root / f"case{i}"
            d.mkdir()
            try:
                records = measure(case, d, args.repeat)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            for r in records:
                spread = f"[{r.min:,.0f} .. {r.max:,.0f}]"
                print(f"  {r.name:<72} {r.value:>10,.0f} {r.unit:<9} {spread}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
