"""Smoke test of the benchmark suite: one fast case in --quick mode writes well-formed JSON.

It checks the shape of the records only, never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"name", "unit", "value", "min", "max", "params"}


def test_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "enqueue_many(1000) [flush]",
         "--only", "round-trip [flush]", "--json", str(out), "--md", str(md)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    names = {r["name"] for r in records}
    assert "k7 enqueue_many(1000) [flush]" in names
    assert {"k7 round-trip [flush] p50", "k7 round-trip [flush] p99"} <= names
    for r in records:
        assert set(r) >= KEYS, r
        assert isinstance(r["params"], dict)
        assert r["unit"] in {"msg/s", "us", "MB/s"}
        assert 0 < r["min"] <= r["value"] <= r["max"], r
    assert "enqueue_many(1000) [flush]" in md.read_text()
    assert "enqueue_many(1000) [flush]" in proc.stdout
