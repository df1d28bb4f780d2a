"""The sinks' files go through k7core's one door (``open_fd``, ``read_file``,
``write_file_atomic``): staged files are owner-only, a link in place of the staging
directory is refused, and no module of k7core.spark opens, renames or replaces a file by
hand. Driven directly, without a Spark session."""

from __future__ import annotations

import ast
import errno
import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

import k7core
from k7core.spark import SINK_PREFIX, STAGING_DIR, K7BatchWriter, K7StreamWriter

SPARK = Path(k7core.__file__).parent / "spark"
QUERY_ID = "5d0f3b5e-7a53-4f0e-9c55-3f4c29a6f1d2"
SCHEMA = StructType([StructField("payload", BinaryType())])


def rows(*payloads: bytes) -> pa.RecordBatch:
    return pa.record_batch([pa.array(payloads, pa.binary())], names=["payload"])


def stream_writer(tmp_path: Path, target: Path) -> K7StreamWriter:
    ck = tmp_path / "ck"
    ck.mkdir(exist_ok=True)
    (ck / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    return K7StreamWriter({"path": str(target), "checkpointlocation": str(ck)}, SCHEMA, False)


def test_batch_sink_stages_owner_only_files_and_appends_them(tmp_path: Path) -> None:
    target = tmp_path / "q"  # the sink creates the queue directory, as Queue would
    w = K7BatchWriter({"path": str(target)}, SCHEMA, False)
    staged = [w.write(iter([rows(b"a", b"b")])), w.write(iter([rows(b"c")]))]
    for s in staged:
        assert Path(s.file).parent == target / STAGING_DIR
        assert stat.S_IMODE(os.stat(s.file).st_mode) == 0o600
    w.commit(list(staged))
    assert not any(Path(s.file).exists() for s in staged)
    with k7core.Queue(target, readonly=True) as q:
        batch = q.read_columnar(0)
        assert [bytes(batch.payload(i)) for i in range(len(batch))] == [b"a", b"b", b"c"]


def test_a_failed_task_leaves_nothing_staged(tmp_path: Path) -> None:
    w = K7BatchWriter({"path": str(tmp_path / "q")}, SCHEMA, False)
    bad = pa.record_batch([pa.array([b"x", None], pa.binary())], names=["payload"])
    with pytest.raises(k7core.K7Error, match="null payload"):
        w.write(iter([bad]))
    assert os.listdir(tmp_path / "q" / STAGING_DIR) == []


@pytest.mark.parametrize("where", [STAGING_DIR, f"{STAGING_DIR}/{QUERY_ID}"])
def test_a_link_in_place_of_the_staging_directory_is_refused(tmp_path: Path, where: str) -> None:
    target, elsewhere = tmp_path / "q", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"not the sink's")
    (target / where).parent.mkdir(parents=True)
    (target / where).symlink_to(elsewhere)
    w = stream_writer(tmp_path, target)
    with pytest.raises(k7core.StorageError, match="cannot open") as info:
        w.write(iter([rows(b"a")]))
    assert info.value.errno == errno.ENOTDIR  # O_NOFOLLOW | O_DIRECTORY on a link
    if where != STAGING_DIR:  # the stream's commit empties its stage: not through a link
        with pytest.raises(k7core.StorageError, match="cannot open"):
            w.commit([], 0)
    assert os.listdir(elsewhere) == ["keep"]


def test_the_stream_sink_record_is_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "q"
    w = stream_writer(tmp_path, target)
    w.commit([w.write(iter([rows(b"a")]))], 0)
    record = target / f"{SINK_PREFIX}{QUERY_ID}.json"
    assert json.loads(record.read_bytes())["state"] == "done"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert not (target / STAGING_DIR / QUERY_ID).exists()
    assert sorted(os.listdir(target / STAGING_DIR)) == []
    record.unlink()
    record.symlink_to(tmp_path / "ck" / "metadata")  # the record is read through the door
    with pytest.raises(k7core.StorageError, match="symbolic link"):
        stream_writer(tmp_path, target).commit([], 1)


def _file_calls(tree: ast.AST) -> list[str]:
    """Calls that open, rename or replace a file by hand (not through k7core._storage)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            found.append(f"open() at line {node.lineno}")
        elif isinstance(f, ast.Attribute) and (
            f.attr in ("open", "OSFile", "memory_map", "read_text", "write_text",
                       "read_bytes", "write_bytes", "fsync")
            or (isinstance(f.value, ast.Name) and f.value.id == "os"
                and f.attr in ("replace", "rename"))
        ):
            found.append(f"{ast.unparse(f)}() at line {node.lineno}")
    return found


def test_no_module_of_k7core_spark_opens_or_replaces_files_by_hand() -> None:
    found = {p.name: calls for p in sorted(SPARK.glob("*.py"))
             if (calls := _file_calls(ast.parse(p.read_text())))}
    assert not found, f"use k7core._storage (open_fd, read_file, write_file_atomic): {found}"
    assert _file_calls(ast.parse("os.replace(a, b); Path(p).open(); open(p)"))  # it can fail
