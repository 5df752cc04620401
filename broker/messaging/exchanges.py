"""Exchanges and bindings as a routing table: which queues a message published to an exchange
goes to.  Pure: no I/O; the group's copy of the table is kept by :mod:`broker.messaging.topology`.

AMQP 0-9-1's rules (RabbitMQ's):

* ``direct``: a binding whose key equals the routing key; ``fanout``: every binding;
  ``topic``: a binding whose pattern matches the routing key word by word (words split on
  ``.``; ``*`` stands for one word, ``#`` for zero or more); ``headers``: a binding whose
  arguments match the message's headers, all of them (``x-match`` ``all``, the default) or
  any one (``any``); arguments starting ``x-`` are not matched.
* a binding to an exchange routes the message through that exchange in turn; a message
  reaches each queue once, however many bindings lead there, and a cycle of bindings ends.
* what no binding takes goes to the exchange's ``alternate`` exchange (and so on down its
  chain); still nothing is *unroutable*.
* the default exchange (``""``) routes a message to the queue named by its routing key; it
  takes no bindings and cannot be declared or deleted.

A topic exchange keeps its bindings in a trie of words (RabbitMQ's layout), so 1,000
patterns cost a walk of the routing key's words, not 1,000 matches; the queues of each
(exchange, routing key) are cached until the table changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from client.errors import InvalidArgumentError
from storage.topology import EXCHANGE_TYPES, BindingRecord, ExchangeRecord

EXCHANGE_NAME = re.compile(r"^[A-Za-z0-9_.:@\-]{1,255}$")
#: the longest routing key, as AMQP's short string
MAX_ROUTING_KEY = 255
#: bindings a header exchange's binding may match on
MAX_ARGUMENTS = 64
#: routing results kept per table (cleared when full, and on every change)
CACHE_SIZE = 10_000


def check_exchange(rec: ExchangeRecord) -> None:
    """InvalidArgumentError naming the first bad field of an exchange to declare."""
    check_name(rec.name)
    if rec.name.startswith("amq."):
        raise InvalidArgumentError(f"exchange name {rec.name!r}: names starting with 'amq.' are reserved")
    if rec.type not in EXCHANGE_TYPES:
        raise InvalidArgumentError(f"exchange type {rec.type!r}: one of {', '.join(EXCHANGE_TYPES)}")
    if rec.alternate is not None:
        check_name(rec.alternate, "alternate exchange")
        if rec.alternate == rec.name:
            raise InvalidArgumentError("alternate exchange: an exchange cannot be its own alternate")


def check_name(name: str, what: str = "exchange name") -> None:
    if not EXCHANGE_NAME.match(name):
        raise InvalidArgumentError(f"{what} {name!r}: 1-255 characters from A-Z a-z 0-9 _ . : - @")


def check_binding(b: BindingRecord, source_type: str) -> None:
    """InvalidArgumentError naming what is wrong with a binding from an exchange of ``source_type``."""
    if len(b.routing_key) > MAX_ROUTING_KEY:
        raise InvalidArgumentError(f"routing key: at most {MAX_ROUTING_KEY} characters")
    if len(b.arguments) > MAX_ARGUMENTS:
        raise InvalidArgumentError(f"binding arguments: at most {MAX_ARGUMENTS}")
    match = dict(b.arguments).get("x-match")
    if match is not None and source_type == "headers" and match not in ("all", "any"):
        raise InvalidArgumentError(f"x-match {match!r}: 'all' or 'any'")
    if b.to_exchange and b.destination == b.source:
        raise InvalidArgumentError("an exchange cannot be bound to itself")


class _TopicNode:
    __slots__ = ("children", "bindings")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.bindings: set[BindingRecord] = set()


class _Topic:
    """A topic exchange's bindings as a trie of their patterns' words."""

    def __init__(self) -> None:
        self.root = _TopicNode()

    def add(self, b: BindingRecord) -> None:
        node = self.root
        for word in b.routing_key.split("."):
            node = node.children.setdefault(word, _TopicNode())
        node.bindings.add(b)

    def remove(self, b: BindingRecord) -> None:
        path = [self.root]
        words = b.routing_key.split(".")
        for word in words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        path[-1].bindings.discard(b)
        for word, (parent, node) in zip(reversed(words), reversed(list(zip(path, path[1:])))):
            if node.bindings or node.children:
                break
            del parent.children[word]

    def match(self, key: str) -> set[BindingRecord]:
        words = key.split(".")
        n = len(words)
        found: set[BindingRecord] = set()
        seen: set[tuple[int, int]] = set()
        stack = [(self.root, 0)]
        while stack:
            node, i = stack.pop()
            mark = (id(node), i)
            if mark in seen:
                continue
            seen.add(mark)
            hash_node = node.children.get("#")
            if hash_node is not None:  # '#' takes zero or more words
                stack.extend((hash_node, j) for j in range(i, n + 1))
            if i == n:
                found |= node.bindings
                continue
            child = node.children.get(words[i])
            if child is not None:
                stack.append((child, i + 1))
            star = node.children.get("*")
            if star is not None:
                stack.append((star, i + 1))
        return found


def headers_match(args: tuple[tuple[str, str], ...], headers: Mapping[str, str]) -> bool:
    """A headers exchange's binding ``args`` against a message's ``headers``."""
    any_of = False
    wanted = []
    for k, v in args:
        if k == "x-match":
            any_of = v == "any"
        elif not k.startswith("x-"):
            wanted.append((k, v))
    if any_of:
        return any(headers.get(k) == v for k, v in wanted)
    return all(headers.get(k) == v for k, v in wanted)


class ExchangeTable:
    """The exchanges and bindings a node knows, and the routing over them."""

    def __init__(self) -> None:
        self.exchanges: dict[str, ExchangeRecord] = {}
        #: source exchange -> its bindings
        self.bindings: dict[str, set[BindingRecord]] = {}
        self._topics: dict[str, _Topic] = {}
        self._cache: dict[tuple[str, str], tuple[str, ...]] = {}
        self._cacheable: dict[str, bool] = {}

    # -- changes --------------------------------------------------------------------------------

    def put_exchange(self, rec: ExchangeRecord) -> None:
        self._changed()
        self.exchanges[rec.name] = rec

    def drop_exchange(self, name: str) -> list[BindingRecord]:
        """Drop the exchange; the bindings from or to it that go with it."""
        self._changed()
        self.exchanges.pop(name, None)
        gone = list(self.bindings.get(name, ()))
        gone += [b for b in self.all_bindings() if b.to_exchange and b.destination == name and b.source != name]
        for b in gone:
            self.unbind(b)
        return gone

    def bind(self, b: BindingRecord) -> bool:
        """Add a binding; False if it was there."""
        have = self.bindings.setdefault(b.source, set())
        if b in have:
            return False
        self._changed()
        have.add(b)
        topic = self._topics.get(b.source)
        if topic is None:
            topic = self._topics[b.source] = _Topic()
        topic.add(b)
        return True

    def unbind(self, b: BindingRecord) -> bool:
        """Remove a binding; False if it was not there."""
        have = self.bindings.get(b.source)
        if not have or b not in have:
            return False
        self._changed()
        have.discard(b)
        if not have:
            del self.bindings[b.source]
        topic = self._topics.get(b.source)
        if topic is not None:
            topic.remove(b)
        return True

    def bindings_to_queue(self, queue: str) -> list[BindingRecord]:
        return [b for b in self.all_bindings() if not b.to_exchange and b.destination == queue]

    def all_bindings(self) -> list[BindingRecord]:
        return [b for have in self.bindings.values() for b in have]

    def clear(self) -> None:
        self.exchanges.clear()
        self.bindings.clear()
        self._topics.clear()
        self._changed()

    def _changed(self) -> None:
        self._cache.clear()
        self._cacheable.clear()

    # -- routing --------------------------------------------------------------------------------

    def route(self, exchange: str, key: str, headers: Mapping[str, str],
              queue_exists: Callable[[str], bool]) -> tuple[str, ...]:
        """The queues a message published to ``exchange`` with routing key ``key`` goes to, each
        once; () if unroutable.  An exchange not declared routes nowhere (the caller refuses a
        publish to one)."""
        if exchange == "":
            return (key,) if queue_exists(key) else ()
        ex = self.exchanges.get(exchange)
        cacheable = self._cacheable.get(exchange)
        if cacheable is None:
            cacheable = self._cacheable[exchange] = ex is not None and not self._has_headers_below(exchange)
        if cacheable:
            hit = self._cache.get((exchange, key))
            if hit is not None:
                return hit
        queues: dict[str, None] = {}
        seen: set[str] = set()
        name: str | None = exchange
        while name is not None and name not in seen:
            self._visit(name, key, headers, queues, seen)
            if queues:
                break
            alt = self.exchanges.get(name)
            name = alt.alternate if alt is not None else None
        out = tuple(queues)
        if cacheable:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[(exchange, key)] = out
        return out

    def _visit(self, name: str, key: str, headers: Mapping[str, str], queues: dict[str, None],
               seen: set[str]) -> None:
        if name in seen:
            return
        seen.add(name)
        ex = self.exchanges.get(name)
        if ex is None:
            return
        for b in self._matching(ex, key, headers):
            if b.to_exchange:
                self._visit(b.destination, key, headers, queues, seen)
            else:
                queues.setdefault(b.destination)

    def _matching(self, ex: ExchangeRecord, key: str, headers: Mapping[str, str]) -> Iterable[BindingRecord]:
        have = self.bindings.get(ex.name, ())
        if ex.type == "fanout":
            return sorted(have, key=_order)
        if ex.type == "direct":
            return sorted((b for b in have if b.routing_key == key), key=_order)
        if ex.type == "topic":
            topic = self._topics.get(ex.name)
            return sorted(topic.match(key), key=_order) if topic is not None else ()
        return sorted((b for b in have if headers_match(b.arguments, headers)), key=_order)

    def _has_headers_below(self, exchange: str) -> bool:
        """Whether a headers exchange can be reached from ``exchange`` (its results depend on
        the headers: not cached)."""
        seen: set[str] = set()
        todo = [exchange]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            ex = self.exchanges.get(name)
            if ex is None:
                continue
            if ex.type == "headers":
                return True
            todo.extend(b.destination for b in self.bindings.get(name, ()) if b.to_exchange)
            if ex.alternate is not None:
                todo.append(ex.alternate)
        return False


def _order(b: BindingRecord) -> tuple[str, bool, str]:
    return b.destination, b.to_exchange, b.routing_key
