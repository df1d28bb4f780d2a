"""The job stores' Prometheus collector, scraped with ``generate_latest``, and the store's
``counters()`` behind it."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from k7core.jobs import JobStore
from k7core.jobs.metrics import JobStoreCollector

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
COUNTERS = ("puts", "reserves", "deletes", "releases", "buries", "kicks", "timeouts")


def scrape(registry: CollectorRegistry) -> Samples:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_jobs_by_state_oldest_ready_age_and_counters(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    registry = CollectorRegistry()
    with JobStore(tmp_path / "a", clock=clock) as store, store.owner() as me:
        collector = JobStoreCollector(store, registry=registry)
        name = str(store.path)

        def jobs(tube: str, state: str) -> float:
            return m[("k7_jobs", (("state", state), ("store", name), ("tube", tube)))]

        def counter(what: str) -> float:
            return m[(f"k7_jobs_{what}_total", (("store", name),))]

        m = scrape(registry)
        assert not [k for k in m if k[0] == "k7_jobs"]  # no tube yet
        assert {w: counter(w) for w in COUNTERS} == dict.fromkeys(COUNTERS, 0)

        first = store.put(b"a", tube="mail")
        clock.now += 10
        ids = [store.put(b"b", tube="mail", key="k"), store.put(b"c", tube="mail", ttr=1)]
        assert store.put(b"again", tube="mail", key="k") == ids[0]  # found: nothing stored
        store.put(b"d", tube="mail", delay=60)
        waiting = store.put(b"e", tube="thumbs", depends_on=[first])
        clock.now += 5
        m = scrape(registry)
        assert [jobs("mail", s) for s in ("ready", "delayed", "reserved", "buried",
                                          "waiting")] == [3, 1, 0, 0, 0]
        assert jobs("thumbs", "waiting") == 1 and jobs("thumbs", "ready") == 0
        age = ("k7_jobs_oldest_ready_age_seconds", (("store", name), ("tube", "mail")))
        assert m[age] == 15  # `first`, put 15 s ago
        assert m[("k7_jobs_oldest_ready_age_seconds",
                  (("store", name), ("tube", "thumbs")))] == 0  # no ready job
        assert counter("puts") == 5

        j1 = me.reserve(("mail",), timeout=0)
        assert j1 is not None and j1.id == first
        me.release(first, error="later")
        me.reserve_job(first)
        me.bury(first, error="broken")
        store.kick("mail", 1)
        me.reserve_job(first)
        me.delete(first)  # frees `waiting`
        j2 = me.reserve(("mail",), timeout=0)
        assert j2 is not None and j2.id == ids[0]
        j3 = me.reserve(("mail",), timeout=0)
        assert j3 is not None and j3.id == ids[1]  # ttr 1
        store.kick_job(store.put(b"f", tube="mail", delay=60))
        clock.now += 2  # j3's time-to-run ran out
        m = scrape(registry)
        assert {w: counter(w) for w in COUNTERS} == {
            "puts": 6, "reserves": 5, "deletes": 1, "releases": 1, "buries": 1, "kicks": 2,
            "timeouts": 1}
        assert [jobs("mail", s) for s in ("ready", "delayed", "reserved", "buried",
                                          "waiting")] == [2, 1, 1, 0, 0]
        assert jobs("thumbs", "ready") == 1 and jobs("thumbs", "waiting") == 0
        assert store.peek(waiting) is not None

        with JobStore(tmp_path / "b") as other:
            collector.add_store(other)
            other.put(b"x")
            m = scrape(registry)
            assert m[("k7_jobs_puts_total", (("store", str(other.path)),))] == 1
            assert counter("puts") == 6  # each store its own
        m = scrape(registry)  # a closed store is skipped
        assert not [k for k in m if ("store", str(tmp_path / "b")) in k[1]]
        assert counter("puts") == 6
    assert not [k for k in scrape(registry) if k[0].startswith("k7_jobs")
                and k[1]]  # both closed: the families are there, without samples


def test_counters_start_at_zero_on_reopen(tmp_path: Path) -> None:
    with JobStore(tmp_path) as store:
        store.delete(store.put(b"x"))
        store.put(b"y")
        assert store.counters()["puts"] == 2 and store.counters()["deletes"] == 1
    with JobStore(tmp_path) as store:
        assert store.counters() == dict.fromkeys(COUNTERS, 0)
        assert len(store) == 1
