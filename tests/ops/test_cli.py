"""The ``k7`` console script, run for real in a subprocess (``.venv/bin/k7``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import k7core
from k7core._format import encode_frame_header
from tests._queuehelp import (
    CLI_SEG,
    K7,
    K7_TIMEOUT,
    cli_message,
    k7,
    offsets_of,
    read_all,
    run_python,
    seg_bases,
    seg_paths,
    snapshot,
)

# ---------------------------------------------------------------------------------- info


def test_info_json_and_table(qdir: Path) -> None:
    offs = offsets_of(qdir)
    r = k7("info", qdir, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["earliest_offset"] == 0 and st["segment_count"] >= 3
    assert st["next_offset"] == offs[-1] + k7core.frame_size(len(cli_message(199)))
    groups = {g["name"]: g for g in st["groups"]}
    assert groups["a"]["committed"] == offs[60] and groups["a"]["lag_messages"] == 140
    assert groups["b"]["committed"] == 0 and groups["b"]["lag_messages"] == 200
    r = k7("info", qdir)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode()
    for word in ("seg-00000000000000000000.k7", "groups", "140", "200"):
        assert word in text


@pytest.mark.parametrize("command", [
    ["info"], ["verify"], ["tail"], ["produce"], ["repair"], ["group", "{}", "list"],
])
def test_missing_directory_and_not_a_queue(tmp_path: Path, command: list[str]) -> None:
    def args(d: Path) -> list[str]:
        return [str(d) if c == "{}" else c for c in command] + (
            [] if "{}" in command else [str(d)])

    for d, words in ((tmp_path / "missing", "no such directory"),
                     (tmp_path, "is not a k7 queue")):
        r = k7(*args(d))
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert words in r.stderr.decode()
    f = tmp_path / "file"
    f.write_bytes(b"x")
    r = k7(*args(f))
    assert r.returncode == 3 and "is not a directory" in r.stderr.decode()
    assert not (tmp_path / "missing").exists()  # nothing was created


def test_bad_arguments_exit_2(qdir: Path) -> None:
    for args in (["tail", qdir, "--format", "xml"], ["tail", qdir, "--from", "soon"],
                 ["tail", qdir, "--max", "0"], ["bench", "--seconds", "0"], ["nosuch"],
                 ["group", qdir, "seek", "a", "-8"], ["group", qdir, "seek", "a", "3"],
                 ["group", qdir, "seek", "a", "99999999"]):
        r = k7(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr, args


def test_python_dash_m_and_import_without_cli_deps(qdir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "k7core", "info", str(qdir), "--json"],
                       capture_output=True, timeout=K7_TIMEOUT, check=False)
    assert r.returncode == 0 and json.loads(r.stdout)["segment_count"] >= 3
    code = "import sys, k7core; assert not {'click', 'rich'} & set(sys.modules), sys.modules"
    run_python(code, timeout=K7_TIMEOUT)


# ---------------------------------------------------------------------------------- verify


def test_verify_clean_and_never_writes(qdir: Path) -> None:
    before = snapshot(qdir)
    with k7core.Queue(qdir, segment_size=CLI_SEG, fsync="flush"):  # a live writer: no lock taken
        before = snapshot(qdir)
        r = k7("verify", qdir)
        assert r.returncode == 0, r.stderr
        assert b"ok: 200 frames" in r.stdout
        assert snapshot(qdir) == before


def test_verify_reports_a_cursor_inside_a_frame_or_past_the_end(qdir: Path) -> None:
    offs = offsets_of(qdir)
    with open(qdir / "cursor-a.k7", "r+b") as f:
        f.write((offs[60] + 4).to_bytes(8, "big"))
    with open(qdir / "cursor-b.k7", "r+b") as f:
        f.write((10**9).to_bytes(8, "big"))
    r = k7("verify", qdir)
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = r.stdout.decode()
    assert f"group 'a' is {offs[60] + 4}: inside a frame" in out
    assert f"`k7 group {qdir} seek a {offs[61]}` to continue from the next frame" in out
    assert "seek(" not in out  # the hint names the command, not the Python call
    assert "group 'b' is 1000000000: beyond the end of the log" in out
    assert "0 problem(s) in" in out and "2 bad cursor(s)" in out


def test_verify_reports_corrupt_frames_and_the_torn_tail(qdir: Path) -> None:
    offs = offsets_of(qdir)
    segs, bases = seg_paths(qdir), seg_bases(qdir)
    base1 = bases[1]
    bad = [o for o in offs if o > base1][2]  # the third frame of the second segment
    with open(segs[1], "r+b") as f:
        f.seek(bad - base1 + 12)
        f.write(b"\xff")  # a payload byte: the CRC no longer matches
    last_base = bases[-1]
    end = offs[-1] + k7core.frame_size(len(cli_message(199)))
    torn = encode_frame_header(0x30, 0) + b"half"  # a torn frame after a gap of 16 bytes
    with open(segs[-1], "r+b") as f:
        f.seek(end - last_base + 16)
        f.write(torn)
    before = snapshot(qdir)
    r = k7("verify", qdir)
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = r.stdout.decode()
    assert f"corrupt frame: {segs[1].name} offset {bad} " in out
    assert f"torn tail: {segs[-1].name} offset {end} " in out
    assert f"{16 + len(torn)} bytes" in out
    assert "199 valid frames" in out  # every other frame, the ones after the bad one too
    assert snapshot(qdir) == before  # no side file, nothing cut


# ---------------------------------------------------------------------------------- tail


def test_tail_formats_and_ranges(qdir: Path) -> None:
    offs = offsets_of(qdir)
    r = k7("tail", qdir)
    assert r.returncode == 0 and r.stdout.splitlines() == [cli_message(i) for i in range(200)]
    r = k7("tail", qdir, "--from", str(offs[10]), "--max", "3", "--offsets")
    assert r.stdout.splitlines() == [b"%d\t%s" % (offs[i], cli_message(i)) for i in (10, 11, 12)]
    r = k7("tail", qdir, "--max", "2", "--format", "hex")
    assert r.stdout.splitlines() == [cli_message(i).hex().encode() for i in (0, 1)]
    r = k7("tail", qdir, "--max", "2", "--format", "json")
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"offset": offs[i], "payload": cli_message(i).decode()} for i in (0, 1)]
    r = k7("tail", qdir, "--max", "3", "--format", "raw")
    assert r.stdout == cli_message(0) + cli_message(1) + cli_message(2)
    assert k7("tail", qdir, "--from", "latest").stdout == b""


def test_tail_with_a_group_acks_what_it_prints(qdir: Path) -> None:
    offs = offsets_of(qdir)
    r = k7("tail", qdir, "--group", "a", "--max", "5")
    assert r.returncode == 0 and r.stdout.splitlines() == [cli_message(i) for i in range(60, 65)]
    r = k7("tail", qdir, "--group", "a", "--max", "2")
    assert r.stdout.splitlines() == [cli_message(65), cli_message(66)]
    with k7core.Queue(qdir, readonly=True) as q:
        assert {g.name: g.committed for g in q.stats().groups}["a"] == offs[67]
    r = k7("tail", qdir, "--group", "new", "--from", str(offs[198]))
    assert r.stdout.splitlines() == [cli_message(198), cli_message(199)]
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("a") as g:
        r = k7("tail", qdir, "--group", "a")  # owned by this process
        assert r.returncode == 3 and b"GroupBusyError" in r.stderr
        assert g.committed == offs[67]


def test_tail_follow_waits_for_new_messages(tmp_path: Path) -> None:
    with k7core.Queue(tmp_path, segment_size=CLI_SEG, fsync="flush") as q:
        proc = subprocess.Popen([str(K7), "tail", str(tmp_path), "--follow", "--max", "40"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            q.enqueue_many([cli_message(i) for i in range(40)])  # crosses segments while it waits
            out, err = proc.communicate(timeout=K7_TIMEOUT)
        finally:
            proc.kill()
            proc.wait(timeout=K7_TIMEOUT)
        assert proc.returncode == 0, err
        assert out.splitlines() == [cli_message(i) for i in range(40)]


# ---------------------------------------------------------------------------------- produce


def test_produce_lines_and_null_separated(qdir: Path) -> None:
    r = k7("produce", qdir, "--batch", "3", stdin=b"one\ntwo\n\nfour\nfive")
    assert r.returncode == 0, r.stderr
    assert b"produced 5 message(s)" in r.stderr
    r = k7("produce", qdir, "--null", stdin=b"a\nb\0c")
    assert r.returncode == 0, r.stderr
    with k7core.Queue(qdir, readonly=True) as q:
        assert read_all(q)[200:] == [b"one", b"two", b"", b"four", b"five", b"a\nb", b"c"]
        assert max(s.size for s in q.stats().segments) == CLI_SEG  # new segments match the old


def test_produce_create_and_locked(tmp_path: Path) -> None:
    d = tmp_path / "new"
    r = k7("produce", d, stdin=b"x\n")
    assert r.returncode == 3 and b"no such directory" in r.stderr
    r = k7("produce", d, "--create", "--segment-size", "65536", stdin=b"x\ny\n")
    assert r.returncode == 0, r.stderr
    with k7core.Queue(d, segment_size=65536, fsync="flush") as q:
        r = k7("produce", d, stdin=b"z\n")
        assert r.returncode == 3 and b"QueueLockedError" in r.stderr and b"locked" in r.stderr
        assert read_all(q) == [b"x", b"y"]


# ---------------------------------------------------------------------------------- group


def test_group_list_seek_delete(qdir: Path) -> None:
    offs = offsets_of(qdir)
    r = k7("group", qdir, "list", "--json")
    assert [(g["name"], g["committed"]) for g in json.loads(r.stdout)] == [("a", offs[60]),
                                                                          ("b", 0)]
    assert b"a" in k7("group", qdir, "list").stdout
    assert k7("group", qdir, "seek", "b", str(offs[7])).returncode == 0
    r = k7("group", qdir, "seek", "a", "earliest")
    assert r.returncode == 0
    assert r.stdout.decode().strip() == f"group 'a': committed {offs[60]} -> 0"
    end = offs[-1] + k7core.frame_size(len(cli_message(199)))
    assert k7("group", qdir, "seek", "a", "latest").returncode == 0
    with k7core.Queue(qdir, readonly=True) as q:
        assert {g.name: g.committed for g in q.stats().groups} == {"a": end, "b": offs[7]}
    r = k7("group", qdir, "seek", "nobody", "0")
    assert r.returncode == 3 and b"no consumer group 'nobody'" in r.stderr
    with k7core.Queue(qdir, readonly=True) as q, q.consumer_group("b"):
        for args in (["seek", "b", "0"], ["delete", "b"]):
            r = k7("group", qdir, *args)
            assert r.returncode == 3 and b"owned" in r.stderr, (args, r.stderr)
    r = k7("group", qdir, "delete", "b")
    assert r.returncode == 0 and not (qdir / "cursor-b.k7").exists()
    assert k7("group", qdir, "delete", "b").returncode == 3


# ---------------------------------------------------------------------------------- repair


def test_repair_cuts_the_torn_tail_into_a_side_file(qdir: Path) -> None:
    r = k7("repair", qdir)
    assert r.returncode == 0 and b"nothing to repair" in r.stdout
    offs = offsets_of(qdir)
    end = offs[-1] + k7core.frame_size(len(cli_message(199)))
    last, base = seg_paths(qdir)[-1], seg_bases(qdir)[-1]
    torn = encode_frame_header(0x40, 0) + b"torn!"
    with open(last, "r+b") as f:
        f.seek(end - base)
        f.write(torn)
    with k7core.Queue(qdir, segment_size=CLI_SEG, fsync="flush"):
        r = k7("repair", qdir)
        assert r.returncode == 3 and b"writer" in r.stderr
    # the writer's open above already cut it: tear it again for repair
    with open(last, "r+b") as f:
        f.seek(end - base)
        f.write(torn)
    sides_before = set(qdir.glob("k7py-torn-*.bin"))
    r = k7("repair", qdir)
    assert r.returncode == 0, r.stderr
    (side,) = set(qdir.glob("k7py-torn-*.bin")) - sides_before
    assert f"at offset {end}: {len(torn)} bytes saved to {side.name}" in r.stdout.decode()
    assert side.read_bytes() == torn
    assert k7("verify", qdir).returncode == 0
    assert offsets_of(qdir) == offs


# ---------------------------------------------------------------------------------- bench


def test_bench_quick(tmp_path: Path) -> None:
    r = k7("bench", "--seconds", "0.6", "--dir", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["operation"] for x in rows] == ["enqueue", "enqueue_many(256)", "poll+ack(256)"]
    assert all(x["messages"] > 0 and x["per_second"] > 0 for x in rows)
    assert os.listdir(tmp_path) == []  # the temporary queue is removed


def test_verify_a_gap_and_a_short_sealed_segment(qdir: Path) -> None:
    segs, (base0, base1, *_) = seg_paths(qdir), seg_bases(qdir)
    offs = [o for o in offsets_of(qdir) if o < base1]
    with open(segs[0], "r+b") as f:  # zero the header of the last frame of segment 0
        f.seek(offs[-1] - base0)
        f.write(bytes(10))
    os.truncate(segs[1], 2048)  # segment 1 loses its end
    r = k7("verify", qdir)
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = r.stdout.decode()
    assert f"no frame where the sealed segment has data: {segs[0].name} offset {offs[-1]}" in out
    assert f"segment file too short: {segs[1].name} ends at position 2048" in out


def ok_frames(r: subprocess.CompletedProcess[bytes]) -> int:
    return int(r.stdout.split(b"ok: ")[1].split()[0].replace(b",", b""))


def test_info_and_verify_on_the_jvm_fixture(jvm_basic: tuple[Path, dict[str, object]]) -> None:
    d, manifest = jvm_basic
    r_verify = k7("verify", d)
    assert r_verify.returncode == 0, (r_verify.stdout, r_verify.stderr)
    r = k7("info", d, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    segments = manifest["segments"]
    assert isinstance(segments, list)
    assert [s["base"] for s in st["segments"]] == [s["base_offset"] for s in segments]
    groups = manifest["groups"]
    assert isinstance(groups, dict)
    assert {g["name"]: g["committed"] for g in st["groups"]} == {
        name: g["committed_offset"] for name, g in groups.items()}
    assert st["next_offset"] == segments[-1]["base_offset"] + segments[-1]["write_pos"]
    assert ok_frames(r_verify) == manifest["message_count"]
