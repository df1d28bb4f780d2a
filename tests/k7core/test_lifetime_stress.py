"""Lifetimes under stress: threads open, poll, ack and close queues, groups, k7async channels
and topic consumers at random, dropping parents early and closing them under other threads
(tests/k7core/_lifetime_stress.py says what it does). It runs in a child process, so that a
crash or a deadlock fails this test instead of ending or hanging the run;
tests/k7core/native/sanitize_python.sh runs it under AddressSanitizer, where a touch of freed
memory is reported even when it does not crash.

Before the fixes of issue 30 it crashed every run (SIGSEGV, glibc's tpp.c abort) or hung.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._queuehelp import child_env

ROUNDS = 150  # per thread; a few seconds, tens under ASan
HANG = 600.0  # seconds: only a deadlock takes this long (the run takes seconds)


@pytest.mark.parametrize("seed", [1, 2])
def test_lifetimes_under_stress(tmp_path: Path, seed: int) -> None:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.k7core._lifetime_stress", str(tmp_path), str(seed),
             str(ROUNDS)],
            capture_output=True, text=True, timeout=HANG, env=child_env(),
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the stress run hung (a deadlock?): {exc.stderr!r}") from None
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-5000:]}"
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok ")]
    counts = dict(item.split("=") for item in line.split()[1:])
    # every kind of operation ran (a run that did nothing would prove nothing)
    assert len(counts) >= 12 and all(int(n) > 0 for n in counts.values()), line
