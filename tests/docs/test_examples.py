"""The examples the docs point to run as they are (a child process each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_outbox_web_example_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "outbox_web.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "201 Created" in out and "400 Bad Request" in out
    assert out.count("receipt sent for order") == 2
    assert "orders: [(1, 'tea', 1), (2, 'jam', 1)]" in out
    assert "ConnectionError: mail server busy" in done.stderr  # the first attempts failed


def test_the_shared_writers_example_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "shared_writers.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "workers done: [0, 1, 2, 3]" in done.stdout
    assert ("messages read: 40000, per worker: {0: 10000, 1: 10000, 2: 10000, 3: 10000}"
            in done.stdout), done.stdout


def test_the_topics_example_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "topics.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "published 10000 events through the exchange; 6668 of them are orders" in out
    assert "group billing read 6668 orders" in out and "audit holds 10000 events" in out
    # range assignment: the two members split the four partitions
    a = next(line for line in out.splitlines() if line.startswith("member-a read"))
    b = next(line for line in out.splitlines() if line.startswith("member-b read"))
    assert a.split("{")[1].split(":")[0] == "0" and "2:" not in a and "3:" not in a, out
    assert b.split("{")[1].split(":")[0] == "2" and "0:" not in b and "1:" not in b, out
