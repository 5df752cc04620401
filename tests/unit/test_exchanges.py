"""The routing table (broker.messaging.exchanges): AMQP 0-9-1's direct, fanout, topic and headers
rules, exchange-to-exchange bindings, alternate exchanges, and the cache kept honest by changes."""

from __future__ import annotations

import random

import pytest

from broker.messaging.exchanges import ExchangeTable, check_exchange, headers_match
from client.errors import InvalidArgumentError
from storage.topology import BindingRecord, ExchangeRecord


def table(*exchanges: tuple[str, str], alternate: dict[str, str] | None = None) -> ExchangeTable:
    t = ExchangeTable()
    for name, kind in exchanges:
        t.put_exchange(ExchangeRecord(name=name, type=kind, alternate=(alternate or {}).get(name)))
    return t


def bind(t: ExchangeTable, source: str, dest: str, key: str = "", *, x: bool = False, **args: str) -> BindingRecord:
    b = BindingRecord(source=source, destination=dest, to_exchange=x, routing_key=key,
                      arguments=tuple(sorted(args.items())))
    t.bind(b)
    return b


def route(t: ExchangeTable, ex: str, key: str = "", headers: dict[str, str] | None = None) -> set[str]:
    return set(t.route(ex, key, headers or {}, lambda _q: True))


def topic_matches(pattern: str, key: str) -> bool:
    """The plain definition, word by word, for the trie to agree with."""
    p, k = pattern.split("."), key.split(".")

    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(m(i + 1, jj) for jj in range(j, len(k) + 1))
        return j < len(k) and (p[i] == "*" or p[i] == k[j]) and m(i + 1, j + 1)

    return m(0, 0)


@pytest.mark.parametrize("pattern,key,want", [
    ("stock.*", "stock.nyse", True), ("stock.*", "stock.nyse.ibm", False), ("stock.#", "stock", True),
    ("stock.#", "stock.nyse.ibm", True), ("#", "", True), ("#", "a.b", True), ("*", "", True),
    ("*.*", "a", False), ("#.ibm", "ibm", True), ("#.ibm", "stock.nyse.ibm", True), ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True), ("a.#.b", "a.x.y.c", False), ("a.*.#", "a", False), ("#.#", "a", True),
])
def test_topic_patterns(pattern: str, key: str, want: bool) -> None:
    t = table(("t", "topic"))
    bind(t, "t", "q", pattern)
    assert route(t, "t", key) == ({"q"} if want else set())
    assert topic_matches(pattern, key) is want


def test_the_trie_agrees_with_the_definition_on_random_patterns() -> None:
    rnd = random.Random(7)
    words = ["a", "b", "c", "*", "#"]
    t = table(("t", "topic"))
    patterns = {".".join(rnd.choice(words) for _ in range(rnd.randint(1, 4))) for _ in range(300)}
    for p in patterns:
        bind(t, "t", f"q-{p}", p)
    for _ in range(500):
        key = ".".join(rnd.choice("abc") for _ in range(rnd.randint(1, 5)))
        assert route(t, "t", key) == {f"q-{p}" for p in patterns if topic_matches(p, key)}, key


def test_direct_fanout_and_the_default_exchange() -> None:
    t = table(("d", "direct"), ("f", "fanout"))
    bind(t, "d", "q1", "a")
    bind(t, "d", "q2", "b")
    bind(t, "f", "q1", "ignored")
    bind(t, "f", "q3")
    assert route(t, "d", "a") == {"q1"} and route(t, "d", "c") == set()
    assert route(t, "f", "anything") == {"q1", "q3"}
    assert t.route("", "q9", {}, lambda q: q == "q9") == ("q9",)
    assert t.route("", "q8", {}, lambda q: q == "q9") == ()


def test_headers_all_and_any() -> None:
    t = table(("h", "headers"))
    bind(t, "h", "all", **{"x-match": "all", "format": "pdf", "type": "report"})
    bind(t, "h", "any", **{"x-match": "any", "format": "pdf", "type": "report"})
    bind(t, "h", "every")  # all of nothing: every message
    assert route(t, "h", headers={"format": "pdf", "type": "report"}) == {"all", "any", "every"}
    assert route(t, "h", headers={"format": "pdf"}) == {"any", "every"}
    assert route(t, "h", headers={"format": "zip"}) == {"every"}
    assert not headers_match((("x-match", "any"),), {"a": "b"})  # any of nothing: none


def test_exchange_to_exchange_reaches_each_queue_once_and_cycles_end() -> None:
    t = table(("a", "fanout"), ("b", "topic"), ("c", "fanout"))
    bind(t, "a", "b", x=True)
    bind(t, "a", "q1")
    bind(t, "b", "q1", "#")
    bind(t, "b", "c", "k.*", x=True)
    bind(t, "c", "a", x=True)  # a cycle
    bind(t, "c", "q2")
    assert sorted(t.route("a", "k.x", {}, lambda _q: True)) == ["q1", "q2"]  # (each once)
    assert route(t, "a", "other") == {"q1"}


def test_the_alternate_exchange_takes_what_nothing_else_does() -> None:
    t = table(("main", "direct"), ("alt", "fanout"), alternate={"main": "alt"})
    bind(t, "main", "q", "k")
    bind(t, "alt", "unrouted")
    assert route(t, "main", "k") == {"q"}
    assert route(t, "main", "other") == {"unrouted"}


def test_a_change_clears_what_was_cached() -> None:
    t = table(("d", "direct"))
    assert route(t, "d", "k") == set()
    b = bind(t, "d", "q", "k")
    assert route(t, "d", "k") == {"q"}
    t.unbind(b)
    assert route(t, "d", "k") == set()
    bind(t, "d", "q", "k")
    assert t.drop_exchange("d") == [b]
    assert route(t, "d", "k") == set()


def test_bad_exchanges_are_refused_in_words() -> None:
    for rec, words in [(ExchangeRecord(name="amq.x", type="direct"), "reserved"),
                       (ExchangeRecord(name="x", type="nope"), "one of direct, fanout, topic, headers"),
                       (ExchangeRecord(name="x y", type="direct"), "1-255 characters"),
                       (ExchangeRecord(name="x", type="direct", alternate="x"), "its own alternate")]:
        with pytest.raises(InvalidArgumentError, match=words):
            check_exchange(rec)
