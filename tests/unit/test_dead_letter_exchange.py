"""Where a dead letter goes with a dead-letter exchange (broker.messaging.deadletter), on a
table of exchanges: the routing key (the queue's, else the message's own, else its queue's
name), the headers that name where it was published, the owner's ``produce`` on the exchange,
and the cycles cut; and the declare's checks (broker.messaging.declare, broker.security.acl)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from broker.messaging.deadletter import destination
from broker.messaging.declare import validate_declare
from broker.messaging.exchanges import ExchangeTable
from broker.messaging.message import EMPTY_HEADERS, Msg
from broker.messaging.queues import Queue
from broker.security.acl import AclTable, validate_grant
from client.errors import AccessRefusedError, InvalidArgumentError
from client.protocol.frames import Declare
from storage.base import QueueMeta, UserRecord
from storage.topology import BindingRecord, ExchangeRecord


def queue(name: str, qid: int, **fields: object) -> Queue:
    return Queue(QueueMeta(id=qid, name=name, partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                           dead_letter_queue=None, max_length=0, **fields))  # type: ignore[arg-type]


class Host:
    def __init__(self, *queues: Queue) -> None:
        self.queues = {q.name: q for q in queues}
        self.table = ExchangeTable()
        for ex in (ExchangeRecord(name="dlx", type="topic"), ExchangeRecord(name="fan", type="fanout")):
            self.table.put_exchange(ex)
        for b in (BindingRecord(source="dlx", destination="dead.orders", routing_key="orders.#"),
                  BindingRecord(source="dlx", destination="dead.all", routing_key="#"),
                  BindingRecord(source="fan", destination="work")):
            self.table.bind(b)

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> tuple[str, ...]:
        return self.table.route(exchange, routing_key, headers, self.queues.__contains__)

    def has_exchange(self, name: str) -> bool:
        return name in self.table.exchanges


def msg(headers: dict[str, str] | None = None) -> Msg:
    return Msg(0, 7, "k", headers or {}, EMPTY_HEADERS, b"body", None, None, 0.0)


def allowed(_target: str) -> str | None:
    return None


def names(queues: list[Queue]) -> list[str]:
    return sorted(q.name for q in queues)


def test_the_routing_key_is_the_queues_else_the_messages_own_else_the_queue_name() -> None:
    host = Host(queue("dead.orders", 2), queue("dead.all", 3), queue("work", 4))
    keyed = queue("work", 4, dead_letter_exchange="dlx", dead_letter_routing_key="orders.late")
    to = destination(keyed, msg({"amqp-routing-key": "ignored"}), "rejected", host, allowed)
    assert names(to.queues) == ["dead.all", "dead.orders"] and to.why is None
    assert (to.headers["amqp-exchange"], to.headers["amqp-routing-key"]) == ("dlx", "orders.late")
    assert (to.headers["x-death-reason"], to.headers["x-death-queue"]) == ("rejected", "work")
    own = queue("work", 4, dead_letter_exchange="dlx")
    assert names(destination(own, msg({"amqp-routing-key": "orders.new"}), "rejected", host, allowed).queues) == \
        ["dead.all", "dead.orders"]
    assert names(destination(own, msg(), "rejected", host, allowed).queues) == ["dead.all"]  # (key "work")
    assert "x-delay" not in destination(own, msg({"x-delay": "5"}), "expired", host, allowed).headers


def test_an_expired_message_is_not_routed_back_into_its_own_queue_a_rejected_one_is() -> None:
    host = Host(queue("work", 4))
    src = queue("work", 4, dead_letter_exchange="fan")
    assert names(destination(src, msg(), "rejected", host, allowed).queues) == ["work"]
    for reason in ("expired", "maxlen", "delivery_limit"):
        to = destination(src, msg(), reason, host, allowed)
        assert to.queues == [] and to.why == "exchange fan routes it to no queue (routing key 'work')"


def test_nowhere_to_go_says_why() -> None:
    host = Host(queue("dead.all", 3))
    assert destination(queue("w", 5, dead_letter_exchange="gone"), msg(), "rejected", host, allowed).why == \
        "exchange gone missing"
    refused = destination(queue("w", 5, dead_letter_exchange="dlx"), msg(), "rejected", host,
                          lambda target: f"not permitted on {target}")
    assert refused.queues == [] and refused.why == "exchange dlx not permitted on dlx"
    assert destination(queue("w", 5), msg(), "rejected", host, allowed).why is None  # (none asked: dropped quietly)


def test_a_declare_takes_an_exchange_or_a_queue_and_the_owner_needs_produce_on_it() -> None:
    validate_declare(Declare(rid=1, queue="w", dead_letter_exchange="dlx", dead_letter_routing_key="k"))
    for bad, word in ((dict(dead_letter_exchange="dlx", dead_letter_queue="d"), "give one"),
                      (dict(dead_letter_exchange=""), "not a valid exchange name"),
                      (dict(dead_letter_routing_key="k"), "only with a dead_letter_exchange"),
                      (dict(dead_letter_exchange="dlx", dead_letter_routing_key="k" * 256), "at most 255"),
                      (dict(dead_letter_exchange="dlx", type="stream"), "not for a stream")):
        with pytest.raises(InvalidArgumentError, match=word):
            validate_declare(Declare(rid=1, queue="w", **bad))  # type: ignore[arg-type]
    acls = AclTable([validate_grant("alice", "sandbox.*", "configure,produce,consume")])
    alice = UserRecord(name="alice", salt=b"", hash=b"", role="user", params="")
    acls.check_declare(alice, "sandbox.w", None, "sandbox.dlx")
    with pytest.raises(AccessRefusedError, match="no 'produce' permission on exchange 'payments'"):
        acls.check_declare(alice, "sandbox.w", None, "payments")
    with pytest.raises(AccessRefusedError, match="reserved for the node"):
        acls.check_declare(alice, "sandbox.w", None, "tandem.x")
