"""``k7 topics``: each command on real topics and exchanges in a temporary directory (through
click's CliRunner on ``k7core.cli.cli``, so that its ``K7Error`` translation runs, and the
console script in a subprocess for the exit statuses and a closed pipe), their JSON read back,
and the errors on bad input with their exit statuses and messages."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from k7core import Queue
from k7core.cli import cli
from k7core.topics import Binding, Exchange, ProducerRecord, Topic
from tests._queuehelp import K7, K7_TIMEOUT, k7

SEG = 4096
TS = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z


def run(*args: str | int | Path) -> Result:
    # wide: the tables' long temporary paths on one line
    return CliRunner().invoke(cli, ["topics", *map(str, args)], env={"COLUMNS": "300"})


def ok(r: Result) -> str:
    assert r.exit_code == 0, (r.exit_code, r.output, r.exception)
    return r.stdout


def failed(r: Result, code: int = 3) -> str:
    """The error output of a command that failed with ``code`` and no traceback."""
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception  # click's exit, not a crash
    assert "Traceback" not in r.output
    return " ".join(r.stderr.split())  # rich and click wrap long lines


def cells(text: str, first: str) -> list[list[str]]:
    """The cells of the table rows whose first cell is ``first``."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()
            if line.startswith(f"│ {first} ")]


def tree(d: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``d``: size and modification time (equal: nothing written)."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            st = Path(root, name).lstat()
            out[os.path.relpath(Path(root, name), d)] = (st.st_size, st.st_mtime_ns)
    return out


def segment_sizes(topic: Path) -> set[int]:
    return {p.stat().st_size for p in topic.glob("partition-*/seg-*.k7")}


@pytest.fixture
def topic(tmp_path: Path) -> Path:
    """A closed topic of 4 partitions (4 KiB segments), 3 records in each."""
    d = tmp_path / "orders"
    with Topic(d, partitions=4, segment_size=SEG) as t:
        for p in range(4):
            for i in range(3):
                t.send(b"r-%d-%d" % (p, i), partition=p, timestamp=TS)
    return d


# ---------------------------------------------------------------------------------- create


def test_create_a_topic_and_again_with_the_same_settings(tmp_path: Path) -> None:
    d = tmp_path / "new" / "orders"
    out = ok(run("create", d, "--partitions", 3, "--partitioner", "murmur3",
                 "--segment-size", SEG))
    assert out == f"created topic {d}: 3 partition(s), partitioner murmur3, 4,096-byte " \
                  "segments\n"
    with Topic(d, readonly=True) as t:
        assert (t.partitions, t.partitioner) == (3, "murmur3")
    assert sorted(p.name for p in d.glob("partition-*")) == [f"partition-{i}" for i in range(3)]
    assert segment_sizes(d) == {SEG}
    before = tree(d)
    out = ok(run("create", d, "--partitions", 3))  # the partitioner: the topic's own
    assert out == f"topic {d} exists: 3 partition(s), partitioner murmur3, 4,096-byte " \
                  "segments\n"
    assert ok(run("create", d, "--partitions", 3, "--segment-size", SEG)) == out
    assert tree(d) == before  # an existing topic is only read
    assert ok(run("create", tmp_path / "dflt", "--partitions", 1)).endswith(
        "partitioner kafka, 33,554,432-byte segments\n")


def test_create_refuses_other_settings_with_the_topic_errors_message_and_hint(
        topic: Path) -> None:
    err = failed(run("create", topic, "--partitions", 8))
    assert err == (f"Error: TopicError: topic {topic} has 4 partitions, not 8 (`k7 topics "
                   f"info {topic}` shows the topic's settings; a topic's partition count is "
                   "fixed when it is created, so that keys keep their partition)")
    err = failed(run("create", topic, "--partitions", 4, "--partitioner", "murmur3"))
    assert err == (f"Error: TopicError: topic {topic} places keys with 'kafka', not "
                   f"'murmur3' (`k7 topics info {topic}` shows the topic's settings; its "
                   "partitioner is fixed when it is created, so that keys keep their "
                   "partition)")
    err = failed(run("create", topic, "--partitions", 4, "--segment-size", 8192))
    assert err == (f"Error: topic {topic} exists with 4,096-byte segments, not 8,192 (a "
                   "topic's writers keep the size of its segments)")
    assert segment_sizes(topic) == {SEG}


def test_create_bad_arguments_and_directories(tmp_path: Path) -> None:
    bad: list[list[str | int]] = [
        ["--partitions", 0], ["--partitions", 4097], ["--partitions", 2, "--segment-size", 100],
        ["--partitions", 2, "--partitioner", "crc32"], []]
    for args in bad:
        failed(run("create", tmp_path / "t", *args), 2)
    assert not (tmp_path / "t").exists()
    Queue(tmp_path / "q", segment_size=SEG).close()
    assert failed(run("create", tmp_path / "q", "--partitions", 2)) == \
        f"Error: {tmp_path / 'q'} is a k7 queue: a topic needs a directory of its own"
    Exchange(tmp_path / "x", "fanout").close()
    assert "is a k7 exchange: a topic needs a directory of its own" in failed(
        run("create", tmp_path / "x", "--partitions", 2))
    (tmp_path / "f").write_bytes(b"")
    assert failed(run("create", tmp_path / "f", "--partitions", 2)) == \
        f"Error: {tmp_path / 'f'} is not a directory"
    assert not list((tmp_path / "q").glob("k7py-topic*"))


# ---------------------------------------------------------------------------------- info


def test_info_json_is_the_topics_stats_and_the_table_shows_owners_and_holders(
        topic: Path) -> None:
    with Topic(topic, segment_size=SEG) as t:
        with t.consumer("audit", "x"):
            pass  # joined and left: a group with no member
        a = t.consumer("billing", "a")
        recs = a.poll(max_records=100, timeout=0)
        assert len(recs) == 12
        a.ack_many([r for r in recs if r.partition < 2])
        b = t.consumer("billing", "b")  # sticky: a keeps 0 and 1, b gets 2 and 3...
        a.beat()
        b.beat()  # ... which a holds while their records are in flight
        plain = t.partition(3).consumer_group("audit")  # a queue's group: no member
        try:
            before = tree(topic)
            got = json.loads(ok(run("info", topic, "--json")))
            text = ok(run("info", topic))
            assert tree(topic) == before  # read only
            with Topic(topic, readonly=True) as ro:
                expected = dataclasses.asdict(ro.stats())
        finally:
            plain.close()
            a.close()
            b.close()
    assert got == json.loads(json.dumps(expected))
    assert got["path"] == str(topic) and got["partitioner"] == "kafka"
    assert [(p["partition"], p["earliest_offset"], p["next_offset"])
            for p in got["partitions"]] == [(p, 0, 96) for p in range(4)]
    assert all(p["writer_pids"] == [os.getpid()] for p in got["partitions"])
    assert got["back_pressure"] is None
    audit, billing = got["groups"]
    assert (billing["name"], billing["generation"], billing["strategy"], billing["members"],
            billing["assignment"]) == ("billing", 2, "sticky", ["a", "b"],
                                       {"a": [0, 1], "b": [2, 3]})
    assert [(p["owner"], p["holder"], p["owned"], p["committed"], p["lag_bytes"],
             p["lag_messages"]) for p in billing["partitions"]] == [
        ("a", "a", True, 96, 0, 0), ("a", "a", True, 96, 0, 0),
        ("b", "a", True, 0, 96, 3), ("b", "a", True, 0, 96, 3)]
    assert audit["members"] == [] and audit["partitions"][3]["owned"] is True
    assert audit["partitions"][3]["holder"] is None

    assert f"{topic}  4 partition(s), partitioner kafka" in text
    assert cells(text, "0")[0] == ["0", "0", "96", "96", str(os.getpid())]
    assert "group billing: generation 2, strategy sticky, members: a, b" in text
    assert "group audit: generation 2, strategy sticky, members: none" in text
    rows = cells(text, "2")  # partition 2: in the partitions table, audit's, billing's
    assert rows[1:] == [["2", "-", "-", "0", "96", "3"], ["2", "b", "a", "0", "96", "3"]]
    assert cells(text, "3")[1] == ["3", "-", "locked", "0", "96", "3"]
    assert cells(text, "all") == [["all", "", "", "", "384", "12"],
                                  ["all", "", "", "", "192", "6"]]


def test_info_of_a_topic_without_groups(topic: Path) -> None:
    text = ok(run("info", topic))
    assert "no consumer groups" in text and cells(text, "3") == [["3", "0", "96", "96", "-"]]
    assert json.loads(ok(run("info", topic, "--json")))["groups"] == []


# ---------------------------------------------------------------------------------- send


def test_send_places_by_key_keeps_the_segment_size_and_prints_partition_offset(
        topic: Path) -> None:
    out = ok(run("send", topic, "--key", "customer-42", "--header", "type=order.created",
                 "--header", "trace=a=b", "--header", "type=again", '{"total": 12}'))
    p, offset = map(int, out.split())
    with Topic(topic, readonly=True) as t:
        assert p == t.partition_for("customer-42") and offset == 96
        (r,) = t.read(p, offset)
    assert (r.key, r.value) == (b"customer-42", b'{"total": 12}')
    assert r.headers == (("type", b"order.created"), ("trace", b"a=b"), ("type", b"again"))
    # an argument that is not UTF-8 (its bytes reach Python as surrogates) is sent as it was
    assert ok(run("send", topic, "--partition", 2, "--key", "", "bin\udcff")) == "2 96\n"
    with Topic(topic, readonly=True) as t:
        (r,) = t.read(2, 96)
    assert (r.key, r.value, r.headers) == (b"", b"bin\xff", ())
    # the writer took the partitions' own segment size: not resized to the default 32 MiB
    assert segment_sizes(topic) == {SEG}


def test_send_bad_partition_and_headers(topic: Path) -> None:
    err = failed(run("send", topic, "--partition", 4, "x"), 2)
    assert ("Invalid value for --partition: partition 4 is out of range: topic "
            f"{topic} has 4 partition(s), 0 .. 3") in err
    failed(run("send", topic, "--partition", -1, "x"), 2)
    assert "Invalid value for '--header': 'type' is not NAME=VALUE" in failed(
        run("send", topic, "--header", "type", "x"), 2)
    assert "'=x' has an empty name" in failed(run("send", topic, "--header", "=x", "x"), 2)
    assert "header name 'n\\udcff' is not valid UTF-8" in failed(
        run("send", topic, "--header", "n\udcff=1", "x"), 2)
    with Topic(topic, readonly=True) as t:
        assert [t.partition(p).end for p in range(4)] == [96] * 4  # nothing was sent


# ---------------------------------------------------------------------------------- tail


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A topic of 2 partitions whose records have odd keys, headers and values."""
    d = tmp_path / "odd"
    with Topic(d, partitions=2, segment_size=SEG) as t:
        t.send_many([
            ProducerRecord(b"plain", None, None, TS, 0),
            ProducerRecord(b"tab\there\nnew \\ line", b"", [("h", b"1"), ("h", b"\xff")],
                           TS + 1, 0),
            ProducerRecord(b"\xff\x00bin", b"k\xfe", {"n": "v"}, TS + 2, 1),
            ProducerRecord("é".encode(), "κ", None, TS + 3, 1),
        ])
    return d


def test_tail_prints_every_partition_as_text_and_json(odd: Path) -> None:
    lines = ok(run("tail", odd)).splitlines()
    assert lines == [
        "0\t0\t2023-11-14T22:13:20.123Z\t-\t-\tplain",
        "0\t32\t2023-11-14T22:13:20.124Z\t\th=1,h=\\xff\ttab\\there\\nnew \\\\ line",
        "1\t0\t2023-11-14T22:13:20.125Z\tk\\xfe\tn=v\t\\xff\\x00bin",
        "1\t48\t2023-11-14T22:13:20.126Z\tκ\t-\té",
    ]
    got = [json.loads(x) for x in ok(run("tail", odd, "--json")).splitlines()]
    assert got[0] == {"partition": 0, "offset": 0, "timestamp": TS, "key": None,
                      "headers": [], "value": "plain"}
    assert got[1] == {"partition": 0, "offset": 32, "timestamp": TS + 1, "key": "",
                      "headers": [{"name": "h", "value": "1"},
                                  {"name": "h", "value_base64": "/w=="}],
                      "value": "tab\there\nnew \\ line"}
    assert got[2]["key_base64"] == base64.b64encode(b"k\xfe").decode() and "key" not in got[2]
    assert base64.b64decode(got[2]["value_base64"]) == b"\xff\x00bin"
    assert (got[3]["key"], got[3]["value"]) == ("κ", "é")


def test_tail_partition_from_and_limit(odd: Path) -> None:
    def offsets(*args: str | int) -> list[tuple[int, int]]:
        return [(r["partition"], r["offset"]) for r in
                map(json.loads, ok(run("tail", odd, "--json", *args)).splitlines())]

    assert offsets("--partition", 1) == [(1, 0), (1, 48)]
    assert offsets("--partition", 1, "--from", 48) == [(1, 48)]
    assert offsets("--partition", 0, "--from", 96) == []  # the end
    assert offsets("--limit", 3) == [(0, 0), (0, 32), (1, 0)]
    assert offsets("--partition", 0, "--limit", 1, "--from", "earliest") == [(0, 0)]
    assert offsets("--from", "latest") == []
    with Topic(odd, segment_size=SEG) as t:
        t.send(b"new", partition=1)
    assert offsets("--partition", 1, "--from", 48) == [(1, 48), (1, 80)]


def test_tail_bad_offsets_and_partitions(odd: Path) -> None:
    err = failed(run("tail", odd, "--partition", 0, "--from", 8), 2)
    assert ("Invalid value for --from: partition 0: offset 8: inside a frame of "
            "seg-00000000000000000000.k7 (it starts at 0, the next one at 32); `--from 32` "
            "starts at the next record") in err
    assert "offset 99: beyond the end of the log (96)" in failed(
        run("tail", odd, "--partition", 0, "--from", 99), 2)
    assert "--from OFFSET needs --partition: offsets are per partition" in failed(
        run("tail", odd, "--from", 24), 2)
    assert "'soon' is not 'earliest', 'latest' or an offset" in failed(
        run("tail", odd, "--from", "soon"), 2)
    assert "an offset is >= 0" in failed(run("tail", odd, "--partition", 0, "--from", -8), 2)
    assert "partition 2 is out of range: topic" in failed(
        run("tail", odd, "--partition", 2), 2)
    failed(run("tail", odd, "--limit", 0), 2)


def test_tail_stops_quietly_when_the_pipe_closes(tmp_path: Path) -> None:
    d = tmp_path / "big"
    with Topic(d, partitions=1, segment_size=1 << 20) as t:
        t.send_many([b"x" * 200] * 2_000)  # 400 kB of lines: more than a pipe holds
    r = subprocess.run(f"{K7} topics tail {d} | head -1", shell=True, capture_output=True,
                       timeout=K7_TIMEOUT, check=False)
    assert r.returncode == 0 and r.stdout.count(b"\n") == 1, r
    assert r.stderr == b""


# ---------------------------------------------------------------------------------- exchanges


@pytest.fixture
def dests(tmp_path: Path, topic: Path) -> Iterator[tuple[Path, Path]]:
    """A topic (``topic``) and a queue to bind."""
    Queue(tmp_path / "audit", segment_size=SEG).close()
    yield topic, tmp_path / "audit"


def test_exchange_create_show_and_json(tmp_path: Path, dests: tuple[Path, Path]) -> None:
    x = tmp_path / "events"
    out = ok(run("exchange", x, "--create", "topic"))
    assert out.splitlines() == [f"created topic exchange {x}",
                                f"{x}  topic exchange, 0 binding(s)",
                                f"no bindings (`k7 topics bind {x} DEST` adds one)"]
    assert Exchange(x).kind == "topic"
    assert ok(run("exchange", x, "--create", "topic")).splitlines()[0] == \
        f"{x}  topic exchange, 0 binding(s)"  # exists: not created again
    assert failed(run("exchange", x, "--create", "direct")) == \
        (f"Error: exchange {x} is of kind 'topic', not 'direct' (its kind is fixed when it "
         "is created)")
    orders, audit = dests
    with Exchange(x) as ex:
        ex.bind(orders, "order.*")
        ex.bind(audit, "#")
    got = json.loads(ok(run("exchange", x, "--json")))
    assert got == {"path": str(x), "kind": "topic", "bindings": [
        {"destination": str(orders), "routing_key": "order.*", "headers": [],
         "x_match": "all"},
        {"destination": str(audit), "routing_key": "#", "headers": [], "x_match": "all"}]}
    text = ok(run("exchange", x))
    assert cells(text, str(orders)) == [[str(orders), "topic", '"order.*"']]
    assert cells(text, str(audit)) == [[str(audit), "queue", '"#"']]
    failed(run("exchange", x, "--create", "amqp"), 2)


def test_bind_routes_records_and_unbind_removes_the_binding(
        tmp_path: Path, dests: tuple[Path, Path]) -> None:
    orders, audit = dests
    x = tmp_path / "events"
    Exchange(x, "topic").close()
    assert ok(run("bind", x, orders, "--key", "order.*")) == f'bound: {orders} pattern ' \
                                                             '"order.*"\n'
    assert ok(run("bind", x, audit, "--key", "#")) == f'bound: {audit} pattern "#"\n'
    assert ok(run("bind", x, audit, "--key", "#")) == f'already bound: {audit} pattern "#"\n'
    with Exchange(x) as ex:
        assert ex.bindings() == (Binding(str(orders), "order.*"), Binding(str(audit), "#"))
        assert ex.route("order.created") == [str(orders), str(audit)]
        assert ex.route("user.signup") == [str(audit)]
    assert ok(run("unbind", x, audit, "--key", "#")) == f'unbound: {audit} pattern "#"\n'
    assert failed(run("unbind", x, audit, "--key", "#")) == (
        f'Error: exchange {x} has no binding {audit} pattern "#" (`k7 topics exchange {x}` '
        "lists its bindings)")
    with Exchange(x) as ex:
        assert ex.bindings() == (Binding(str(orders), "order.*"),)


def test_headers_bindings_and_notes(tmp_path: Path, dests: tuple[Path, Path]) -> None:
    orders, audit = dests
    x = tmp_path / "hx"
    Exchange(x, "headers").close()
    out = ok(run("bind", x, audit, "--header", "region=eu", "--header", "type=order",
                 "--x-match", "any"))
    assert out == f"bound: {audit} headers region=eu,type=order x-match any\n"
    # the same binding, headers in another order: not stored twice, and unbound by either
    assert ok(run("bind", x, audit, "--header", "type=order", "--header", "region=eu",
                  "--x-match", "any")).startswith("already bound")
    text = ok(run("exchange", x))
    assert cells(text, str(audit)) == [[str(audit), "queue", "region=eu,type=order", "any"]]
    r = run("bind", x, orders, "--key", "ignored")
    assert r.exit_code == 0 and "note: a headers exchange ignores --key" in r.stderr
    with Exchange(x) as ex:
        assert len(ex.bindings()) == 2
        # orders' binding has no pairs: under x-match all it matches every record
        assert ex.route("", {"region": "eu"}) == [str(audit), str(orders)]
        assert ex.route("", {"region": "us"}) == [str(orders)]
    ok(run("unbind", x, audit, "--header", "type=order", "--header", "region=eu",
           "--x-match", "any"))
    ok(run("unbind", x, orders, "--key", "ignored"))
    with Exchange(x) as ex:
        assert ex.bindings() == ()
    fan = tmp_path / "fan"
    Exchange(fan, "fanout").close()
    r = run("bind", fan, orders, "--header", "a=1")
    assert r.exit_code == 0 and "note: a fanout exchange ignores --header" in r.stderr
    assert r.stdout == f"bound: {orders}\n"


def test_bind_bad_arguments_and_destinations(tmp_path: Path,
                                             dests: tuple[Path, Path]) -> None:
    orders, audit = dests
    x = tmp_path / "hx"
    Exchange(x, "headers").close()
    assert "binding header 'region' is given twice (give each name once)" in failed(
        run("bind", x, audit, "--header", "region=eu", "--header", "region=us"), 2)
    assert "a binding header name is 'x-match' (--x-match sets it)" in failed(
        run("bind", x, audit, "--header", "x-match=any"), 2)
    assert "'x' is not NAME=VALUE" in failed(run("bind", x, audit, "--header", "x"), 2)
    failed(run("bind", x, audit, "--x-match", "some"), 2)
    missing = tmp_path / "nowhere"
    assert failed(run("bind", x, missing)) == (
        f"Error: destination {missing}: no such directory (`k7 topics create {missing} "
        f"--partitions N` creates a topic, `k7 produce {missing} --create` a queue)")
    assert failed(run("bind", x, orders / "partition-0")) == (
        f"Error: destination {orders / 'partition-0'} is a partition of topic {orders}: bind "
        "the topic (its partitions hold only records)")
    (tmp_path / "plain").mkdir()
    for d in (tmp_path / "plain", x):
        assert failed(run("bind", x, d)) == \
            f"Error: destination {d} is neither a k7 topic nor a k7 queue"
    assert "is not a k7 exchange" in failed(run("bind", tmp_path / "plain", audit))
    with Exchange(x) as ex:
        assert ex.bindings() == ()  # nothing was bound


# ---------------------------------------------------------------------------------- not one


@pytest.mark.parametrize("command", [
    ["info"], ["tail"], ["send", "v"], ["exchange"], ["bind", "DEST"], ["unbind", "DEST"],
])
def test_directories_that_are_not_what_the_command_needs(
        tmp_path: Path, topic: Path, command: list[str]) -> None:
    want = "exchange" if command[0] in ("exchange", "bind", "unbind") else "topic"
    Queue(tmp_path / "q", segment_size=SEG).close()
    Exchange(tmp_path / "x", "direct").close()
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_bytes(b"")
    other = topic if want == "exchange" else tmp_path / "x"

    def args(d: Path) -> list[str]:
        return [command[0], str(d), *(str(topic) if c == "DEST" else c for c in command[1:])]

    an = "an exchange" if want == "exchange" else "a topic"
    create = ("`k7 topics create {d} --partitions N`" if want == "topic" else
              "`k7 topics exchange {d} --create KIND`")
    meta = "k7py-topic.json" if want == "topic" else "k7py-exchange.json"
    other_kind, reader = ("topic", "info") if want == "exchange" else ("exchange", "exchange")
    cases = {
        tmp_path / "missing": f"{{d}}: no such directory ({create} creates {an} there)",
        tmp_path / "file": "{d} is not a directory",
        tmp_path / "empty": f"{{d}} is not a k7 {want} (it holds no {meta}; {create} creates "
                            "one)",
        tmp_path / "q": f"{{d}} is a k7 queue, not {an} (`k7 info {{d}}` reads it)",
        other: f"{{d}} is a k7 {other_kind}, not {an} (`k7 topics {reader} {{d}}` reads it)",
    }
    before = tree(tmp_path)
    for d, message in cases.items():
        expected = "Error: " + message.format(d=d)
        assert failed(run(*args(d))) == expected, d
    assert tree(tmp_path) == before  # nothing was created


def test_the_console_script_exit_statuses(topic: Path, tmp_path: Path) -> None:
    r = k7("topics", "send", topic, "--key", "k", "v")
    assert r.returncode == 0 and r.stdout.decode().split()[1] == "96", r
    r = k7("topics", "info", tmp_path / "missing")
    assert r.returncode == 3 and b"no such directory" in r.stderr and b"Traceback" not in \
        r.stderr
    r = k7("topics", "create", topic, "--partitions", "2")
    assert r.returncode == 3 and b"Error: TopicError: topic" in r.stderr
    r = k7("topics", "tail", topic, "--partition", "9")
    assert r.returncode == 2 and b"partition 9 is out of range" in r.stderr
