"""The exchanges' routing core (k7core.topics._routing): RabbitMQ's tables for the four
AMQP kinds, TitanMQ's header conditions and predicate bindings, validation, the bindings'
JSON form, and the topic trie against a naive recursive matcher on random patterns."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k7core._errors import K7Error
from k7core.topics._routing import (
    TOPIC_CACHE_SIZE,
    Binding,
    ExchangeKind,
    InvalidBindingError,
    InvalidRecordError,
    Router,
    parse_header_condition,
)


def topic(*bindings: tuple[str, str]) -> Router:
    return Router("topic", [Binding(dest, key) for dest, key in bindings])


# --- topic: RabbitMQ tutorial 5 ("Topics"), its table exactly ----------------------------

TUTORIAL5 = topic(("Q1", "*.orange.*"), ("Q2", "*.*.rabbit"), ("Q2", "lazy.#"))


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("quick.orange.rabbit", ["Q1", "Q2"]),
        ("lazy.orange.elephant", ["Q1", "Q2"]),
        ("quick.orange.fox", ["Q1"]),
        ("lazy.brown.fox", ["Q2"]),
        ("lazy.pink.rabbit", ["Q2"]),  # matches both of Q2's bindings: delivered once
        ("quick.brown.fox", []),
        ("orange", []),
        ("quick.orange.new.rabbit", []),
        ("lazy.orange.new.rabbit", ["Q2"]),
    ],
)
def test_tutorial5_topics(key: str, expected: list[str]) -> None:
    assert TUTORIAL5.route(key) == expected


# RabbitMQ splits "" into no words and anything else at every "." (empty words count).
@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("#", ["", "a", "a.b", "a.b.c", ".", "a..b"], []),
        ("#.#", ["", "a", "a.b.c"], []),
        ("a.#", ["a", "a.b", "a.b.c", "a."], ["", "b", "b.a", "ab"]),
        ("#.a", ["a", "x.a", "x.y.a", ".a"], ["", "a.x", "xa", "a."]),
        ("a.#.b", ["a.b", "a.x.b", "a.x.y.b", "a..b"], ["a", "b", "a.b.c", "x.a.b", "ab"]),
        ("*", ["a", "*", "#"], ["", "a.b", ".", "a."]),
        ("*.*", [".", "a.b", "a."], ["", "a", "a.b.c"]),
        ("a.*.b", ["a..b", "a.x.b"], ["a.b", "a.x.y.b"]),
        ("", [""], ["a", "."]),
        ("a*", ["a*"], ["a", "ab"]),  # wildcards are whole words only
        ("#a", ["#a"], ["a", "x.a"]),
        ("*.#", ["a", "a.b", "."], [""]),
        ("#.*", ["a", "a.b"], [""]),
        ("a.#.#.b", ["a.b", "a.x.y.b"], ["a"]),
    ],
)
def test_topic_edge_cases(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    router = topic(("D", pattern))
    for key in matching:
        assert router.route(key) == ["D"], (pattern, key)
    for key in not_matching:
        assert router.route(key) == [], (pattern, key)


def test_topic_destinations_in_binding_order_once() -> None:
    router = topic(("B", "a.*"), ("A", "#"), ("B", "*.b"), ("C", "x.#"), ("A", "a.b"))
    assert router.route("a.b") == ["B", "A"]
    assert router.route("x.y") == ["A", "C"]
    assert router.route("") == ["A"]


def test_topic_no_backtracking_blowup() -> None:
    # Exponential for a backtracking matcher (re takes seconds here); the trie's state set
    # keeps it linear in words x nodes.
    router = topic(("D", "#.*.#.*.#.*.#.*.#.*.#.*.#.b"), ("E", "#.*.#.*.#.a"))
    assert router.route(".".join(["a"] * 120)) == ["E"]


# --- direct: RabbitMQ tutorial 4 ("Routing") ----------------------------------------------

def test_tutorial4_direct() -> None:
    router = Router(
        ExchangeKind.DIRECT,
        [Binding("Q1", "orange"), Binding("Q2", "black"), Binding("Q2", "green")],
    )
    assert router.route("orange") == ["Q1"]
    assert router.route("black") == ["Q2"]
    assert router.route("green") == ["Q2"]
    assert router.route("red") == []  # bound nowhere: delivered nowhere


def test_direct_multiple_bindings() -> None:
    router = Router("direct", [Binding("Q1", "black"), Binding("Q2", "black"),
                               Binding("Q1", "black"), Binding("Q3", "")])
    assert router.route("black") == ["Q1", "Q2"]
    assert router.route("") == ["Q3"]
    assert router.route("*") == []  # no wildcards in a direct exchange
    first = router.route("black")
    first.append("mutated")
    assert router.route("black") == ["Q1", "Q2"]  # each call returns its own list


# --- fanout --------------------------------------------------------------------------------

def test_fanout_ignores_the_key() -> None:
    router = Router("fanout", [Binding("A", "ignored"), Binding("B"), Binding("A", "x")])
    for key in ("", "anything", "ignored", "a.b.c"):
        assert router.route(key, {"h": "v"}) == ["A", "B"]
    assert Router("fanout", []).route("x") == []


# --- headers: RabbitMQ's x-match semantics --------------------------------------------------

PDF_REPORT = (("format", "pdf"), ("type", "report"))


@pytest.mark.parametrize(
    ("x_match", "headers", "expected"),
    [
        ("all", {"format": "pdf", "type": "report"}, True),
        ("all", {"format": "pdf", "type": "report", "extra": "1"}, True),
        ("all", {"format": "pdf"}, False),
        ("all", {"format": "pdf", "type": "log"}, False),
        ("all", {}, False),
        ("any", {"format": "pdf"}, True),
        ("any", {"type": "report", "format": "zip"}, True),
        ("any", {"format": "zip", "type": "log"}, False),
        ("any", {}, False),
        ("all", {"format": b"pdf", "type": b"report"}, True),  # bytes compare as UTF-8
        ("all", {"format": b"pdf", "type": b"\xffreport"}, False),
        ("all", {"Format": "pdf", "type": "report"}, False),  # names are case-sensitive
    ],
)
def test_headers_all_any(x_match: str, headers: dict[str, str | bytes], expected: bool) -> None:
    router = Router("headers", [Binding("Q", "ignored-key", PDF_REPORT, x_match)])
    assert router.route("any-key", headers) == (["Q"] if expected else [])


X_PAIRS = (("region", "eu"), ("x-tenant", "acme"))


@pytest.mark.parametrize(
    ("x_match", "headers", "expected"),
    [
        # "all"/"any" ignore the binding's x- pairs ...
        ("all", {"region": "eu"}, True),
        ("all", {"region": "eu", "x-tenant": "other"}, True),
        ("any", {"x-tenant": "acme"}, False),
        ("any", {"region": "eu"}, True),
        # ... the "-with-x" modes test them.
        ("all-with-x", {"region": "eu"}, False),
        ("all-with-x", {"region": "eu", "x-tenant": "other"}, False),
        ("all-with-x", {"region": "eu", "x-tenant": "acme"}, True),
        ("any-with-x", {"x-tenant": "acme"}, True),
        ("any-with-x", {"region": "us", "x-tenant": "other"}, False),
        ("any-with-x", {"region": "eu"}, True),
    ],
)
def test_headers_with_x(x_match: str, headers: dict[str, str], expected: bool) -> None:
    router = Router("headers", [Binding("Q", headers=X_PAIRS, x_match=x_match)])
    assert router.route("", headers) == (["Q"] if expected else [])


def test_headers_empty_binding() -> None:
    # RabbitMQ: no pairs left to test matches every record under "all", none under "any".
    router = Router("headers", [
        Binding("ALL"), Binding("ANY", x_match="any"),
        Binding("ALLX", headers=(("x-a", "1"),)), Binding("ANYX", headers=(("x-a", "1"),),
                                                         x_match="any"),
    ])
    assert router.route("", {"x-a": "1"}) == ["ALL", "ALLX"]
    assert router.route("", None) == ["ALL", "ALLX"]


def test_headers_pairs_repeated_name_last_wins() -> None:
    router = Router("headers", [Binding("Q", headers=(("a", "2"),))])
    assert router.route("", [("a", "1"), ("a", "2")]) == ["Q"]
    assert router.route("", [("a", "2"), ("a", "1")]) == []
    assert router.route("", (("a", b"2"),)) == ["Q"]  # the envelope's (str, bytes) pairs


def test_headers_order_and_dedup() -> None:
    router = Router("headers", [
        Binding("B", headers=(("k", "1"),)), Binding("A", headers=(("k", "1"),)),
        Binding("B", headers=(("j", "2"),), x_match="any"),
    ])
    assert router.route("", {"k": "1", "j": "2"}) == ["B", "A"]
    assert router.route("", {"j": "2"}) == ["B"]


def test_non_ascii_values_and_keys() -> None:
    router = Router("headers", [Binding("Q", headers=(("city", "Zürich"),))])
    assert router.route("", {"city": "Zürich".encode()}) == ["Q"]
    assert router.route("", {"city": "Zürich"}) == ["Q"]
    assert router.route("", {"city": "Zurich"}) == []
    assert topic(("Q", "città.*")).route("città.é") == ["Q"]


# --- TitanMQ's header condition ----------------------------------------------------------

def test_header_condition() -> None:
    pairs = parse_header_condition("region=eu,type=order")
    assert pairs == (("region", "eu"), ("type", "order"))
    router = Router("headers", [Binding("orders-eu", headers=pairs)])
    assert router.route("", {"region": "eu", "type": "order", "id": "7"}) == ["orders-eu"]
    assert router.route("", {"region": "eu", "type": "refund"}) == []
    assert router.route("", {"region": "eu"}) == []
    assert parse_header_condition("expr=a=b") == (("expr", "a=b"),)
    assert parse_header_condition("flag=") == (("flag", ""),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("region", "no '='"),
        ("region=eu,type", "no '='"),
        ("region=eu,", "no '='"),
        ("=eu", "empty name"),
        ("region=eu,=x", "empty name"),
        ("a=1,a=2", "twice"),
        ("region=eu, type=order", "spaces"),
        ("x-match=any", "x_match"),
    ],
)
def test_header_condition_errors(text: str, says: str) -> None:
    with pytest.raises(InvalidBindingError, match=says):
        parse_header_condition(text)


# --- predicate bindings (TitanMQ's content-based exchange) --------------------------------

def test_predicates_after_bindings_once() -> None:
    seen: list[Mapping[str, bytes]] = []

    def big(headers: Mapping[str, bytes]) -> bool:
        seen.append(headers)
        return int(headers.get("size", b"0")) > 100

    router = Router("direct", [Binding("A", "k"), Binding("B", "k")],
                    predicates=[("big", big), ("A", lambda h: True), ("never", lambda h: False)])
    assert router.route("k", {"size": "500"}) == ["A", "B", "big"]
    assert router.route("k", [("size", b"5")]) == ["A", "B"]
    assert router.route("other", None) == ["A"]
    assert len(seen) == 3  # called for every record
    assert dict(seen[0]) == {"size": b"500"}  # str values as UTF-8 bytes
    with pytest.raises(TypeError):
        seen[0]["size"] = b"1"  # type: ignore[index]  # read-only


def test_predicate_raising_propagates() -> None:
    def broken(headers: Mapping[str, bytes]) -> bool:
        raise RuntimeError("bad predicate")

    router = Router("fanout", [Binding("A")], predicates=[("B", broken)])
    with pytest.raises(RuntimeError, match="bad predicate"):
        router.route("k")


def test_predicates_only() -> None:
    router = Router("headers", [], predicates=[("eu", lambda h: h.get("region") == b"eu")])
    assert router.route("", {"region": "eu"}) == ["eu"]
    assert router.route("", {"region": "us"}) == []


# --- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"destination": ""}, "destination"),
        ({"destination": 5}, "destination"),
        ({"destination": "d", "routing_key": 5}, "must be a str"),
        ({"destination": "d", "routing_key": "a" * 256}, "256 bytes"),
        ({"destination": "d", "routing_key": "é" * 128}, "256 bytes"),
        ({"destination": "d", "routing_key": "\ud800"}, "surrogate"),
        ({"destination": "d", "x_match": "ALL"}, "x_match"),
        ({"destination": "d", "headers": "a=b"}, "pairs"),
        ({"destination": "d", "headers": (("a",),)}, "pair"),
        ({"destination": "d", "headers": (("a", 1),)}, "int value"),
        ({"destination": "d", "headers": (("a", b"v"),)}, "bytes value"),
        ({"destination": "d", "headers": (("", "v"),)}, "empty"),
        ({"destination": "d", "headers": ((3, "v"),)}, "must be a str"),
        ({"destination": "d", "headers": (("x-match", "any"),)}, "x_match"),
        ({"destination": "d", "headers": (("a", "1"), ("a", "2"))}, "twice"),
        ({"destination": "d", "headers": (("a", "\udc80"),)}, "surrogate"),
        ({"destination": "d", "headers": (("n" * 256, "v"),)}, "256 bytes"),
    ],
)
def test_binding_errors(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidBindingError, match=says) as info:
        Binding(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, K7Error)
    assert isinstance(info.value, ValueError)


def test_binding_limits_and_normalisation() -> None:
    Binding("d", "a" * 255)
    Binding("d", "é" * 127)  # 254 bytes
    b = Binding("d", headers=[["a", "1"]])  # type: ignore[arg-type]
    assert b.headers == (("a", "1"),)
    assert hash(b) == hash(Binding("d", headers=(("a", "1"),)))


@pytest.mark.parametrize("kind", list(ExchangeKind))
@pytest.mark.parametrize(
    ("key", "says"),
    [(None, "must be a str"), (b"a", "must be a str"), ("k" * 256, "256 bytes"),
     ("é" * 128, "256 bytes"), ("\ud800", "surrogate")],
)
def test_route_key_errors(kind: ExchangeKind, key: object, says: str) -> None:
    router = Router(kind, [Binding("d")])
    with pytest.raises(InvalidRecordError, match=says):
        router.route(key)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(ExchangeKind))
@pytest.mark.parametrize(
    ("headers", "says"),
    [("a=b", "mapping"), (5, "mapping"), ({"a": 1}, "int value"), ({1: "a"}, "name"),
     ([("a",)], "pair"), ({"a": "\udc80"}, "surrogate")],
)
def test_route_header_errors(kind: ExchangeKind, headers: object, says: str) -> None:
    router = Router(kind, [Binding("d")])
    with pytest.raises(InvalidRecordError, match=says):
        router.route("k", headers)  # type: ignore[arg-type]


def test_route_key_limits() -> None:
    router = topic(("d", "#"))
    assert router.route("k" * 255) == ["d"]
    assert router.route("é" * 127) == ["d"]


def test_router_errors() -> None:
    with pytest.raises(InvalidBindingError, match="kind"):
        Router("x-consistent-hash", [])
    with pytest.raises(InvalidBindingError, match="Binding"):
        Router("direct", [{"destination": "d"}])  # type: ignore[list-item]
    with pytest.raises(InvalidBindingError, match="predicate"):
        Router("direct", [], predicates=[("d", "not callable")])  # type: ignore[list-item]
    with pytest.raises(InvalidBindingError, match="predicate"):
        Router("direct", [], predicates=[("", lambda h: True)])


def test_kind_is_a_str_enum() -> None:
    assert ExchangeKind("topic") is ExchangeKind.TOPIC
    assert isinstance(ExchangeKind.HEADERS, str)
    assert str(ExchangeKind.HEADERS) == "headers"
    assert [k.value for k in ExchangeKind] == ["direct", "topic", "fanout", "headers"]
    assert Router("fanout", []).kind is ExchangeKind.FANOUT


# --- JSON ---------------------------------------------------------------------------------

def test_json_form() -> None:
    b = Binding("/data/orders", "order.*", (("region", "eu"),), "any")
    assert b.to_json() == {"destination": "/data/orders", "routing_key": "order.*",
                           "headers": [["region", "eu"]], "x_match": "any"}
    assert Binding.from_json({"destination": "q"}) == Binding("q")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "JSON object"),
        ({}, "no 'destination'"),
        ({"destination": "q", "routingkey": "a"}, "unknown fields"),
        ({"destination": None}, "destination"),
        ({"destination": "q", "routing_key": None}, "must be a str"),
        ({"destination": "q", "headers": {"a": "b"}}, "pairs"),
        ({"destination": "q", "headers": [["a", "b", "c"]]}, "pair"),
        ({"destination": "q", "headers": [["a", 1]]}, "int value"),
        ({"destination": "q", "x_match": None}, "x_match"),
    ],
)
def test_from_json_errors(doc: object, says: str) -> None:
    with pytest.raises(InvalidBindingError, match=says):
        Binding.from_json(doc)


_text = st.text(st.characters(codec="utf-8"), max_size=20)
_bindings = st.builds(
    Binding,
    destination=_text.filter(bool),
    routing_key=st.text(st.characters(codec="utf-8"), max_size=60),
    headers=st.dictionaries(
        _text.filter(lambda n: n != "" and n != "x-match"), _text, max_size=4
    ).map(lambda d: tuple(d.items())),
    x_match=st.sampled_from(["all", "any", "all-with-x", "any-with-x"]),
)


@given(_bindings)
def test_json_round_trip(binding: Binding) -> None:
    doc = json.loads(json.dumps(binding.to_json()))
    assert Binding.from_json(doc) == binding


# --- the topic trie against a naive recursive matcher ---------------------------------

def reference_words(text: str) -> list[str]:
    """RabbitMQ's split: "" has no words, anything else splits at every '.'."""
    return text.split(".") if text else []


def reference_match(pattern: list[str], key: list[str]) -> bool:
    """Does the topic pattern match the key? Straight from the definition."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":  # zero words, or one word and '#' again
        return reference_match(rest, key) or (bool(key) and reference_match(pattern, key[1:]))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_match(rest, key[1:])


_key_words = st.sampled_from(["a", "b", "", "ab"])
_pattern_words = st.sampled_from(["a", "b", "", "*", "#", "a*"])
_keys = st.lists(_key_words, max_size=6).map(".".join)
_patterns = st.lists(_pattern_words, max_size=6).map(".".join)


@given(st.lists(st.tuples(st.sampled_from("PQRS"), _patterns), max_size=8),
       st.lists(_keys, min_size=1, max_size=5))
def test_topic_against_reference(bindings: list[tuple[str, str]], keys: list[str]) -> None:
    router = topic(*bindings)
    for key in keys:
        words = reference_words(key)
        expected = list(dict.fromkeys(
            dest for dest, pattern in bindings if reference_match(reference_words(pattern), words)
        ))
        assert router.route(key) == expected, (bindings, key)


def test_topic_answers_past_the_cache() -> None:
    router = topic(("even", "*.*.0"), ("any", "k.#"), ("even", "k.#.0"))
    for _ in range(2):  # the second pass reads the cache where it still holds the key
        for i in range(3000):
            expected = ["even", "any"] if i % 2 == 0 else ["any"]
            got = router.route(f"k.{i}.{i % 2}")
            assert got == expected, i
            got.append("mutated")  # each call returns its own list
            assert router.route(f"k.{i}.{i % 2}") == expected
    assert 0 < len(router._cache) <= TOPIC_CACHE_SIZE < 3000  # bounded: it starts over
