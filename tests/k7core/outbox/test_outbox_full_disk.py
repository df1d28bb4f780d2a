"""A relay into a job store on a full disk (a small loop-mounted ext4 or tmpfs): the store's
identity file cannot be made, or the journal cannot roll. The relay says so with a
StorageError (never a raw OSError), leaves no stray file, keeps the rows in the outbox, and
relays each of them exactly once when space comes back."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

import k7core
from k7core.jobs import JobStore
from k7core.jobs._store import JOURNAL_SEGMENT
from k7core.outbox import SqliteRelay
from k7core.outbox._guard import STORE_ID
from tests.k7core.outbox._outboxhelp import App, counted, payloads, relay_all, setup, until
from tests.k7core.test_full_disk import _fill_disk, _mount, small_fs  # noqa: F401 (a fixture)

PAD = "x" * 60_000  # rows of 60 kB: 280 fill one of the journal's 16 MiB segments


@pytest.fixture(params=["ext4", "tmpfs"])
def roomier_fs(request: pytest.FixtureRequest) -> Iterator[Path]:
    """``small_fs``, with room for four of the journal's segments."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mnt, _ = _mount(str(request.param), 4 * (JOURNAL_SEGMENT >> 20) + 8)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
        shutil.rmtree(mnt.parent, ignore_errors=True)


def check_enospc(exc: BaseException | None) -> None:
    assert isinstance(exc, k7core.StorageError), repr(exc)
    assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
    assert exc.hint, exc


def test_a_store_without_its_identity_on_a_full_disk(
    small_fs: Path, db_path: Path, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    app = App("sqlite", str(db_path))
    box = setup(app)
    for n in range(10):
        box.put(app.conn, "t", n)
    app.commit()
    with JobStore(small_fs / "jobs") as store:
        filler = _fill_disk(small_fs, 0)
        with SqliteRelay(db_path, store) as relay:
            until(lambda: relay.error is not None)
            check_enospc(relay.error)
            assert sorted(p.name for p in store.path.iterdir()) == ["journal"], "a stray file"
            assert (app.count(), len(store)) == (10, 0)
            filler.unlink()
            until(lambda: relay.relayed == 10)
        assert (store.path / STORE_ID).exists()
        assert caplog.records and all(r.exc_info is None for r in caplog.records), (
            "a K7Error is logged without a traceback")
        assert payloads(store) == list(range(10))


def test_a_journal_that_cannot_roll_keeps_the_rows(roomier_fs: Path, db_path: Path) -> None:
    app = App("sqlite", str(db_path))
    box = setup(app)
    total = 700  # more than the segment and its spare hold (the disk is filled after them)
    fs = roomier_fs
    with JobStore(fs / "jobs", snapshot_bytes=1 << 40) as store:
        with closing(SqliteRelay(db_path, store, batch=50)) as relay:  # no thread: this one
            relay.relay_once()  # binds the outbox, makes the store's identity
            filler = _fill_disk(fs, 0)
            for n in range(total):
                box.put(app.conn, "t", {"n": n, "pad": PAD})
            app.commit()
            with pytest.raises(k7core.StorageError) as info:
                relay_all(relay)
            check_enospc(info.value)
            assert 0 < relay.relayed < total
            left = app.execute("SELECT count(*) FROM k7_outbox")[0][0]
            assert left >= total - relay.relayed  # SQLite keeps relayed rows up to a trim
            filler.unlink()
            relay_all(relay)
            assert relay.relayed == total
        got = [p["n"] for p in payloads(store)]
        assert counted(got) == counted(list(range(total))), "a row lost or doubled"
    with JobStore(fs / "jobs") as store:
        assert len(store) == 0
