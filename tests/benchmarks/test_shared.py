"""The shared-writers benchmark module (issue 17): every case runs once on a few messages
and gives its records; the k7 cases are skipped with a reason while ``k7core.Queue`` takes
no ``writers=``, the peers' when their package is missing, and all peers with
``--no-peers``; the issue-17 targets table reads met and missed right. No speed is checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks import _jobs, _shared, targets
from benchmarks._harness import Case

TINY = _shared.Sizes(enqueue=2_000, many=3_000, sync=20, peer=20, peer_durable=10)
K7_CASES = 8  # one writer exclusive vs shared, 2 calls x 3 process counts, sync 8 vs 1


def _run_once(case: Case, root: Path) -> None:
    with case.setup(root) as run:
        samples = run()
    assert samples
    for name, (unit, value) in samples.items():
        assert name.startswith(case.name + " "), name
        assert unit in ("msg/s", "x", "msg/msync") and value > 0, (name, unit, value)
    assert case.params["durability"] in (_jobs.OS_BUFFERED, _jobs.FSYNC_PER_PUT)


def test_without_shared_writers_the_k7_cases_are_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shared, "SHARED_WRITERS", False)
    cases, skipped = _shared.cases(TINY, with_peers=False)
    assert not cases
    assert len(skipped) == K7_CASES
    assert all(s.reason == _shared.NO_SHARED_WRITERS for s in skipped)
    monkeypatch.setattr(_shared, "SHARED_WRITERS", True)
    cases, skipped = _shared.cases(TINY, with_peers=False)
    names = [c.name for c in cases]
    assert len(names) == K7_CASES and len(set(names)) == K7_CASES and not skipped
    assert all(n.startswith("shared k7 ") and c.group == "k7" for n, c in zip(names, cases,
                                                                              strict=True))
    assert _shared.ONE_WRITER in names and _shared.SYNC_CASE in names


def test_peers_are_skipped_with_their_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def no_litequeue(name: str, package: str | None = None) -> object:
        return None if name == "litequeue" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_litequeue)
    cases, skipped = _shared.cases(TINY, with_peers=True)
    reasons = {s.name: s.reason for s in skipped}
    for p in _shared.PEER_PROCS["litequeue"]:
        assert reasons[_shared.peer_name("litequeue", p)].startswith("litequeue not installed")
    assert not [c for c in cases if "litequeue" in c.name]


def test_one_exclusive_writer_process(tmp_path: Path) -> None:
    """The barrier and the count check, on today's exclusive writer."""
    w = _shared.measure_writers("k7-exclusive", tmp_path, 1, 1_000)
    assert w.count == 1_000 and len(w.rates) == 1 and w.aggregate > 0
    assert list(tmp_path.iterdir()) == []  # the run's directory is removed


def test_a_failing_writer_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        _shared.run_writers("no-such-kind", tmp_path / "q", 2, 10)


@pytest.mark.skipif(not _shared.SHARED_WRITERS, reason=_shared.NO_SHARED_WRITERS)
@pytest.mark.parametrize("case", _shared.cases(TINY, with_peers=False)[0],
                         ids=lambda c: c.name)
def test_k7_case_runs(case: Case, tmp_path: Path) -> None:
    _run_once(case, tmp_path)


def _peer_cases() -> list[Case]:
    cases, _ = _shared.cases(TINY, with_peers=True)
    return [c for c in cases if c.group == "peer"]


@pytest.mark.parametrize("case", _peer_cases(), ids=lambda c: c.name)
def test_peer_case_runs(case: Case, tmp_path: Path) -> None:
    _run_once(case, tmp_path)


def _record(name: str, value: float, durability: str = _jobs.OS_BUFFERED) -> dict[str, object]:
    return {"name": name, "unit": "msg/s", "value": value, "min": value, "max": value,
            "params": {"durability": durability}}


def test_targets_tables() -> None:
    one = _shared.ONE_WRITER
    agg = _shared.AGGREGATE
    records = [
        _record(f"{one} shared/exclusive", 0.9),
        _record(f"{_shared.shared_name('enqueue', 2)} {agg}", 3e6),
        _record(f"{_shared.shared_name('enqueue', 4)} {agg}", 1e6),
        _record(f"{_shared.SYNC_CASE} {_shared.SYNC_PROCS}/1", 4.0),
        _record(f"{_shared.SYNC_CASE} 1 process writers=shared", 2_000, _jobs.FSYNC_PER_PUT),
        _record(f"{_shared.peer_name('persist-queue SQLiteQueue', 1)} {agg}", 1_000,
                _jobs.FSYNC_PER_PUT),
    ]
    rows = targets.table(records, targets.SHARED_TARGETS).splitlines()[2:]
    assert len(rows) == len(targets.SHARED_TARGETS) == 6
    assert rows[0].endswith("| met |")
    assert rows[1].endswith("| met |") and rows[2].endswith("| **missed** |")
    assert all("not in this run" in r for r in rows[3:5])
    assert rows[5].endswith("| **missed** |")
    ratios = targets.shared_ratios(records)
    assert "| persist-queue SQLiteQueue, 1 process: k7 flush | not in this run |" in ratios
    assert ("| persist-queue SQLiteQueue, 1 process: k7 sync | 2,000 msg/s (fsync per put) "
            "| 1,000 msg/s (fsync per put) | 2.00 x |") in ratios
    assert "| litequeue, 4 processes | | not in this run | — |" in ratios
