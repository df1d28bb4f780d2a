"""``k7 jobs``, run for real in a subprocess (``.venv/bin/k7``): each command's output and
exit status, the read-only commands next to a live store (which they must not touch), the
writing ones refused while it is live, bad arguments."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from k7core import DataLossError, StorageError
from k7core.jobs import JobState, JobStore
from k7core.jobs import _cli as jobs_cli
from k7core.jobs._store import load_state
from tests._childproc import Child
from tests._queuehelp import k7, wait_until
from tests.k7core.jobs._jobs_child import fill

CHILD = "tests.k7core.jobs._jobs_child"


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """A closed store filled by ``fill``: its directory and the ids."""
    d = tmp_path / "jobs"
    with JobStore(d, fsync="flush") as s:
        ids = fill(s)
    return d, ids


def tree(d: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``d`` (recursively): size and modification time. Equal trees mean
    nothing was created, deleted or written."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(root, name)
            st = p.lstat()
            out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns)
    return out


def stable_tree(d: Path) -> dict[str, tuple[int, int]]:
    """``tree(d)`` once two looks 0.2 s apart agree (a live store's background work done)."""
    seen = [tree(d)]

    def settled() -> bool:
        time.sleep(0.2)
        seen.append(tree(d))
        return seen[-1] == seen[-2]

    wait_until(settled, 30, "the store's directory to settle")
    return seen[-1]


def ok(r: subprocess.CompletedProcess[bytes]) -> str:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout.decode()


def failed(r: subprocess.CompletedProcess[bytes], code: int = 3) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------------- stats


def test_stats_json(store: tuple[Path, dict[str, int]]) -> None:
    d, _ = store
    st = json.loads(ok(k7("jobs", "stats", d, "--json")))
    assert st["path"] == str(d) and st["open"] is False and st["jobs"] == 6
    emails, thumbs = st["tubes"]["emails"], st["tubes"]["thumbs"]
    age = emails.pop("oldest_ready_age")
    assert 0 <= age < 60
    assert emails == {"ready": 2, "urgent": 1, "reserved": 0, "delayed": 1, "buried": 1,
                      "waiting": 0}
    assert thumbs == {"ready": 0, "urgent": 0, "reserved": 0, "delayed": 0, "buried": 1,
                      "waiting": 1, "oldest_ready_age": None}
    assert st["totals"] == {"ready": 2, "urgent": 1, "reserved": 0, "delayed": 1, "buried": 2,
                            "waiting": 1}
    assert st["journal"]["earliest_offset"] == 0 and st["journal"]["next_offset"] > 0
    assert st["journal"]["segments"] == 1
    assert st["snapshot"] is None and st["skipped_snapshots"] == [] and st["disk_bytes"] > 0


def test_stats_table_and_the_snapshot(store: tuple[Path, dict[str, int]]) -> None:
    d, _ = store
    with JobStore(d) as s:
        covered = s.snapshot()
    st = json.loads(ok(k7("jobs", "stats", d, "--json")))
    assert st["snapshot"]["covers_offset"] == covered and st["snapshot"]["bytes"] > 0
    assert st["jobs"] == 6  # the same jobs, from the snapshot
    text = ok(k7("jobs", "stats", d))
    assert f"{d}  store closed" in text
    lines = text.splitlines()
    (emails,) = [x for x in lines if "emails" in x]
    cells = [c.strip() for c in emails.split("│")[1:-1]]
    assert cells[:-1] == ["emails", "2", "1", "0", "1", "1", "0"]
    assert cells[-1].endswith(" s")  # the oldest ready job's age
    (thumbs,) = [x for x in lines if "thumbs" in x]
    assert [c.strip() for c in thumbs.split("│")[1:-1]] == ["thumbs", "0", "0", "0", "0", "1",
                                                          "1", "-"]
    (total,) = [x for x in lines if "all tubes" in x]
    assert [c.strip() for c in total.split("│")[1:-1]] == ["all tubes", "2", "1", "0", "1",
                                                         "2", "1", ""]
    assert f"{covered} (" in text  # snapshot at


def test_stats_of_an_empty_store(tmp_path: Path) -> None:
    with JobStore(tmp_path / "jobs"):
        pass
    assert "no tubes" in ok(k7("jobs", "stats", tmp_path / "jobs"))
    st = json.loads(ok(k7("jobs", "stats", tmp_path / "jobs", "--json")))
    assert st["jobs"] == 0 and st["tubes"] == {}


# ---------------------------------------------------------------------------------- peek


def test_peek_a_job_in_each_format(store: tuple[Path, dict[str, int]]) -> None:
    d, ids = store
    text = ok(k7("jobs", "peek", d, str(ids["bad"])))
    lines = text.splitlines()
    assert lines[:4] == [f"id: {ids['bad']}", "tube: emails", "state: buried", "pri: 2000"]
    assert [x.split(":")[0] for x in lines[:14]] == [
        "id", "tube", "state", "pri", "age", "delay", "ttr", "time-left", "file", "reserves",
        "timeouts", "releases", "buries", "kicks"]  # beanstalkd's stats-job, in its order
    assert "releases: 1" in lines and "buries: 1" in lines and "ttr: 60" in lines
    assert lines[14:] == ["errors: 2 (newest last)", "  - smtp timeout", "  - smtp 550",
                          "    mailbox unavailable", "body: 7 bytes", "bad one"]
    r = k7("jobs", "peek", d, str(ids["bin"]), "--format", "hex")
    assert ok(r).splitlines()[-3:] == ["key: k1", "body: 5 bytes", "ff0062696e"]
    r = k7("jobs", "peek", d, str(ids["bin"]), "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"\xff\x00bin"  # the body alone
    assert f"id: {ids['bin']}" in r.stderr.decode()
    got = json.loads(ok(k7("jobs", "peek", d, str(ids["wait"]), "--format", "json")))
    assert got["state"] == "waiting" and got["depends_on"] == [ids["bin"]]
    assert got["body"] == "waits" and got["key"] is None and got["errors"] == []
    got = json.loads(ok(k7("jobs", "peek", d, str(ids["bin"]), "--format", "json")))
    assert got["body_base64"] == "/wBiaW4=" and "body" not in got


def test_peek_the_next_job_of_a_tube(store: tuple[Path, dict[str, int]]) -> None:
    d, ids = store
    for flag, name in (("--ready", "e0"), ("--delayed", "late"), ("--buried", "bad")):
        got = json.loads(ok(k7("jobs", "peek", d, flag, "emails", "--format", "json")))
        assert got["id"] == ids[name], flag
    late = json.loads(ok(k7("jobs", "peek", d, "--delayed", "emails", "--format", "json")))
    assert 3500 < late["time-left"] <= 3600 and late["delay"] == 3600
    assert json.loads(ok(k7("jobs", "peek", d, "--buried", "thumbs", "--format", "json")))[
        "id"] == ids["bin"]
    err = failed(k7("jobs", "peek", d, "--ready", "thumbs"))
    assert f"tube 'thumbs' of {d} has no ready job" in err
    err = failed(k7("jobs", "peek", d, "--delayed", "nosuch"))
    assert "has no delayed job" in err
    err = failed(k7("jobs", "peek", d, "999999"))
    assert err.startswith(f"Error: JobNotFoundError: job 999999 not found in {d} (")


# ---------------------------------------------------------------------------------- errors


def test_errors_lists_the_buried_jobs_with_their_texts(
    store: tuple[Path, dict[str, int]],
) -> None:
    d, ids = store
    got = json.loads(ok(k7("jobs", "errors", d, "emails", "--json")))
    assert [(j["id"], j["errors"]) for j in got] == [
        (ids["bad"], ["smtp timeout", "smtp 550\nmailbox unavailable"])]  # newest last
    assert got[0]["releases"] == 1 and got[0]["buries"] == 1 and got[0]["state"] == "buried"
    text = ok(k7("jobs", "errors", d, "emails")).splitlines()
    assert text[0].startswith(f"job {ids['bad']}  pri 2000  age ")
    assert text[1:] == ["  - smtp timeout", "  - smtp 550", "    mailbox unavailable",
                        "1 buried job(s) in tube 'emails'"]
    text = ok(k7("jobs", "errors", d, "thumbs")).splitlines()
    assert "key k1" in text[0] and text[1:] == ["  (no error text)",
                                                "1 buried job(s) in tube 'thumbs'"]
    assert ok(k7("jobs", "errors", d, "nosuch")) == "no buried job in tube 'nosuch'\n"
    assert json.loads(ok(k7("jobs", "errors", d, "nosuch", "--json"))) == []


# ---------------------------------------------------------------------------------- writes


def test_kick_kick_job_and_delete(store: tuple[Path, dict[str, int]]) -> None:
    d, ids = store
    assert ok(k7("jobs", "kick", d, "emails", "0")) == (
        "kicked 0 buried job(s) of tube 'emails' to ready\n")
    assert ok(k7("jobs", "kick", d, "emails", "5")) == (
        "kicked 1 buried job(s) of tube 'emails' to ready\n")
    assert ok(k7("jobs", "kick", d, "emails", "5")) == (  # no buried one left: delayed ones
        "kicked 1 delayed job(s) of tube 'emails' to ready\n")
    assert ok(k7("jobs", "kick-job", d, str(ids["bin"]))) == (
        f"kicked job {ids['bin']} (buried, tube 'thumbs') to ready\n")
    err = failed(k7("jobs", "kick-job", d, str(ids["e0"])))
    assert f"job {ids['e0']} is ready: only a buried or delayed job can be kicked" in err
    err = failed(k7("jobs", "kick-job", d, "999999"))
    assert "JobNotFoundError: job 999999 not found" in err
    err = failed(k7("jobs", "delete", d, str(ids["e0"]), "999999"))
    assert f"JobNotFoundError: no live job 999999 in {d}: nothing deleted" in err
    assert ok(k7("jobs", "delete", d, str(ids["e0"]), str(ids["bin"]))).splitlines() == [
        f"deleted job {ids['e0']} (ready, tube 'emails')",
        f"deleted job {ids['bin']} (ready, tube 'thumbs')"]
    with JobStore(d) as s:  # what the commands did is stored
        assert s.peek(ids["e0"]) is None and s.peek(ids["bin"]) is None
        for name in ("bad", "late", "e1", "wait"):  # wait: its dependency is done
            job = s.peek(ids[name])
            assert job is not None and job.state is JobState.READY, name
        bad = s.peek(ids["bad"])
        late = s.peek(ids["late"])
        assert bad is not None and bad.kicks == 1 and late is not None and late.kicks == 1


def test_repair_a_damaged_journal(tmp_path: Path) -> None:
    """A damaged frame with valid ones after it: the writing commands refuse the store
    (naming the damage and the repair), `repair` opens it and says what it did."""
    d = tmp_path / "jobs"
    with JobStore(d) as s:
        ids = [s.put(b"job %d" % i) for i in range(10)]
    (seg,) = (d / "journal").glob("seg-*.k7")
    with seg.open("r+b") as f:
        f.seek(ids[4] - 1 + 12)  # a byte of job ids[4]'s body
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x20]))
    assert f"`k7 jobs repair {d}`" in failed(k7("jobs", "stats", d))
    err = failed(k7("jobs", "kick", d, "default", "1"))
    assert f"JournalDamagedError: the journal of job store {d} has a damaged frame at " \
           f"offset {ids[4] - 1}" in err and "k7 jobs repair" in err
    lines = ok(k7("jobs", "repair", d)).splitlines()
    assert lines[0].startswith("torn-tail-cut: ") and "saved to k7py-torn-" in lines[0]
    assert lines[1].startswith("journal-padded: ") and lines[2].startswith("4 live job(s)")
    assert ok(k7("jobs", "repair", d)) == "4 live job(s); the next job id is past every id " \
                                           "handed out\n"
    with JobStore(d) as s:
        assert len(s) == 4 and s.put(b"new") > ids[-1]


# ---------------------------------------------------------------------------------- live


def test_reads_of_a_live_store_take_no_lock_and_write_nothing(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    with Child("hold", str(d), program=CHILD) as child:
        ids = json.loads(child.line())
        before = stable_tree(d)
        st = json.loads(ok(k7("jobs", "stats", d, "--json")))
        assert st["open"] is True and st["jobs"] == 6
        # e1 is reserved in the child: reservations are not journaled, so it shows as ready
        assert st["tubes"]["emails"]["ready"] == 2 and st["totals"]["reserved"] == 0
        text = ok(k7("jobs", "stats", d))
        assert "store open (by another process)" in text
        assert "reserved: not journaled" in text
        got = json.loads(ok(k7("jobs", "peek", d, str(ids["bad"]), "--format", "json")))
        assert got["errors"] == ["smtp timeout", "smtp 550\nmailbox unavailable"]
        assert ok(k7("jobs", "peek", d, "--buried", "thumbs", "--format", "hex")).endswith(
            "ff0062696e\n")
        assert len(json.loads(ok(k7("jobs", "errors", d, "emails", "--json")))) == 1
        assert tree(d) == before
        # the writing commands need the store's lock: refused, and nothing written either
        for args in (["kick", str(d), "emails", "1"], ["kick-job", str(d), str(ids["bad"])],
                     ["delete", str(d), str(ids["e0"])]):
            err = failed(k7("jobs", *args))
            assert err.startswith(f"Error: QueueLockedError: job store {d} is open in "
                                  f"process {child.proc.pid} (stop the process that owns "
                                  "the store"), err
            assert "beanstalkd protocol" in err and "readonly" not in err
        assert tree(d) == before
        child.inp.close()
        assert child.wait() == 0, child.stderr()
    with JobStore(d) as s:  # the refused commands changed nothing
        assert len(s) == 6 and s.stats()["current-jobs-buried"] == 2


def test_reads_while_the_store_snapshots_and_trims(tmp_path: Path) -> None:
    """A busy store writes snapshots, deletes old ones and trims its journal all the time:
    a read that meets a file deleted under it tries again."""
    d = tmp_path / "jobs"
    with Child("churn", str(d), program=CHILD) as child:
        assert child.line() == b"ready"
        deadline = time.monotonic() + 60
        snapshots: set[int] = set()
        trimmed = 0
        runs = 0
        while runs < 10 or not (len(snapshots) > 2 and trimmed):
            assert time.monotonic() < deadline, (runs, snapshots, trimmed)
            st = json.loads(ok(k7("jobs", "stats", d, "--json")))
            runs += 1
            assert st["open"] is True and st["skipped_snapshots"] == []
            assert st["totals"]["buried"] == 2 and st["tubes"]["emails"]["ready"] == 2
            assert st["jobs"] in (6, 7)  # a churn job may be between its put and its delete
            if st["snapshot"]:
                snapshots.add(st["snapshot"]["covers_offset"])
            trimmed = max(trimmed, st["journal"]["earliest_offset"])
        child.inp.close()
        assert child.wait() == 0, child.stderr()


def test_a_read_tries_again_when_a_file_vanished(
    store: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: the first rebuilds meet a trimmed journal and a vanished segment."""
    d, _ = store
    calls: list[int] = []

    def racing(*args: object, **kw: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise DataLossError("trimmed meanwhile", earliest=8, path=d, offset=0)
        if len(calls) == 2:
            raise StorageError("gone", errno_=2, path=d)
        return load_state(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs_cli, "load_state", racing)
    look = jobs_cli.read_store(d)
    assert len(calls) == 3 and len(look.state.machine) == 6
    calls.clear()

    def denied(*args: object, **kw: object) -> object:
        raise StorageError("denied", errno_=13, path=d)

    monkeypatch.setattr(jobs_cli, "load_state", denied)
    with pytest.raises(StorageError, match="denied"):  # not a race: no second try
        jobs_cli.read_store(d)


# ---------------------------------------------------------------------------------- refusals


COMMANDS = [["stats", "{}"], ["peek", "{}", "1"], ["errors", "{}", "emails"],
            ["kick", "{}", "emails", "1"], ["kick-job", "{}", "1"], ["delete", "{}", "1"],
            ["repair", "{}"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_not_a_job_store(tmp_path: Path, command: list[str]) -> None:
    def run(d: Path) -> str:
        return failed(k7("jobs", *[str(d) if c == "{}" else c for c in command]))

    assert f"Error: {tmp_path / 'missing'}: no such directory" in run(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"x")
    assert "is not a directory" in run(tmp_path / "file")
    empty = tmp_path / "empty"
    (empty / "journal").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    for d in (tmp_path / "plain", empty):
        before = tree(d)
        assert (f"Error: {d} is not a k7 job store (it holds no journal/ directory with "
                "seg-*.k7 files)") in run(d)
        assert tree(d) == before  # nothing created: no store, no journal file
    assert not (tmp_path / "missing").exists()


def test_bad_arguments_exit_2(store: tuple[Path, dict[str, int]]) -> None:
    d, ids = store
    for args in (["peek", d], ["peek", d, str(ids["e0"]), "--ready", "emails"],
                 ["peek", d, "--ready", "emails", "--buried", "emails"],
                 ["peek", d, "abc"], ["peek", d, "0"], ["peek", d, "1", "--format", "xml"],
                 ["peek", d, "--ready", "-bad"], ["errors", d, "bad name"], ["errors", d],
                 ["kick", d, "emails", "-1"], ["kick", d, "emails"], ["kick", d, "a" * 201, "1"],
                 ["kick-job", d], ["kick-job", d, "x"], ["delete", d], ["delete", d, "1", "y"],
                 ["stats"], ["nosuch", d]):
        r = k7("jobs", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr and b"Traceback" not in r.stderr, args
    err = k7("jobs", "peek", d, "--ready", "-bad").stderr.decode()
    assert "tube name '-bad' is not valid" in err
    assert "give a job ID, or one of --ready" in k7("jobs", "peek", d).stderr.decode()
    assert "-1 is not in the range" in k7("jobs", "kick", d, "emails", "-1").stderr.decode()


def test_help_lists_the_jobs_commands() -> None:
    assert "jobs" in ok(k7("--help"))
    text = ok(k7("jobs", "--help"))
    for name in ("stats", "peek", "errors", "kick", "kick-job", "delete", "repair"):
        assert f"  {name} " in text, name
