"""Timing, records and output (console table, JSON, Markdown, PNG) for ``python -m benchmarks``.

A case is a context manager factory: ``setup(root)`` prepares what the case needs (queues,
prefilled data) under ``root`` and yields ``run``; ``run()`` does the measured work once and
returns its samples, ``{record name: (unit, value)}``. The harness calls ``run`` once as a
warm-up, then ``reps`` times, and keeps for every record the median, the lowest and the
highest value.
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 32

Samples = dict[str, tuple[str, float]]
Run = Callable[[], Samples]
Setup = Callable[[Path], AbstractContextManager[Run]]


@dataclass
class Case:
    name: str
    group: str  # "k7", "baseline" or "peer"
    setup: Setup
    params: dict[str, Any] = field(default_factory=dict)
    late: bool = False  # run after every other case (it leaves the disk or page cache busy)


@dataclass
class Record:
    name: str
    unit: str
    value: float
    min: float
    max: float
    params: dict[str, Any]
    group: str

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "unit": self.unit, "value": self.value,
            "min": self.min, "max": self.max, "params": {**self.params, "group": self.group},
        }


@dataclass
class Skipped:
    name: str
    reason: str


def rate(n: int, fn: Callable[[], object]) -> float:
    """Messages (or bytes) per second of ``fn()``, which handles ``n`` of them."""
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def in_fresh_dirs(root: Path, measure: Callable[[Path], Samples]) -> Run:
    """A run that calls ``measure`` on a new, empty directory under ``root`` each time and
    removes it after (each repetition starts from an empty queue or store)."""
    counter = itertools.count()

    def run() -> Samples:
        path = root / f"run{next(counter)}"
        path.mkdir()
        try:
            return measure(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    return run


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def measure(case: Case, root: Path, reps: int) -> list[Record]:
    per_name: dict[str, tuple[str, list[float]]] = {}
    with case.setup(root) as run:
        run()  # warm-up
        for _ in range(reps):
            for name, (unit, value) in run().items():
                per_name.setdefault(name, (unit, []))[1].append(value)
    return [
        Record(name, unit, statistics.median(vals), min(vals), max(vals), case.params, case.group)
        for name, (unit, vals) in per_name.items()
    ]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _param_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def console_table(records: list[Record], skipped: list[Skipped]) -> str:
    w = max([len(r.name) for r in records] + [36])
    lines = [f"{'case':{w}} {'median':>14} {'min':>14} {'max':>14}  unit"]
    for r in records:
        lines.append(
            f"{r.name:{w}} {_fmt(r.value):>14} {_fmt(r.min):>14} {_fmt(r.max):>14}  {r.unit}"
        )
    for s in skipped:
        lines.append(f"{s.name:{w}} skipped: {s.reason}")
    return "\n".join(lines)


def write_json(path: Path, records: list[Record]) -> None:
    path.write_text(json.dumps([r.as_json() for r in records], indent=1) + "\n")


def write_markdown(path: Path, records: list[Record], skipped: list[Skipped], header: str) -> None:
    lines = [header, "", "| case | median | min | max | unit | params |",
             "|---|---:|---:|---:|---|---|"]
    for r in records:
        lines.append(
            f"| {r.name} | {_fmt(r.value)} | {_fmt(r.min)} | {_fmt(r.max)} | {r.unit} "
            f"| {_param_text(r.params)} |"
        )
    for s in skipped:
        lines.append(f"| {s.name} | | | | | skipped: {s.reason} |")
    path.write_text("\n".join(lines) + "\n")


COLORS = {"k7": "#1f77b4", "peer": "#ff7f0e", "baseline": "#7f7f7f"}
LABELS = {"k7": "k7 (this project)", "peer": "peer queues", "baseline": "baselines"}


def write_plot(path: Path, records: list[Record], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [r for r in records if r.unit in ("msg/s", "jobs/s")]
    if not rows:
        raise SystemExit("--plot: no msg/s or jobs/s records to plot")
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh(
        ys, [r.value for r in rows], color=[COLORS.get(r.group, "#2ca02c") for r in rows],
        xerr=[[r.value - r.min for r in rows], [r.max - r.value for r in rows]],
        error_kw={"elinewidth": 0.6, "capsize": 1.5},
    )
    ax.set_yticks(list(ys), [r.name for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("messages or jobs per second (median, log scale; whiskers: min-max)")
    ax.set_title(textwrap.fill(title, 110), fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(
        handles=[Patch(color=c, label=LABELS[g]) for g, c in COLORS.items()], loc="lower right",
        fontsize=7,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def iter_selected(cases: list[Case], only: list[str] | None) -> Iterator[Case]:
    for c in cases:
        if not only or any(s.lower() in c.name.lower() for s in only):
            yield c
