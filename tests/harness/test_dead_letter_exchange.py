"""Dead-lettering through an exchange in a group (broker.messaging.deadletter), on the in-process
harness: refused below feature level 8; a fanout dead-letter exchange puts every rejected
message once into each bound queue, whose partitions are active on other members than the
rejected message's (settled where it was once both stored it), and nothing stays behind."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from client.protocol.frames import (Bind, Declare, DeclareExchange, DeclareOk, Error, Get, GetOk, Ok, PublishMessage,
                                    Reject)
from tests.harness.group import Group
from tests.harness.sessions import ClientSession
from tests.harness.test_exchanges import drain, ok
from tests.harness.test_limits import finalize
from tests.harness.test_relay import actives, publish_all, queue_spread

pytestmark = pytest.mark.asyncio


async def test_a_fanout_dead_letter_exchange_puts_each_rejected_message_once_in_every_queue(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        s = ClientSession(g, g["n2"])
        await finalize(g, g["n1"], 7)
        refused = await s.ask(Declare(rid=1, queue="work", partitions=3, dead_letter_exchange="dlx"))
        assert isinstance(refused, Error) and \
            "a dead_letter_exchange needs the group at feature level 8 (it is at 7)" in refused.message, refused
        await finalize(g, g["n1"], 8)
        await ok(s, DeclareExchange(rid=2, exchange="dlx", type="fanout"))
        for q in ("copies", "audit"):
            await queue_spread(g, q, partitions=3)
            await ok(s, Bind(rid=3, source="dlx", destination=q))
        declared = await s.ask(Declare(rid=4, queue="work", partitions=3, dead_letter_exchange="dlx"))
        assert isinstance(declared, DeclareOk), declared
        await g.until(lambda: all(actives(g, "work")), 30.0, what="work's partitions active")
        bodies = [f"m{i}".encode() for i in range(60)]
        await publish_all(g, g["n3"], "work", bodies)
        taker = ClientSession(g, g["n1"])
        tags = []
        for rid in range(10, 100):
            got = await taker.ask(Get(rid=rid, queue="work"))
            assert isinstance(got, GetOk), got
            if got.message is None:
                break
            tags.append(got.message.tag)
        assert len(tags) == 60
        assert isinstance(await taker.ask(Reject(rid=200, tags=tags)), Ok)
        for q in ("copies", "audit"):
            assert await drain(g, g["n2"], q, 60) == Counter(bodies), q
        await g.until(lambda: all(m.node is not None and m.node.catalogue.queues["work"].depth == 0
                                  for m in g.alive()), 10.0, what="every dead letter settled in work")
