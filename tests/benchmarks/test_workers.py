"""The workers benchmark module (issue 16): every case runs once on a few jobs and gives its
record; the peers' cases skip with a reason when their package, binary or server is
missing, and all of them with ``--no-peers``. No speed is checked."""

from __future__ import annotations

import importlib.util
import shutil
import threading
from pathlib import Path

import pytest

from benchmarks import _jobs, _workers
from benchmarks._harness import Case

TINY = _workers.Sizes(k7_jobs=50, server_jobs=30, peer_jobs=20)


def _run_once(case: Case, root: Path) -> None:
    with case.setup(root) as run:
        samples = run()
    assert list(samples) == [case.name]
    unit, value = samples[case.name]
    assert unit == "jobs/s" and value > 0
    assert case.params["durability"] in (_jobs.OS_BUFFERED, _jobs.FSYNC_PER_PUT)


def test_without_peers_every_peer_is_skipped() -> None:
    cases, skipped = _workers.cases(TINY, with_peers=False)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    assert all(n.startswith("workers ") for n in names + [s.name for s in skipped])
    assert {c.group for c in cases} == {"k7", "baseline"}
    assert {_workers.K7_WORKER, _workers.K7_WORKER_SYNC, _workers.K7_ASYNC,
            _workers.BARE_LOOP} <= set(names)
    assert [s.reason for s in skipped if s.name.startswith("workers peer ")]
    assert all(s.reason == "--no-peers" for s in skipped if s.name.startswith("workers peer "))


@pytest.mark.parametrize("case", _workers.cases(TINY, with_peers=False)[0],
                         ids=lambda c: c.name)
def test_k7_case_runs(case: Case, tmp_path: Path) -> None:
    _run_once(case, tmp_path)


def _peer_cases() -> list[Case]:
    cases, _ = _workers.cases(TINY, with_peers=True)
    return [c for c in cases if c.group == "peer"]


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR")  # platformdirs, under pgqueuer
@pytest.mark.parametrize("case", _peer_cases(), ids=lambda c: c.name)
def test_peer_case_runs(case: Case, tmp_path: Path) -> None:
    _run_once(case, tmp_path)


def test_a_missing_peer_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def no_arq(name: str, package: str | None = None) -> object:
        return None if name == "arq" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_arq)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    cases, skipped = _workers.cases(TINY, with_peers=True)
    reasons = {s.name: s.reason for s in skipped}
    assert reasons["workers peer arq"].startswith("arq not installed")
    assert "beanstalkd not on the PATH" in reasons[_workers.server_name(False, "1 connection")]
    assert not [c for c in cases if c.name.startswith(("workers peer arq", "workers peer RQ"))]


def test_countdown_sets_done_at_the_nth_hit() -> None:
    count = _workers.Countdown(400)
    def hits() -> None:
        for _ in range(100):
            count.hit()

    threads = [threading.Thread(target=hits) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count.done.is_set()
    count.wait()
