"""Exchanges end to end: bindings stored in the exchange's directory (every process routes
the same), routing before the write, topics and queues as destinations."""

from __future__ import annotations

from pathlib import Path

import pytest

import k7core
from k7core import ClosedError
from k7core.topics import (
    Binding,
    Exchange,
    InvalidBindingError,
    InvalidRecordError,
    Topic,
    TopicError,
)
from tests._queuehelp import run_python

SEG = 1 << 20


def queue_values(path: Path) -> list[bytes]:
    with k7core.Queue(path, readonly=True) as q:
        if q.end == 0:
            return []
        b = q.read_columnar(0)
        return [bytes(b.payload(i)) for i in range(len(b))]


def make_queues(tmp_path: Path, *names: str) -> dict[str, Path]:
    out = {}
    for n in names:
        out[n] = tmp_path / n
        k7core.Queue(out[n], segment_size=SEG).close()
    return out


def test_topic_exchange_routes_the_rabbitmq_tutorial_into_queues(tmp_path: Path) -> None:
    qs = make_queues(tmp_path, "Q1", "Q2")
    with Exchange(tmp_path / "x", "topic") as x:
        x.bind(qs["Q1"], "*.orange.*")
        x.bind(qs["Q2"], "*.*.rabbit")
        x.bind(qs["Q2"], "lazy.#")
        keys = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox",
                "lazy.brown.fox", "lazy.pink.rabbit", "quick.brown.fox", "orange",
                "quick.orange.new.rabbit", "lazy.orange.new.rabbit"]
        for k in keys:
            x.publish(k, k)
    assert queue_values(qs["Q1"]) == [b"quick.orange.rabbit", b"lazy.orange.elephant",
                                      b"quick.orange.fox"]
    assert queue_values(qs["Q2"]) == [b"quick.orange.rabbit", b"lazy.orange.elephant",
                                      b"lazy.brown.fox", b"lazy.pink.rabbit",
                                      b"lazy.orange.new.rabbit"]


def test_bindings_are_shared_by_every_process(tmp_path: Path) -> None:
    qs = make_queues(tmp_path, "eu", "us")
    xpath = tmp_path / "x"
    with Exchange(xpath, "direct") as x:
        x.bind(qs["eu"], "eu")
        assert [d.destination for d in x.publish(b"1", "us")] == []
        # another process binds "us" and publishes through the same exchange
        run_python(
            "import sys; from k7core.topics import Exchange\n"
            "with Exchange(sys.argv[1]) as x:\n"
            "    x.bind(sys.argv[2], 'us')\n"
            "    assert len(x.publish(b'2', 'us')) == 1\n",
            str(xpath), str(qs["us"]),
        )
        # this process routes by the new binding at its next publish
        assert [d.destination for d in x.publish(b"3", "us")] == [str(qs["us"].resolve())]
        assert len(x.bindings()) == 2
        assert x.unbind(x.bindings()[0])
        assert not x.unbind(Binding(str(qs["eu"].resolve()), "eu"))
        assert x.publish(b"4", "eu") == []
    assert queue_values(qs["us"]) == [b"2", b"3"]
    assert queue_values(qs["eu"]) == []
    with Exchange(xpath) as again:  # reopened: the stored bindings
        assert again.kind == "direct"
        assert [b.routing_key for b in again.bindings()] == ["us"]


def test_fanout_into_topics_keeps_key_headers_and_timestamp(tmp_path: Path) -> None:
    with Topic(tmp_path / "a", partitions=3, segment_size=SEG) as ta, \
            Topic(tmp_path / "b", partitions=5, segment_size=SEG) as tb, \
            Exchange(tmp_path / "x", "fanout") as x:
        x.bind(ta.path)
        x.bind(tb.path, "ignored")
        x.bind(ta.path)  # bound twice: stored once
        assert len(x.bindings()) == 2
        ds = x.publish(b"v", "any", key="order-7", headers={"h": "1"}, timestamp=1234)
        assert [(d.destination, d.partition) for d in ds] == [
            (str(ta.path.resolve()), ta.partition_for("order-7")),
            (str(tb.path.resolve()), tb.partition_for("order-7")),
        ]
        for t, d in ((ta, ds[0]), (tb, ds[1])):
            assert d.partition is not None
            t.partition(d.partition).wait(d.offset, 10.0)  # published by the flusher
            r = t.read(d.partition, d.offset, 1)[0]
            assert (r.key, r.value, r.headers, r.timestamp) == (
                b"order-7", b"v", (("h", b"1"),), 1234)


def test_headers_exchange_with_titanmq_conditions_and_predicates(tmp_path: Path) -> None:
    qs = make_queues(tmp_path, "eu_orders", "any_eu", "big")
    with Exchange(tmp_path / "x", "headers") as x:
        x.bind(qs["eu_orders"], headers="region=eu,type=order")
        x.bind(qs["any_eu"], headers={"region": "eu", "type": "refund"}, x_match="any")
        x.bind_predicate(qs["big"], lambda h: int(h.get("amount", b"0")) > 100)
        x.publish(b"1", headers={"region": "eu", "type": "order", "amount": "5"})
        x.publish(b"2", headers={"region": "us", "type": "refund", "amount": "500"})
        x.publish(b"3", headers=[("region", b"us"), ("type", b"order")])
        assert x.route(headers={"region": "eu"}) == [str(qs["any_eu"].resolve())]
        with pytest.raises(ValueError):
            x.publish(b"4", headers={"amount": "not a number"})  # the predicate's error
    assert queue_values(qs["eu_orders"]) == [b"1"]
    assert queue_values(qs["any_eu"]) == [b"1", b"2"]
    assert queue_values(qs["big"]) == [b"2"]
    # predicates are not stored: another Exchange object does not have them
    with Exchange(tmp_path / "x") as x2:
        assert x2.route(headers={"amount": "500"}) == []


def test_bad_input_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    qs = make_queues(tmp_path, "q")
    with pytest.raises(TopicError, match="not an exchange"):
        Exchange(tmp_path / "none")
    with pytest.raises(InvalidBindingError, match="kind"):
        Exchange(tmp_path / "y", "round-robin")
    with Exchange(tmp_path / "x", "topic") as x:
        with pytest.raises(InvalidBindingError, match="does not exist"):
            x.bind(tmp_path / "missing", "a.b")
        with pytest.raises(InvalidBindingError):
            x.bind(qs["q"], "a" * 300)
        with pytest.raises(InvalidRecordError):
            x.publish(b"v", "k" * 300)
        with pytest.raises(TypeError):
            x.bind_predicate(qs["q"], "not callable")  # type: ignore[arg-type]
        assert x.bindings() == ()
    with pytest.raises(TopicError, match="of kind 'topic'"):
        Exchange(tmp_path / "x", "direct")
    (tmp_path / "x" / "k7py-exchange.json").write_text("{")
    with pytest.raises(TopicError, match="not a valid exchange file"):
        Exchange(tmp_path / "x")
    x = Exchange(tmp_path / "y2", "fanout")
    x.close()
    x.close()
    with pytest.raises(ClosedError):
        x.publish(b"v")


def test_destinations_keep_their_segment_size_and_partitions_are_refused(
    tmp_path: Path,
) -> None:
    k7core.Queue(tmp_path / "small", segment_size=4096).close()
    Topic(tmp_path / "t", partitions=2, segment_size=8192).close()
    with Exchange(tmp_path / "x", "fanout") as x:
        x.bind(tmp_path / "small")
        x.bind(tmp_path / "t")
        with pytest.raises(InvalidBindingError, match="a partition of topic"):
            x.bind(tmp_path / "t" / "partition-0")
        x.publish(b"v", key="k")
    sizes = {f.stat().st_size for f in (tmp_path / "small").glob("seg-*.k7")}
    assert sizes == {4096}
    sizes = {f.stat().st_size for f in (tmp_path / "t").glob("partition-*/seg-*.k7")}
    assert sizes == {8192}


def test_header_order_makes_no_other_binding(tmp_path: Path) -> None:
    qs = make_queues(tmp_path, "q")
    with Exchange(tmp_path / "x", "headers") as x:
        b1 = x.bind(qs["q"], headers={"a": "1", "b": "2"})
        b2 = x.bind(qs["q"], headers={"b": "2", "a": "1"})
        assert b1 == b2 and len(x.bindings()) == 1
        assert x.unbind(Binding(str(qs["q"].resolve()), headers=(("b", "2"), ("a", "1"))))
        assert x.bindings() == ()


def test_a_kind_mismatch_names_both_kinds(tmp_path: Path) -> None:
    Exchange(tmp_path / "x", "topic").close()
    with pytest.raises(TopicError, match="of kind 'topic', not 'direct'"):
        Exchange(tmp_path / "x", "direct")
