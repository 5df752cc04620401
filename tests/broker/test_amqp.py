"""The AMQP 0-9-1 front door against a node on a real socket, with the real clients: aio-pika
(asyncio) and pika (blocking, in a thread): confirms, consumers and acks, gets, properties,
exchanges, and what the node refuses."""

from __future__ import annotations

import asyncio
import ssl
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pika
import pytest
import pytest_asyncio
from aio_pika.abc import AbstractIncomingMessage

import client
from broker.config import ConfigError, NodeConfig, build_config
from broker.node.node import Node
from broker.tools.certs import make_dev_certs
from tests.conftest import PASSWORD, url_of
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def amqp_node(tmp_path: Path) -> AsyncIterator[Node]:
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0, amqp_port=0))
    await n.start()
    try:
        yield n
    finally:
        await n.stop()


def amqp_url(n: Node, password: str = PASSWORD) -> str:
    assert n._listeners.amqp_address is not None
    return f"amqp://admin:{password}@127.0.0.1:{n._listeners.amqp_address[1]}/"


async def test_aio_pika_publishes_with_confirms_and_consumes_with_acks(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("orders")
        for i in range(50):
            await ch.default_exchange.publish(
                aio_pika.Message(f"order {i}".encode(), headers={"n": i, "tags": ["a", "b"]},
                                 content_type="text/plain", correlation_id=f"c{i}", delivery_mode=2),
                routing_key="orders")
        again = await ch.declare_queue("orders", passive=True)
        assert again.declaration_result.message_count == 50
        got: list[AbstractIncomingMessage] = []
        done = asyncio.Event()

        async def on_message(m: AbstractIncomingMessage) -> None:
            got.append(m)
            await m.ack()
            if len(got) == 50:
                done.set()

        await ch.set_qos(prefetch_count=10)
        tag = await q.consume(on_message)
        await asyncio.wait_for(done.wait(), 30)
        await q.cancel(tag)
        assert [m.body for m in got] == [f"order {i}".encode() for i in range(50)]
        first = got[0]
        assert first.headers == {"n": 0, "tags": ["a", "b"]}  # (typed, as published)
        assert (first.content_type, first.correlation_id, first.delivery_mode) == ("text/plain", "c0", 2)
        assert not first.redelivered and first.routing_key == "orders"
    assert amqp_node.catalogue.queue("orders").depth == 0


async def test_a_nacked_message_comes_back_redelivered_and_a_get_takes_one(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("", exclusive=False)  # (server-named)
        assert q.name.startswith("amq.gen-")
        await ch.default_exchange.publish(aio_pika.Message(b"once"), routing_key=q.name)
        m = await q.get(timeout=10)
        assert m is not None and m.body == b"once" and not m.redelivered
        await m.nack(requeue=True)
        m = await q.get(timeout=10)
        assert m is not None and m.redelivered
        await m.ack()
        assert await q.get(fail=False) is None


async def test_exchanges_route_and_an_unroutable_mandatory_publish_is_returned(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        ex = await ch.declare_exchange("events", aio_pika.ExchangeType.TOPIC)
        q = await ch.declare_queue("eu")
        await q.bind(ex, "*.eu.#")
        await ex.publish(aio_pika.Message(b"fr"), routing_key="orders.eu.fr")
        await ex.publish(aio_pika.Message(b"us"), routing_key="orders.us", mandatory=False)  # (no queue: dropped)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ex.publish(aio_pika.Message(b"lost"), routing_key="nowhere", mandatory=True)
        m = await q.get(timeout=10)
        assert m is not None and m.body == b"fr"
        await m.ack()
        assert await q.get(fail=False) is None


async def test_what_aio_pika_and_a_tandem_client_publish_each_other_reads(amqp_node: Node) -> None:
    async with await client.connect_link(url_of(amqp_node)) as link:
        await link.declare_queue("both")
        await link.producer("both").send(b"from tandem", headers={"kind": "t"})
        async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue("both", passive=True)
            m = await q.get(timeout=10)
            assert m is not None and m.body == b"from tandem" and m.headers == {"kind": "t"}
            await m.ack()
            await ch.default_exchange.publish(aio_pika.Message(b"from amqp", headers={"kind": "a"},
                                                               content_type="text/plain"), routing_key="both")
        t = await link.get("both")
        assert t is not None and t.body == b"from amqp"
        assert t.headers["kind"] == "a" and t.headers["amqp-content-type"] == "text/plain"
        await t.ack()


async def test_pika_blocking_publishes_with_confirms_and_gets(amqp_node: Node) -> None:
    assert amqp_node._listeners.amqp_address is not None
    port = amqp_node._listeners.amqp_address[1]

    def run() -> list[bytes]:
        params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("admin", PASSWORD))
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("jobs")
            for i in range(20):
                ch.basic_publish("", "jobs", f"job {i}".encode(), pika.BasicProperties(delivery_mode=2))
            with pytest.raises(pika.exceptions.UnroutableError):
                ch.basic_publish("", "no-such-queue", b"x", mandatory=True)
            out = []
            while True:
                method, _props, body = ch.basic_get("jobs")
                if method is None:
                    return out
                out.append(body)
                ch.basic_ack(method.delivery_tag)
        finally:
            conn.close()

    got = await asyncio.to_thread(run)
    assert got == [f"job {i}".encode() for i in range(20)]


async def test_a_wrong_password_is_refused_and_a_foreign_protocol_gets_the_header(amqp_node: Node) -> None:
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(amqp_url(amqp_node, password="wrong-password"))
    assert amqp_node._listeners.amqp_address is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", amqp_node._listeners.amqp_address[1])
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer == b"AMQP\x00\x00\x09\x01"  # (what this port speaks, then closed)
    writer.close()
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:  # (the node serves on)
        ch = await conn.channel()
        await ch.declare_queue("still-here")


async def test_a_missing_queue_closes_the_channel_with_404_not_the_connection(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("absent", passive=True)
        ch2 = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await ch2.declare_queue("odd", arguments={"x-unknown-argument": 1})
        ch3 = await conn.channel()
        await ch3.declare_queue("fine")


async def test_an_amqp_port_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="amqp_port 70000"):
        build_config({"amqp_port": 70000})
    assert NodeConfig().amqp_port is None  # (off unless set)


async def test_an_exclusive_queue_ends_with_its_connection(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        name = q.name
        assert name in amqp_node.catalogue.queues

    async def gone() -> bool:
        return name not in amqp_node.catalogue.queues

    await wait_until(gone, timeout=10, what="the exclusive queue deleted")


async def test_the_disk_alarm_blocks_a_pika_connection_and_clearing_it_unblocks(amqp_node: Node) -> None:
    alarm = amqp_node.store.disk_alarm
    assert alarm is not None
    url = amqp_url(amqp_node)
    said: list[str] = []
    raised, cleared = threading.Event(), threading.Event()

    def client() -> None:
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            conn.add_on_connection_blocked_callback(lambda _c, m: said.append(m.method.reason) or raised.set())
            conn.add_on_connection_unblocked_callback(lambda _c, _m: cleared.set())
            ready.set()
            while not cleared.is_set():
                conn.process_data_events(time_limit=0.1)

    ready = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(client))
    await wait_until(ready.is_set, timeout=10, what="the client connected")
    limit, alarm.limit = alarm.limit, 1 << 60  # (every reading of the free space is below it now)
    await wait_until(raised.is_set, timeout=10, what="connection.blocked")
    assert "low on disk: disk free space" in said[0] and "disk_free_limit" in said[0], said
    alarm.limit = limit
    await wait_until(cleared.is_set, timeout=10, what="connection.unblocked")
    await work


async def test_a_global_qos_is_a_limit_the_channels_consumers_share(amqp_node: Node) -> None:
    url = amqp_url(amqp_node)

    def work() -> tuple[int, int, int]:
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            ch = conn.channel()
            ch.queue_declare("shared")
            for i in range(10):
                ch.basic_publish("", "shared", f"m{i}".encode())
            ch.basic_qos(prefetch_count=3, global_qos=True)
            got: list[int] = []
            for tag in ("a", "b"):
                ch.basic_consume("shared", lambda _c, m, _p, _b: got.append(m.delivery_tag), consumer_tag=tag)
            while len(got) < 3:
                conn.process_data_events(time_limit=0.1)
            ch.queue_declare("shared", passive=True)  # (a round trip: what the node sent before it came first)
            first = len(got)
            ch.basic_ack(got[0])
            ch.basic_ack(got[1])
            while len(got) < 5:
                conn.process_data_events(time_limit=0.1)
            ch.queue_declare("shared", passive=True)
            second = len(got)
            ch.basic_qos(prefetch_count=0, global_qos=True)  # (no limit: the rest comes)
            while len(got) < 10:
                conn.process_data_events(time_limit=0.1)
            return first, second, len(got)

    assert await asyncio.to_thread(work) == (3, 5, 10)


async def test_a_dead_letter_queue_through_the_default_exchange(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        await ch.declare_queue("dead")
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "",
                                                         "x-dead-letter-routing-key": "dead"})
        await ch.default_exchange.publish(aio_pika.Message(b"poison"), routing_key="work")
        m = await work.get(timeout=10)
        await m.reject(requeue=False)
        dead = await (await ch.get_queue("dead")).get(timeout=10)
        assert dead.body == b"poison"
        await dead.ack()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="needs x-dead-letter-routing-key"):
            await ch.declare_queue("other", arguments={"x-dead-letter-exchange": ""})


async def test_a_stream_is_read_from_its_x_stream_offset_and_keeps_what_was_read(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.set_qos(prefetch_count=2)  # (acks are flow control: two unacked at most)
        s = await ch.declare_queue("events", arguments={"x-queue-type": "stream"})
        for i in range(5):
            await ch.default_exchange.publish(aio_pika.Message(f"e{i}".encode()), routing_key="events")

        async def read(offset: object, n: int) -> list[tuple[bytes, object]]:
            got: list[tuple[bytes, object]] = []
            done = asyncio.Event()

            async def on(m: AbstractIncomingMessage) -> None:
                got.append((m.body, m.headers.get("x-stream-offset")))
                await m.ack()
                if len(got) == n:
                    done.set()

            tag = await s.consume(on, arguments={"x-stream-offset": offset})
            await asyncio.wait_for(done.wait(), 10)
            await s.cancel(tag)
            return got

        assert await read("first", 5) == [(f"e{i}".encode(), i) for i in range(5)]
        assert await read(3, 2) == [(b"e3", 3), (b"e4", 4)]
        assert await read("last", 1) == [(b"e4", 4)]
        got: list[bytes] = []

        async def keep(m: AbstractIncomingMessage) -> None:
            got.append(m.body)
            await m.ack()

        tag = await s.consume(keep, arguments={"x-stream-offset": "next"})  # (what comes after consume-ok)
        await ch.default_exchange.publish(aio_pika.Message(b"e5"), routing_key="events")
        await wait_until(lambda: bool(got), timeout=10, what="the message published after consume-ok")
        await s.cancel(tag)
        assert got == [b"e5"]

        async def ignore(_m: AbstractIncomingMessage) -> None:
            return None

        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="x-stream-offset"):
            await s.consume(ignore, arguments={"x-stream-offset": "yesterday"})
    async with await client.connect_link(url_of(amqp_node)) as link:  # (read, not consumed: all still there)
        msgs, _, _ = await link.read("events", 0, 0)
        assert [m.body for m in msgs] == [f"e{i}".encode() for i in range(6)]


async def test_a_get_after_a_publish_on_the_channel_finds_it(amqp_node: Node) -> None:
    """AMQP orders a channel's methods: a basic.get (or a declare's count) after a basic.publish
    without confirms sees the message, as with RabbitMQ (kombu's SimpleQueue relies on it)."""
    url = amqp_url(amqp_node)

    def work() -> list[bytes | None]:
        got: list[bytes | None] = []
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            ch = conn.channel()
            ch.queue_declare("at-once")
            for i in range(20):
                ch.basic_publish("", "at-once", f"m{i}".encode())
                method, _props, body = ch.basic_get("at-once", auto_ack=True)
                got.append(body if method is not None else None)
            ch.basic_publish("", "at-once", b"counted")
            assert ch.queue_declare("at-once", passive=True).method.message_count == 1
        return got

    assert await asyncio.to_thread(work) == [f"m{i}".encode() for i in range(20)]


async def test_pikas_asyncio_adapter_publishes_with_confirms_and_consumes_with_acks(amqp_node: Node) -> None:
    from pika.adapters.asyncio_connection import AsyncioConnection

    loop = asyncio.get_running_loop()
    confirmed: list[int] = []
    got: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def on_open(conn: AsyncioConnection) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        def on_confirm(frame: Any) -> None:
            confirmed.append(frame.method.delivery_tag)  # (a multiple ack counts as its last tag)
            if frame.method.delivery_tag == 50:
                ch.basic_consume("async-pika", on_message)

        def on_message(c: Any, deliver: Any, _props: Any, body: bytes) -> None:
            got.append(body)
            c.basic_ack(deliver.delivery_tag)
            if len(got) == 50 and not done.done():
                done.set_result(None)

        def declared(_frame: Any) -> None:
            for i in range(50):
                ch.basic_publish("", "async-pika", f"m{i}".encode())

        ch.confirm_delivery(on_confirm, callback=lambda _f: ch.queue_declare("async-pika", callback=declared))

    conn = AsyncioConnection(pika.URLParameters(amqp_url(amqp_node)), on_open_callback=on_open,
                             on_open_error_callback=lambda _c, e: done.set_exception(RuntimeError(str(e))),
                             custom_ioloop=loop)
    try:
        await asyncio.wait_for(done, 30)
    finally:
        conn.close()
    assert got == [f"m{i}".encode() for i in range(50)] and confirmed[-1] == 50


async def test_deleting_a_queue_cancels_its_consumers_the_deleters_after_its_delete_ok(amqp_node: Node) -> None:
    url = amqp_url(amqp_node)

    def work() -> tuple[list[str], list[str]]:
        told: dict[str, list[str]] = {"a": [], "b": []}
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            a, b = conn.channel(), conn.channel()
            a.queue_declare("doomed")
            for name, ch in (("a", a), ("b", b)):
                ch.add_on_cancel_callback(lambda frame, name=name: told[name].append(frame.method.consumer_tag))
                ch.basic_consume("doomed", lambda *_: None, consumer_tag=f"c-{name}")
            a.queue_delete("doomed")  # (returns at delete-ok: a's cancel comes after it, as from RabbitMQ)
            assert told["a"] == []
            while not told["a"] or not told["b"]:
                conn.process_data_events(time_limit=0.1)
            b.queue_declare("barrier")  # (a round trip on each: anything sent before it has come)
            a.queue_declare("barrier")
        return told["a"], told["b"]

    assert await asyncio.to_thread(work) == (["c-a"], ["c-b"])


async def test_amqps_with_plain_login_on_a_tls_node_and_plaintext_refused(tmp_path: Path) -> None:
    """With ``tls_cert`` the AMQP port speaks TLS (amqps://): PLAIN's password goes inside it; a
    client speaking plaintext to it gets no AMQP at all."""
    certs = await asyncio.to_thread(make_dev_certs, tmp_path / "certs", ["node1"])
    cert, key = certs.nodes["node1"]
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0, amqp_port=0, tls_cert=cert, tls_key=key,
                        tls_ca=certs.ca))
    await n.start()
    try:
        assert n._listeners.amqp_address is not None
        port = n._listeners.amqp_address[1]

        def work() -> bytes:
            ctx = ssl.create_default_context(cafile=str(certs.ca))
            params = pika.ConnectionParameters("localhost", port, credentials=pika.PlainCredentials("admin", PASSWORD),
                                               ssl_options=pika.SSLOptions(ctx, "localhost"))
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare("secure")
                ch.basic_publish("", "secure", b"over tls")
                method, _props, body = ch.basic_get("secure", auto_ack=True)
                assert method is not None
                return body

        assert await asyncio.to_thread(work) == b"over tls"
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            await asyncio.to_thread(pika.BlockingConnection, pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials("admin", PASSWORD), connection_attempts=1,
                socket_timeout=5, blocked_connection_timeout=5))
    finally:
        await n.stop()


async def test_a_connection_that_goes_away_ends_its_stream_readers_and_its_session(amqp_node: Node) -> None:
    """A client killed (kill -9) while its stream consumer's reader waits for an ack (its one
    unacked delivery): the session ends."""
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("ticks", arguments={"x-queue-type": "stream"})
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"t{i}".encode()), routing_key="ticks")
    script = ("import pika, sys\n"
              "c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))\n"
              "ch = c.channel(); ch.basic_qos(prefetch_count=1)\n"
              "ch.basic_consume('ticks', lambda *a: print('got', flush=True), "
              "arguments={'x-stream-offset': 'first'})\n"
              "ch.start_consuming()\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, amqp_url(amqp_node),
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"got\n"  # (one unacked: the reader waits)
        assert amqp_node.sessions
    finally:
        proc.kill()
        await proc.wait()
    await wait_until(lambda: not amqp_node.sessions, timeout=10, what="the killed client's session ended")


async def test_a_delivery_names_the_exchange_and_routing_key_it_was_published_with(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("routed")
        x = await ch.declare_exchange("news", aio_pika.ExchangeType.TOPIC)
        await q.bind(x, "news.#")
        await x.publish(aio_pika.Message(b"via topic"), routing_key="news.sport")
        await ch.default_exchange.publish(aio_pika.Message(b"direct"), routing_key="routed")
        first = await q.get(timeout=10)  # (basic.get-ok)
        assert (first.body, first.exchange, first.routing_key) == (b"via topic", "news", "news.sport")
        await first.ack()
        got: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()

        async def on(m: AbstractIncomingMessage) -> None:
            await m.ack()
            if not got.done():
                got.set_result(m)

        await q.consume(on)  # (basic.deliver)
        second = await asyncio.wait_for(got, 10)
        assert (second.body, second.exchange, second.routing_key) == (b"direct", "", "routed")
        assert "amqp-exchange" not in (second.headers or {})  # (kept as the delivery's fields, not headers)


async def test_the_type_property_goes_through_both_ways(amqp_node: Node) -> None:
    """AMQP's ``type`` (pamqp's ``message_type``) is kept as ``amqp-type``; a Tandem client's
    message with that header reaches an AMQP consumer with it as its type."""
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("typed")
        await ch.default_exchange.publish(aio_pika.Message(b"a", type="order.created"), routing_key="typed")
        m = await q.get(timeout=10)
        assert m.type == "order.created"
        await m.ack()
        async with await client.connect_link(url_of(amqp_node)) as link:
            await link.producer("typed").send(b"b", headers={"amqp-type": "order.paid"})
        m = await q.get(timeout=10)
        assert (m.body, m.type) == (b"b", "order.paid")
        await m.ack()
