"""Discovery (broker.peers.discovery) on the group harness: a member that comes back on another
peer port, which the others' settings do not name, tells them where it is and they dial it
there.  (Joining by a seed, over TLS too, and what a seed tells a stranger, with real
processes: tests/integration/test_discovery.py.)"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from broker.peers.discovery import ANNOUNCE
from client.protocol.frames import PublishMessage
from ha.membership import RemoteState
from tests.harness.group import Group, Member
from tests.harness.replication import active, key_of, with_settings

pytestmark = pytest.mark.asyncio

QUEUE = "found"
PARTITIONS = 3


def _linked(g: Group) -> bool:
    """Every member counts every other Up."""
    for m in g.alive():
        peers = m.node.ha.peers if m.node is not None else None
        if peers is None or any(peers.membership.state(o.name) is not RemoteState.UP
                                for o in g.alive() if o is not m):
            return False
    return True


async def _publish(g: Group, m: Member, bodies: list[bytes]) -> None:
    """``bodies`` published at ``m`` (each its own key), 50 at a time, confirmed."""
    for i in range(0, len(bodies), 50):
        out = g.publish(m, QUEUE, None, [PublishMessage(b.decode(), {}, b) for b in bodies[i:i + 50]])
        await g.until(out.done, 10.0, what=f"the confirm of a batch at {m.name}")
        assert out.result().stored == len(bodies[i:i + 50])


def _stored(g: Group) -> Counter[bytes]:
    """What the actives of the queue's partitions store."""
    out: Counter[bytes] = Counter()
    for p in range(PARTITIONS):
        key = key_of(g, QUEUE, p)
        a = active(g, key)
        assert a is not None, f"no one active for partition {p}"
        out.update(s.body for s in a.disk.parts[key].messages.values())
    return out


async def test_a_member_that_moved_is_found_where_it_says_it_is(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """n3 comes back on another peer port, which n1 and n2, whose settings name the old one, do
    not know; n3 sorts last, so it dials neither.  With no link from them for ANNOUNCE
    seconds, it tells each where it is (a discovery link: its PeerHello says its peer port);
    nothing answers at the old port, so they dial it at the new one and keep it.  The group is
    whole again and every message is there, once.  Without n3's word they dial the old port for
    ever."""
    caplog.set_level(logging.WARNING, logger="tandem.ha")
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare(QUEUE, partitions=PARTITIONS)
        await g.until(lambda: all(active(g, key_of(g, QUEUE, p)) is not None for p in range(PARTITIONS)), 10.0,
                      what="an active for each partition")
        n1, n3 = g["n1"], g["n3"]
        bodies = [f"m{i}".encode() for i in range(300)]
        await _publish(g, n1, bodies[:150])
        await g.stop("n3")
        old = n3.config.peer_port
        assert old is not None
        new = old + 50
        with_settings(g, "n3", peer_port=new)
        await g.restart("n3")
        started = g.clock.monotonic()
        await g.until(lambda: _linked(g), 3 * ANNOUNCE, what="n1 and n2 linked to n3 at its new port")
        assert g.clock.monotonic() - started >= ANNOUNCE  # (n3 waited for a link from them first)
        print(f"n1 and n2 linked to n3 at its new port {g.clock.monotonic() - started:.2f} virtual s after it started")
        for name in ("n1", "n2"):
            peers = g[name].node.ha.peers  # type: ignore[union-attr]
            assert peers is not None
            assert peers.addresses["n3"] == ("127.0.0.1", new), (name, peers.addresses)
            assert peers.dialing.moved["n3"] == (("127.0.0.1", old), ("127.0.0.1", new)), (name, peers.dialing.moved)
        said = f"peer n3 moved: nothing answered at 127.0.0.1:{old}, and it said it is at 127.0.0.1:{new}"
        assert sum(said in r.getMessage() for r in caplog.records) == 2, [r.getMessage() for r in caplog.records]
        await g.until(lambda: all(active(g, key_of(g, QUEUE, p)) is not None for p in range(PARTITIONS)), 10.0,
                      what="an active for each partition")
        await _publish(g, n3, bodies[150:])
        await g.until(lambda: sum(_stored(g).values()) >= len(bodies), 10.0, what="every message stored")
        assert _stored(g) == Counter(bodies)
