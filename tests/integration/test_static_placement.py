"""``static`` distribution: a queue declared with one node list per partition, with real node
processes.  Its partitions are where the lists say (sync and async replicas as given); a
re-spread of the group (``tandem group add``) leaves them there; a member that leaves the
group is replaced in them by another; refusals say what is wrong, and a single node has no
lists to give."""

from __future__ import annotations

import base64
from pathlib import Path

import aiohttp
import pytest

import client
from broker.tools.cluster import LocalCluster
from client.errors import InvalidArgumentError
from tests.conftest import running_group
from tests.helpers import tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

FIXED, SPREAD = "fixed", "spread"


async def copies(cl: LocalCluster, queue: str) -> dict[int, dict[str, str]]:
    """partition -> {node: kind} of its copies, as its active reports them, and whether
    every one of them says the partition is static."""
    out: dict[int, dict[str, str]] = {}
    for name, proc in cl.nodes.items():
        if proc.proc is None or proc.proc.returncode is not None:
            continue
        for p in (await cl.status(name)).partitions:
            if p.queue == queue and p.role == "active":
                out[p.partition] = {name: "sync", **{r.node: r.kind for r in p.replicas}}
    return out


async def statics(cl: LocalCluster, queue: str) -> set[bool]:
    out = set()
    for name, proc in cl.nodes.items():
        if proc.proc is not None and proc.proc.returncode is None:
            out |= {p.static for p in (await cl.status(name)).partitions if p.queue == queue}
    return out


async def test_a_static_queue_stays_where_its_lists_put_it_through_a_group_change(tmp_path: Path) -> None:
    async with running_group(tmp_path, "--replicas", "1", "--sync-replicas", "1", console=True) as cl:
        url = cl.url_of("node1")
        async with await client.connect(url) as conn:
            await conn.declare_queue(FIXED, partitions=2, placement=[["node3", "node1:async"], ["node2", "node3"]])
            await conn.declare_queue(SPREAD, partitions=3)
            # the same lists again (kinds left out): the queue as it is; other lists: refused
            info = await conn.declare_queue(FIXED, partitions=2, placement="node3,node1;node2,node3")
            assert info.name == FIXED
        want = {0: {"node3": "sync", "node1": "async"}, 1: {"node2": "sync", "node3": "sync"}}

        async def placed() -> bool:
            return await copies(cl, FIXED) == want

        await wait_until(placed, timeout=30, what="the static queue's partitions active on their first nodes")
        assert await statics(cl, FIXED) == {True} and await statics(cl, SPREAD) == {False}
        rc, out, err = await tandem("status", "--url", url)
        assert rc == 0, err
        table = out.split("partitions (as node1 sees them):")[1].split("partitions held elsewhere")[0]
        rows = [line.split() for line in table.splitlines() if line.strip() and "QUEUE" not in line]
        assert rows[0][-1] == "-" and {r[0]: r[-1] for r in rows[1:]} == {FIXED: "static", SPREAD: "dynamic"}, out

        cases = [
            ("node1,node2;node2,node3", "placement: have node3:sync,node1:async;node2:sync,node3:sync, asked "
                                        "node1,node2;node2,node3"),  # (of FIXED, declared above)
            ("node1,node2", "placement: 1 node list(s) for 2 partition(s): give one per partition, separated by ';' "
                            "(node1,node2;node2,node1)"),
            ("node1,node9;node2", "placement: partition 0: no member node9 (members: node1, node2, node3)"),
            ("node1:async,node2;node2", "placement: partition 0: the first node, node1, is the active: it cannot be "
                                        "async"),
            ("node1,node1;node2", "placement: partition 0: a node appears twice in node1,node1"),
            ("node1:fast;node2", "placement: partition 0: 'node1:fast': a node's kind is sync or async (name:sync, "
                                 "name:async)"),
            ("node1;", "placement: partition 1 has no nodes"),
        ]
        # the CLI passes the lists as they are: one refusal through it, the others through the SDK
        (text, want_err), *others = cases
        rc, _out, err = await tandem("queues", "declare", FIXED, "--partitions", "2", "--placement", text,
                                     "--url", url)
        assert rc != 0 and want_err in err, (text, err)
        async with await client.connect(url) as conn:
            for text, want_err in others:
                with pytest.raises(InvalidArgumentError) as refused:
                    await conn.declare_queue("other", partitions=2, placement=text)
                assert want_err in str(refused.value), (text, refused.value)
        base = cl.console_url("node2") + "api/v1/queues"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.post(base, json={"name": "other", "partitions": 1, "placement": 7}) as r:
                assert r.status == 400 and (await r.json())["message"].startswith("placement: "), await r.text()
            async with s.post(base, json={"name": "other", "partitions": 1, "placement": [["node4"]]}) as r:
                assert r.status == 400 and "no member node4" in (await r.json())["message"], await r.text()
            async with s.post(base, json={"name": "viaapi", "partitions": 1, "placement": [["node2", "node1"]]}) as r:
                assert r.status == 201, await r.text()
        async with await client.connect(url) as conn:
            assert "other" not in {q.name for q in await conn.list_queues()}
            await conn.producer(FIXED).send_many([(f"m{i}".encode(), f"k{i}") for i in range(200)])

        # a fourth member: the dynamic queue re-spreads onto it, the static one stays put
        spec = cl.new_member("node4")
        rc, _out, err = await tandem("group", "add", spec, "--url", cl.url_of("node2"))
        assert rc == 0, err
        await cl.nodes["node4"].start(60)
        await wait_until(lambda: _settled(cl, 4), timeout=120, what="node4 added, partitions re-spread")
        assert await copies(cl, FIXED) == want
        assert any("node4" in c for c in (await copies(cl, SPREAD)).values())

        # node3 leaves: in each static list another member takes its place and kind
        rc, _out, err = await tandem("group", "remove", "node3", "--wait", "--timeout", "120", "--url", url)
        assert rc == 0, err
        await cl.nodes["node3"].stop()  # (a member removed refuses every connection, its status too)
        await wait_until(lambda: _settled(cl, 3), timeout=60, what="node3 removed")
        assert await copies(cl, FIXED) == {0: {"node2": "sync", "node1": "async"},
                                           1: {"node2": "sync", "node1": "sync"}}
        assert await statics(cl, FIXED) == {True}
        async with await client.connect(url) as conn:
            got = set()
            async with conn.consumer(FIXED, prefetch=64) as consumer:
                while len(got) < 200:
                    m = await consumer.next(10)
                    assert m is not None, f"consumed {len(got)} of 200"
                    got.add(m.body)
                    m.ack()
        assert got == {f"m{i}".encode() for i in range(200)}


async def _settled(cl: LocalCluster, members: int) -> bool:
    for name, proc in cl.nodes.items():
        if proc.proc is None or proc.proc.returncode is not None:
            continue
        st = await cl.status(name)
        if len(st.members) != members or st.group_change or st.moving:
            return False
    return True


async def test_a_single_node_has_no_lists_to_give(link: client.Connection) -> None:
    with pytest.raises(InvalidArgumentError, match="placement: explicit node lists need a replication group"):
        await link.declare_queue("q", partitions=1, placement=[["node1"]])
    assert await link.list_queues() == []
