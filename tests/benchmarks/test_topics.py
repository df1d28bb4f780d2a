"""The topics benchmark module (issue 18): every case runs once on a few records and gives
its records; the Redis legs are skipped with a reason when redis-py or redis-server is
missing, and with ``--no-peers``; the routing cases while the exchanges' Router is not in
the build. No speed is checked."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from benchmarks import _jobs, _topics
from benchmarks._harness import Case

TINY = _topics.Sizes(records=2_000, sync_records=200, send_records=400, routes=2_000,
                     publish=300)
UNITS = {"msg/s", "MB/s", "x", "us"}


def _run_once(case: Case, root: Path) -> dict[str, tuple[str, float]]:
    with case.setup(root) as run:
        samples = run()
    assert samples
    for name, (unit, value) in samples.items():
        assert name.startswith(case.name + " ") or name == case.name, name
        assert unit in UNITS and value > 0, (name, unit, value)
    return samples


def test_names_and_skips_without_peers() -> None:
    cases, skipped = _topics.cases(TINY, with_peers=False)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    assert all(n.startswith("topics ") for n in names + [s.name for s in skipped])
    assert {_topics.k7_name("async"), _topics.k7_name("sync"), _topics.SEND_CASE} <= set(names)
    reasons = {s.name: s.reason for s in skipped}
    assert reasons[_topics.redis_name("async")] == "--no-peers"
    assert reasons[_topics.redis_name("sync")] == "--no-peers"
    assert {c.params["durability"] for c in cases if "routing" not in c.name} == {
        _jobs.OS_BUFFERED, _jobs.FSYNC_PER_PUT}


def test_a_missing_redis_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    cases, skipped = _topics.cases(TINY, with_peers=True)
    assert not [c for c in cases if "Redis" in c.name]
    assert {s.name for s in skipped} >= {_topics.redis_name("async"), _topics.redis_name("sync")}
    # the first thing missing is named: redis-py on a machine without it, else the server
    why = ("redis-py not installed" if importlib.util.find_spec("redis") is None
           else "redis-server not on the PATH")
    assert all(why in s.reason for s in skipped if "Redis" in s.name)


def test_the_producers_split_every_record() -> None:
    for total in (0, 3, 4, 1_001):
        split = _topics._split(total)
        assert len(split) == _topics.PRODUCERS and sum(n for _, n in split) == total
        assert [first for first, _ in split] == [sum(n for _, n in split[:j])
                                                for j in range(_topics.PRODUCERS)]


def test_a_failing_child_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited before"):
        _topics.run_children([{"kind": "no-such-kind"}])


@pytest.mark.parametrize("case", _topics.cases(TINY, with_peers=False)[0],
                         ids=lambda c: c.name)
def test_k7_case_runs(case: Case, tmp_path: Path) -> None:
    samples = _run_once(case, tmp_path)
    if case.name.startswith("topics routing"):
        assert set(samples) == {case.name, f"{case.name} per record"}
        assert case.params["destinations_per_record"] > 0
    elif case.name == _topics.PUBLISH_CASE:
        assert set(samples) == {f"{case.name} {w}" for w in ("publish", "Topic.send",
                                                             "publish/send")}
    else:
        assert f"{case.name} producers" in samples
    assert [p.name for p in tmp_path.iterdir()] == []  # each run's topic is removed


@pytest.mark.skipif(_topics.redis_missing() is not None,
                    reason=_topics.redis_missing() or "")
@pytest.mark.parametrize("fsync", ["async", "sync"])
def test_pair_runs(fsync: str, tmp_path: Path) -> None:
    cases, skipped = _topics.cases(TINY, with_peers=True)
    assert not [s for s in skipped if "Redis" in s.name]
    (case,) = [c for c in cases if c.name == _topics.pair_name(fsync)]
    samples = _run_once(case, tmp_path)
    for side in ("k7", "redis"):
        for what in ("producers", "producers MB/s", "consumers", "consumers MB/s",
                     "end to end", "producers CPU per record", "consumers CPU per record"):
            assert f"{case.name} {side} {what}" in samples
    assert f"{case.name} redis producers server CPU per record" in samples
    ratios = {n: v for n, (u, v) in samples.items() if u == "x"}
    assert set(ratios) == {f"{case.name} k7/redis {w}"
                           for w in ("producers", "consumers", "end to end")}
