"""Replication group membership over real peer links: Up, Down, quorum, refusals."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.cluster import free_ports
from broker.config import build_config
from broker.node.node import Node
from client.protocol.frames import StatusOk
from client.testing import FakeClock
from ha.membership import QuorumState, RemoteState
from ha.replica import Role
from tests.conftest import url_of
from tests.helpers import group_secret_file, tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

NAMES = ("n1", "n2", "n3")




def group_configs(tmp_path: Path, names: tuple[str, ...] = NAMES, **extra: object) -> dict[str, dict]:
    ports = dict(zip(names, free_ports(len(names))))
    return {
        n: {"name": n, "data_dir": tmp_path / n, "port": 0, "peer_port": ports[n],
            "peers": [f"{o}=127.0.0.1:{ports[o]}" for o in names if o != n],
            "keepalive_interval": 0.1, "non_response_timeout": 0.6,
            "cluster_secret_file": group_secret_file(tmp_path), **extra}
        for n in names
    }


@pytest_asyncio.fixture
async def trio(tmp_path: Path) -> AsyncIterator[dict[str, Node]]:
    cfgs = group_configs(tmp_path)
    nodes = {n: Node(build_config(c)) for n, c in cfgs.items()}
    for node in nodes.values():
        await node.start()
    try:
        yield nodes
    finally:
        for node in nodes.values():
            await node.stop()


def state(node: Node, other: str) -> RemoteState:
    assert node.ha.peers is not None
    return node.ha.peers.membership.state(other)


def quorum(node: Node) -> QuorumState:
    assert node.ha.peers is not None
    return node.ha.peers.membership.quorum_state


async def test_members_come_up_and_report_each_other(trio: dict[str, Node]) -> None:
    await wait_until(lambda: all(quorum(n) is QuorumState.ACTIVE for n in trio.values()), what="quorum Active")
    async with await client.connect_link(url_of(trio["n1"])) as conn:
        st = await conn.status()
    assert st.node == "n1" and st.quorum_state == "Active"
    assert {(r.name, r.state) for r in st.remotes} == {("n2", "Up"), ("n3", "Up")}
    assert all(r.store_stamp for r in st.remotes)


async def test_a_stopped_member_goes_down_and_quorum_goes_partial(trio: dict[str, Node]) -> None:
    await wait_until(lambda: all(quorum(n) is QuorumState.ACTIVE for n in trio.values()), what="quorum Active")
    await trio["n3"].stop()
    await wait_until(lambda: state(trio["n1"], "n3") is RemoteState.DOWN and state(trio["n2"], "n3")
                     is RemoteState.DOWN, what="n3 Down")
    assert quorum(trio["n1"]) is QuorumState.PARTIAL and quorum(trio["n2"]) is QuorumState.PARTIAL
    await trio["n2"].stop()
    await wait_until(lambda: quorum(trio["n1"]) is QuorumState.DISABLED, what="n1 without quorum")


async def test_a_consumer_starts_without_waiting_for_a_member_that_refuses_connections(trio: dict[str, Node]) -> None:
    """A durable consumer waits (up to 5 s) for its subscription on every member, but not for
    one that refused the connection: on a clock that never moves, its start still returns, and
    every message comes from the live members."""
    await wait_until(lambda: all(quorum(n) is QuorumState.ACTIVE for n in trio.values()), what="quorum Active")
    async with await client.connect(url_of(trio["n1"])) as setup:
        await setup.declare_queue("q", partitions=3)
        await trio["n3"].stop()
        await setup.producer("q").send_many([(b"m%d" % i, f"k{i}") for i in range(30)])  # once n3's partitions moved
    clock = FakeClock()  # never advanced: the 5 s wait never ends by itself
    async with await client.connect(url_of(trio["n1"]), clock=clock) as conn:
        c = conn.consumer("q")
        await asyncio.wait_for(c.start(), 30)
        assert clock.monotonic() == 0.0
        got = []
        for _ in range(30):
            m = await asyncio.wait_for(c.__anext__(), 30)
            got.append(m.body)
            await m.ack()
        assert sorted(got) == sorted(b"m%d" % i for i in range(30))


async def test_a_frozen_member_goes_down_by_keepalive_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A peer that stops answering (its frames stop coming) is Down after non_response_timeout,
    even while its TCP connection stays open; then the link is dropped (logged), so that the
    dialer dials again rather than wait on a connection whose packets may be lost."""
    caplog.set_level(logging.INFO, logger="tandem.ha")
    cfgs = group_configs(tmp_path, ("n1", "n2"))
    n1, n2 = Node(build_config(cfgs["n1"])), Node(build_config(cfgs["n2"]))
    await n1.start()
    await n2.start()
    try:
        await wait_until(lambda: state(n1, "n2") is RemoteState.UP, what="n2 Up")
        peer_task, replication_task = n2._loops.task("tandem-peers"), n2._loops.task("tandem-replication")
        assert peer_task is not None
        peer_task.cancel()  # n2 stops sending keep-alives; its links stay open
        assert replication_task is not None
        replication_task.cancel()  # ... and replication heartbeats
        assert n2.ha.replication is not None
        n2.ha.replication._broken = True  # ... and answers to n1's appends: n2 says nothing at all
        await wait_until(lambda: state(n1, "n2") is RemoteState.DOWN, what="n2 Down by silence")
        assert n1.ha.peers is not None
        await wait_until(lambda: "n2" not in n1.ha.peers.links, what="the link to the silent n2 dropped")
        assert "peer link to n2 dropped: no response for" in caplog.text
    finally:
        await n2.stop()
        await n1.stop()


async def test_a_copied_data_dir_is_refused_as_duplicate_timestamp(tmp_path: Path) -> None:
    cfgs = group_configs(tmp_path)
    n1 = Node(build_config(cfgs["n1"]))
    await n1.start()
    await n1.stop()
    shutil.copytree(tmp_path / "n1", tmp_path / "n2")  # n2 starts from a copy of n1's store
    nodes = [Node(build_config(cfgs[n])) for n in ("n1", "n2")]
    for n in nodes:
        await n.start()
    try:
        await wait_until(lambda: state(nodes[0], "n2") is RemoteState.DUPLICATE_TIMESTAMP
                         or state(nodes[1], "n1") is RemoteState.DUPLICATE_TIMESTAMP,
                         what="the copy to be refused")
    finally:
        for n in nodes:
            await n.stop()


async def test_a_member_with_other_placement_settings_is_refused_by_name(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """n3 says replicas = 1 and zones where n1 and n2 say 2 and none: it would place every
    partition on other nodes than they do, so neither links with it, each naming the difference;
    n1 and n2 link with each other."""
    cfgs = group_configs(tmp_path)
    cfgs["n3"] = {**cfgs["n3"], "replicas": 1, "sync_replicas": 1, "zones": ["n1=a", "n2=b", "n3=c"]}
    nodes = {n: Node(build_config(c)) for n, c in cfgs.items()}
    for node in nodes.values():
        await node.start()
    try:
        await wait_until(lambda: state(nodes["n1"], "n3") is RemoteState.MISMATCHED_SETTINGS
                         and state(nodes["n2"], "n3") is RemoteState.MISMATCHED_SETTINGS
                         and state(nodes["n3"], "n1") is RemoteState.MISMATCHED_SETTINGS,
                         what="n3 refused for its settings")
        await wait_until(lambda: state(nodes["n1"], "n2") is RemoteState.UP, what="n1 and n2 linked")
        assert "n3" not in nodes["n1"].ha.peers.links  # type: ignore[union-attr]
        assert quorum(nodes["n1"]) is QuorumState.PARTIAL and quorum(nodes["n3"]) is QuorumState.DISABLED
        assert "replicas 1 on n3, 2 on n1" in caplog.text and "zones n1:a,n2:b,n3:c on n3, (none) on n1" in caplog.text
    finally:
        for node in nodes.values():
            await node.stop()


async def test_a_store_starts_under_other_settings_only_where_no_partition_could_lose_a_message(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The store keeps the placement settings its queues were placed under.  Restarted under
    others (no copy is moved), a node starts where every partition's new voters include
    enough of its old ones (zones that reorder the lists; two of the three members), and
    refuses, naming the partitions, where a majority of new voters could lack a confirmed
    message (a fourth member that holds nothing)."""
    cfgs = group_configs(tmp_path)
    nodes = {n: Node(build_config(c)) for n, c in cfgs.items()}
    for node in nodes.values():
        await node.start()
    try:
        async with await client.connect(url_of(nodes["n1"])) as conn:
            await conn.declare_queue("placed", partitions=3)
        await wait_until(lambda: all("placed" in n.catalogue.queues for n in nodes.values()), what="the queue everywhere")
    finally:
        for node in nodes.values():
            await node.stop()
    from broker.config import ConfigError

    four = {**cfgs["n1"], "peers": [*cfgs["n1"]["peers"], "n4=127.0.0.1:1"]}
    with pytest.raises(ConfigError, match=r"cannot start: its store's queues were placed under other group settings "
                                          r"\(members n1,n2,n3,n4 now, n1,n2,n3 then\), and under these 2 "
                                          r"partition\(s\) would be on voters .* placed/1: n2,n3,n1 -> n2,n3,n4"):
        await Node(build_config(four)).start()
    for safe in ({**cfgs["n1"], "zones": ["n1=a", "n2=b", "n3=a"]}, {**cfgs["n1"], "peers": cfgs["n1"]["peers"][:1]},
                 cfgs["n1"]):
        again = Node(build_config(safe))
        await again.start()
        await again.stop()
    assert caplog.text.count("placement settings changed since the last start") == 3


async def test_group_settings_are_validated(tmp_path: Path) -> None:
    from broker.config import ConfigError

    with pytest.raises(ConfigError, match="peers"):
        build_config({"peers": ["n2=127.0.0.1"], "peer_port": 1})
    with pytest.raises(ConfigError, match="peer_port"):
        build_config({"peers": ["n2=127.0.0.1:7791"]})
    with pytest.raises(ConfigError, match="quorum policy"):
        build_config({"peer_port": 7781, "quorum_policy": "most"})
    with pytest.raises(ConfigError, match="priority"):
        build_config({"priority": 5})
    group = {"name": "n1", "peer_port": 7781, "peers": ["n2=127.0.0.1:7782", "n3=127.0.0.1:7783"]}
    assert build_config({**group, "zones": "n1=a,n2=b,n3=a"}).zone_map() == {"n1": "a", "n2": "b", "n3": "a"}
    with pytest.raises(ConfigError, match="no zone for n3"):
        build_config({**group, "zones": ["n1=a", "n2=b"]})
    with pytest.raises(ConfigError, match="not a member: n4"):
        build_config({**group, "zones": ["n1=a", "n2=b", "n3=c", "n4=c"]})
    with pytest.raises(ConfigError, match="'n2' is not name=zone"):
        build_config({**group, "zones": ["n1=a", "n2", "n3=c"]})
    with pytest.raises(ConfigError, match="n1 is named twice"):
        build_config({**group, "zones": ["n1=a", "n1=b", "n2=b", "n3=c"]})
    with pytest.raises(ConfigError, match="only in a replicated group"):
        build_config({"zones": ["n1=a"]})
    with pytest.raises(ConfigError, match="expected a list"):
        build_config({**group, "zones": 3})


async def test_a_node_without_quorum_refuses_clients_until_it_is_back(trio: dict[str, Node]) -> None:
    from client.errors import UnavailableError

    await wait_until(lambda: all(quorum(n) is QuorumState.ACTIVE for n in trio.values()), what="quorum Active")
    async with await client.connect_link(url_of(trio["n1"])) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send(b"before")
        c = await conn.group_consumer("q").start()  # the partition's active may change: every member
        m = await c.next(10)
        assert m is not None
        await m.nack()  # back to the queue
        again = await c.next(10)
        assert again is not None and again.redelivered  # held: revoked when n1 loses quorum
        await trio["n2"].stop()
        await trio["n3"].stop()
        await wait_until(lambda: quorum(trio["n1"]) is QuorumState.DISABLED, what="n1 without quorum")
        rep = trio["n1"].ha.replication
        assert rep is not None
        # its link closed, n2's loss counts at once; n1 stays the partition's active until it has
        # heard from no voter for an election timeout (check-quorum), and then revokes the delivery
        await wait_until(lambda: all(p.replica.role is not Role.LEADER for p in rep.logs.values()),
                         what="n1 no longer active for anything")
        with pytest.raises(UnavailableError, match="no quorum .* cannot publish"):
            await conn.producer("q").send(b"during")
        with pytest.raises(UnavailableError):
            await conn.declare_queue("other")
        st = await conn.status()  # looking is still allowed
        assert st.quorum_state == "Disabled"
        back = Node(trio["n2"].config)
        await back.start()
        try:
            await wait_until(lambda: quorum(trio["n1"]) is QuorumState.PARTIAL, what="quorum back")
            await conn.producer("q").send(b"after")
            seen = set()
            while seen != {b"before", b"after"}:  # "before" redelivered by the active, and "after"
                m = await c.next(30)
                assert m is not None, f"dispatch did not resume: {seen}"
                seen.add(m.body)
                assert m.body != b"during"  # refused, not stored
        finally:
            await back.stop()


async def test_quorum_override_restores_service_from_one_survivor(trio: dict[str, Node]) -> None:
    from client.errors import InvalidArgumentError, UnavailableError

    await wait_until(lambda: all(quorum(n) is QuorumState.ACTIVE for n in trio.values()), what="quorum Active")
    await trio["n2"].stop()
    await trio["n3"].stop()
    await wait_until(lambda: quorum(trio["n1"]) is QuorumState.DISABLED, what="n1 without quorum")
    async with await client.connect_link(url_of(trio["n1"])) as conn:
        with pytest.raises(UnavailableError):
            await conn.declare_queue("q")
        st = await conn.set_quorum_override(1)
        assert (st.quorum_state, st.quorum_override) == ("Partial", 1)
        await conn.declare_queue("q")
        await conn.producer("q").send(b"served by the survivor")
        with pytest.raises(InvalidArgumentError, match="quorum_override must be 1..3"):
            await conn.set_quorum_override(4)
        st = await conn.set_quorum_override(None)
        assert (st.quorum_state, st.quorum_override) == ("Disabled", None)


async def test_quorum_override_needs_a_group(url: str) -> None:
    from client.errors import InvalidArgumentError

    async with await client.connect_link(url) as conn:
        with pytest.raises(InvalidArgumentError, match="not in a replication group"):
            await conn.set_quorum_override(1)


async def test_admin_cli_sets_and_clears_the_override(trio: dict[str, Node]) -> None:

    rc, out, err = await tandem("admin", "set-quorum-override", "2", "--url", url_of(trio["n1"]))
    assert rc == 0 and "at least 2 node(s) up" in out, err
    rc, out, _ = await tandem("admin", "set-quorum-override", "none", "--url", url_of(trio["n1"]), "--json")
    assert rc == 0 and '"quorum_override": null' in out
    rc, _, err = await tandem("admin", "set-quorum-override", "zero", "--url", url_of(trio["n1"]))
    assert rc == 2 and "expected a number" in err


async def test_partition_state_notifiers_follow_actives_and_quorum(trio: dict[str, Node]) -> None:
    from ha.partition import PartitionChanged

    n1 = trio["n1"]
    assert n1.ha.replication is not None
    seen: list[PartitionChanged] = []
    n1.ha.replication.add_partition_notifier(seen.append)
    assert any(c.queue == "(catalogue)" for c in seen)  # called at once for what exists
    await wait_until(lambda: quorum(n1) is QuorumState.ACTIVE, what="n1 sees its peers up")
    async with await client.connect_link(url_of(n1)) as conn:
        await conn.declare_queue("watched", partitions=2)
    await wait_until(lambda: {c.partition for c in seen if c.queue == "watched" and c.new_state.value == "Active"}
                     == {0, 1}, what="both partitions Active")
    await trio["n2"].stop()
    await trio["n3"].stop()
    # each partition goes Unavailable: its active lost, or this node without quorum, whichever
    # n1 notices first (the replica's own check or the membership's keep-alives)
    await wait_until(lambda: {c.partition for c in seen if c.queue == "watched" and c.new_state.value
                              == "Unavailable" and c.old_state.value == "Active"} == {0, 1},
                     what="both partitions Unavailable")
    assert all(c.reason in ("no active known", "this node has no quorum") for c in seen
               if c.queue == "watched" and c.new_state.value == "Unavailable" and c.old_state.value == "Active")
    await wait_until(lambda: quorum(n1) is QuorumState.DISABLED, what="n1 without quorum")
    st = await _status(n1)
    assert st.quorum_state == "Disabled"
    assert {p.state for p in st.partitions if p.queue == "watched"} == {"Unavailable"}


async def _status(node: Node) -> StatusOk:
    async with await client.connect_link(url_of(node)) as conn:
        return await conn.status()
