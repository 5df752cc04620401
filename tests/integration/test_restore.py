"""A split brain healed, with real node processes: node3 is cut off from node1 and node2 (fault
proxies on both its peer links), the majority side goes on, and node3, forced to take writes
alone (``quorum_override 1``), confirms some too.  On the heal node3's writes are discarded
(HA-1014); their messages are kept in the quarantine queue, exactly those; ``tandem restore``
merges them back into their queue, and the queue then holds every message confirmed on either
side, once.  A second restore finds nothing to do.  The same through the console's admin API."""

from __future__ import annotations

import base64
import json
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

import client
from broker.partitions.quarantine import QUEUE as QUARANTINE
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.faults import FaultProxy
from client.errors import TandemError, UnavailableError
from client.protocol.frames import Publish, PublishMessage, PublishOk, StreamMessage, expect
from tests.conftest import FAST
from tests.helpers import drain_served, queue_held, tandem, wait_until
from tests.integration.test_replication import (_disabled, _node3_behind_proxies, actives,
                                               override_and_write, produce, q_then_node3_cut)

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

#: failback a second after the heal rather than 5 s: a restore in the group waits for it (_placed)
FAILBACK = ["--failback-after", "1"]

#: a restore's report that counts nothing
NONE: dict[str, dict[str, int]] = {"restored": {}, "already": {}, "conflicts": {}, "left": {}, "dropped": {},
                                   "merged": {}, "failed": {}, "held": {}, "resent": {}, "unsure": {}}


@dataclass
class SplitBrain:
    majority: list[bytes]
    solo: list[bytes]
    confirmed: list[bytes]
    held: list[StreamMessage]  # what the quarantine holds
    taken: int  # how many of them have an old id that names another message of q now


@asynccontextmanager
async def _split_group(tmp_path: Path, *extra: str, console: bool = False) -> AsyncIterator[tuple[LocalCluster, list[FaultProxy]]]:
    """Three nodes (consoles if asked), node3 behind proxies, quick to fail over and back (and ``extra``)."""
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password="test-password", extra_args=[*FAST, *FAILBACK, *extra],
                      console=console)
    proxies = await _node3_behind_proxies(cl)
    await cl.start()
    try:
        yield cl, proxies
    finally:
        await cl.stop()
        for p in proxies:
            await p.stop()


async def _healed_split_brain(cl: LocalCluster, proxies: list[FaultProxy]) -> SplitBrain:
    """The split brain of the module's docstring, healed: the quarantine holds node3's writes.
    (That it holds them all however much node3 wrote, past where node3 compacts its log:
    tests/harness/test_quarantine.py.)"""
    await q_then_node3_cut(cl, proxies)
    majority = [f"maj-{i}".encode() for i in range(60)]
    solo = [f"solo-{i}-".encode() for i in range(20)]
    confirmed: list[bytes] = []
    failed: list[bytes] = []
    async with await client.connect_link(cl.url_of("node3")) as iso:
        await wait_until(lambda: _disabled(iso), timeout=30, what="node3 Disabled")
        await produce(cl.url_of("node1"), "q", majority, confirmed, failed)
        assert sorted(confirmed) == sorted(majority)
        alone = await override_and_write(iso, "q", solo[0], key="solo-0")
        for i, b in enumerate(solo[1:], 1):
            await alone.send(b, key=f"solo-{i}")
        confirmed += solo
        await iso.set_quorum_override(None)
    held = await _healed(cl, proxies, len(solo))
    assert sorted(m.body for m in held) == sorted(solo), [(m.offset, m.body[:10]) for m in held]
    assert {m.headers["x-quarantine-node"] for m in held} == {"node3"}
    assert {m.headers["x-quarantine-queue"] for m in held} == {"q"}
    assert all(m.headers["x-quarantine-confirmed"] == "true" for m in held)

    # where node3 stored them, the majority side stored its own messages (a key conflict: the
    # old ids name those now) wherever its partition reached that far
    ends, _msgs = await _q(cl)
    taken = sum(int(m.headers["x-quarantine-offset"]) < ends[int(m.headers["x-quarantine-partition"])]
                for m in held)
    assert taken, ends  # (the majority wrote 60 to node3's 20 from the same offsets on)
    return SplitBrain(majority, solo, confirmed, held, taken)


async def _q(cl: LocalCluster) -> tuple[dict[int, int], list[StreamMessage]]:
    """q's end offset of each partition and its messages, read again while a member answers that
    it cannot reach a partition's active (a link dropped on a busy machine, dialled again)."""
    got: list[tuple[dict[int, int], list[StreamMessage]]] = []

    async def read() -> bool:
        try:
            async with await client.connect_link(cl.url) as link:
                got.append(({p: (await link.read("q", p, 0, 1))[2] for p in range(3)},
                            [m for p in range(3) for m in await _read_all(link, "q", p)]))
            return True
        except UnavailableError:
            return False

    await wait_until(read, timeout=30, what="q read")
    return got[-1]


async def _healed(cl: LocalCluster, proxies: list[FaultProxy], count: int) -> list[StreamMessage]:
    """The proxies healed: once node3 has discarded its writes (HA-1014), the quarantine
    holds ``count`` messages and every partition is back on its placed active, what the
    quarantine holds."""
    for p in proxies:
        p.heal()

    async def reported() -> bool:
        st = await cl.status("node3")
        return any("HA-1014" in e and "kept in the quarantine queue" in e for e in st.events)

    await wait_until(reported, timeout=30, what="HA-1014 on node3, its messages kept")
    await actives(cl, "q", 3)

    # the quarantine holds exactly what was discarded, with where it came from
    async def quarantined() -> list[StreamMessage]:
        async with await client.connect_link(cl.url) as link:
            try:
                return await _read_all(link, QUARANTINE, 0)
            except TandemError:
                return []

    async def filled() -> bool:
        # (node3 deletes its spool file once the quarantine confirmed what it published: a
        # moment after those messages can be read there)
        spooled = list((cl.nodes["node3"].data_dir / "quarantine").glob("*.msgpack"))
        return not spooled and len(await quarantined()) >= count

    await wait_until(filled, timeout=30, what="the quarantine filled and node3's spool file gone")
    await _placed(cl, "q", QUARANTINE)
    return await quarantined()


async def _placed(cl: LocalCluster, *queues: str) -> None:
    """Once every partition of ``queues`` is served by the node placement puts first, so
    that failback has nothing left to hand over: after the heal it hands partitions back to
    their placed actives (``--failback-after``, :data:`FAILBACK`), and a restore run in the group stops
    early where the quarantine's partition moves during it (``"moved"``)."""

    async def home() -> bool:
        statuses = [await cl.status(n) for n in cl.nodes]
        for queue in queues:
            # each node lists a partition's other voters in placement order: the first of
            # the list is the one every other node names first
            firsts: dict[int, Counter[str]] = {}
            for st in statuses:
                for part in st.partitions:
                    voters = [r.node for r in part.replicas if r.kind == "sync"]
                    if part.queue == queue and voters:
                        firsts.setdefault(part.partition, Counter())[voters[0]] += 1
            serving = await cl.actives(queue)
            if not firsts or any(serving.get(p) != c.most_common(1)[0][0] for p, c in firsts.items()):
                return False
        return True

    await wait_until(home, timeout=60, what=f"every partition of {', '.join(queues)} on its placed active")


async def _quarantine_active(cl: LocalCluster) -> str:
    """The member node1 names active for the quarantine's partition (waited for while it elects one)."""
    found = ""

    async def named() -> bool:
        nonlocal found
        st = await cl.status("node1")
        found = next((p.active for p in st.partitions if p.queue == QUARANTINE), "")
        return bool(found)

    await wait_until(named, timeout=30, what=f"an active for {QUARANTINE}")
    return found


async def _read_all(link: client.Connection, queue: str, partition: int) -> list[StreamMessage]:
    """Every message of the partition, a frame's worth at a time."""
    out: list[StreamMessage] = []
    offset = 0
    while True:
        msgs, offset, end = await link.read(queue, partition, offset, 1000)
        out += msgs
        if offset >= end:
            return out


async def _merged(cl: LocalCluster, sb: SplitBrain) -> None:
    """After the restore: q holds every message confirmed on either side once, each with an id
    of its own, the restored ones with their old id in x-tandem-restored-id."""
    old = {f"{m.headers['x-quarantine-partition']}-{m.headers['x-quarantine-offset']}" for m in sb.held}
    restored: list[StreamMessage] = []

    async def stored() -> bool:  # (a stream read sees what the store has: it writes a moment after the commit)
        nonlocal restored
        restored = [m for m in (await _q(cl))[1] if m.body.startswith(b"solo-")]
        return len(restored) >= len(old)

    await wait_until(stored, timeout=30, what="the restored messages in q's stores")
    assert {m.headers["x-tandem-restored-id"] for m in restored} == old
    assert all("x-tandem-id" not in m.headers for m in restored)
    consumed = await drain_served(cl.url_of("node1"), "q")
    v = classify(sb.majority + sb.solo, sb.confirmed, consumed)
    assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
    assert sorted(b for b, _ in consumed) == sorted(sb.majority + sb.solo)
    # every message has an id of its own: the restored ones where they landed, never one of
    # the majority's (a consumer that de-duplicates by id loses none of them)
    ids = {b: i for b, i in consumed}
    assert len(set(ids.values())) == len(sb.majority) + len(sb.solo), ids


async def test_what_a_heal_discards_is_quarantined_and_restored(tmp_path: Path) -> None:
    async with _split_group(tmp_path) as (cl, proxies):
        sb = await _healed_split_brain(cl, proxies)
        rc, out, err = await tandem("restore", "--json", "-v", "--url", cl.url)
        assert rc == 0, err
        assert json.loads(out) == {**NONE, "restored": {"q": len(sb.solo)}, "conflicts": {"q": sb.taken}}, out
        assert f"{QUARANTINE} holds {len(sb.solo)} message(s): done once each is looked at" in err, err
        await _merged(cl, sb)
        rc, out, err = await tandem("restore", "--url", cl.url)
        assert rc == 0 and out.strip() == f"nothing to restore: {QUARANTINE} holds no message that matches", (out,
                                                                                                               err)


async def test_the_console_restores_in_the_group_and_says_what_it_did(tmp_path: Path) -> None:
    """The same merge through the admin API (``POST /api/v1/restore``), asked of a member that
    does not serve the quarantine: the member that does runs it, the one asked reports, logs
    and keeps it in its events."""
    async with _split_group(tmp_path, console=True) as (cl, proxies):
        sb = await _healed_split_brain(cl, proxies)
        serving = await _quarantine_active(cl)
        asked = next(n for n in ("node1", "node2", "node3") if n != serving)
        url = cl.console_url(asked) + "api/v1/restore"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            for body, field in (({"partition": -1}, "partition"), ({"queue": 7}, "queue"), ({"to": "x"}, "to")):
                async with s.post(url, json=body) as r:
                    assert r.status == 400 and (await r.json())["message"].startswith(f"{field}: "), await r.text()
            async with s.post(url, json={"queue": "other"}) as r:  # the filter takes none: all stay
                assert r.status == 200, await r.text()
                assert await r.json() == {**NONE, "left": {"q": len(sb.solo)},
                                          "text": [f"{len(sb.solo)} message(s) of q left in {QUARANTINE}"]}
            async with s.post(url, json={"from": "node3"}) as r:
                assert r.status == 200, await r.text()
                report = await r.json()
            assert {k: v for k, v in report.items() if k != "text"} == {
                **NONE, "restored": {"q": len(sb.solo)}, "conflicts": {"q": sb.taken}}, report
            assert report["text"][0].startswith(f"{len(sb.solo)} message(s) restored to q; {sb.taken} of their ids"), \
                report
            events = (await cl.status(asked)).events
            assert any("restore by admin" in e and "(from node3)" in e and "restored to q" in e for e in events), events
            await _merged(cl, sb)
            async with s.post(url) as r:  # (no body: everything)
                assert r.status == 200 and (await r.json())["text"] == [
                    f"nothing to restore: {QUARANTINE} holds no message that matches"]


async def _publish(url: str, producer: str, msgs: list[tuple[int, bytes]]) -> None:
    """``msgs`` (seq, body) published under ``producer``, keyed by body, confirmed."""
    async with await client.connect_link(url) as link:
        reply = await link.request(lambda rid: Publish(rid=rid, queue="q", producer_id=producer, messages=[
            PublishMessage(b.decode(), {}, b, seq) for seq, b in msgs]))
        assert expect(reply, PublishOk).stored == len(msgs), reply


@pytest.mark.parametrize("via", ["cli", "api"])
async def test_a_producers_resend_to_the_other_side_is_not_restored_twice(tmp_path: Path, via: str) -> None:
    """A producer sends ``P`` 0..9 to node3 under its override, which confirms them; it gets
    no confirmation of 5..9 (its link is cut at the split) and sends them again, with 10..14,
    to the majority, which stores them (a durable producer resends what is unconfirmed after
    a failover).  On the heal 0..9 are quarantined.  A restore (``tandem restore``, or the
    group's through the admin API) finds 5..9 in the queue under the same producer id and
    seq: only 0..4 go back, 5..9 leave the quarantine as resent, and the queue holds each of
    the 15 once (without the look, 5..9 are there twice)."""
    async with _split_group(tmp_path, console=True) as (cl, proxies):
        await q_then_node3_cut(cl, proxies)
        bodies = [f"twice-{i}".encode() for i in range(15)]
        async with await client.connect_link(cl.url_of("node3")) as iso:
            await wait_until(lambda: _disabled(iso), timeout=30, what="node3 Disabled")
            await override_and_write(iso, "q", b"probe")
            await _publish(cl.url_of("node3"), "P", list(enumerate(bodies[:10])))
            await iso.set_quorum_override(None)
        await _publish(cl.url_of("node1"), "P", list(enumerate(bodies))[5:])
        held = await _healed(cl, proxies, 11)
        assert sorted(m.body for m in held) == sorted([b"probe", *bodies[:10]])
        if via == "cli":
            rc, out, err = await tandem("restore", "--json", "--url", cl.url)
            assert rc == 0, err
            report = json.loads(out)
        else:
            admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
            async with aiohttp.ClientSession(headers=admin) as s:
                async with s.post(cl.console_url("node1") + "api/v1/restore") as r:
                    assert r.status == 200, await r.text()
                    report = await r.json()
            assert any(t.startswith("5 message(s) of q not restored: their producer sent them again")
                       for t in report.pop("text")), report
        assert {k: v for k, v in report.items() if v} == {
            "restored": {"q": 6}, "resent": {"q": 5}, "conflicts": report["conflicts"]}, report
        everything = [b"probe", *bodies]
        consumed = await drain_served(cl.url_of("node1"), "q")
        v = classify(everything, everything, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        async with await client.connect_link(cl.url) as link:  # (the resent ones left it too)
            assert await queue_held(link, QUARANTINE) == ""


async def test_the_copies_two_nodes_of_the_losing_side_kept_are_restored_once(tmp_path: Path) -> None:
    """Five nodes cut 3/2: node4 and node5, each under ``quorum_override 2``, take writes
    together (node5 a replica of what node4 writes).  On the heal both discard them and both
    keep a copy: the quarantine holds each message twice, once from each.  A restore stores
    each once (the copies go back under the producer id of who wrote them, in which term) and
    counts the second copies as already there; the queue holds each once."""
    cl = LocalCluster(tmp_path, console=False, nodes=5, base_port=0, password="test-password",
                      # (a copy on each; five processes on a busy machine: failure detection slower than
                      # FAST, so that node4 does not count node5 down for a late keep-alive mid-test)
                      extra_args=["--keepalive-interval", "0.2", "--non-response-timeout", "2", "--replicas", "4",
                                  "--sync-replicas", "4", *FAILBACK])
    proxies = []
    for src in ("node1", "node2", "node3"):  # (the lower name dials: these six links cross the cut)
        for dst in ("node4", "node5"):
            px = await FaultProxy(("127.0.0.1", cl.peer_ports[dst])).start()
            cl.route(src, dst, px.address)
            proxies.append(px)
    await cl.start()
    try:
        await q_then_node3_cut(cl, proxies)  # (queue q, then these proxies cut: node4 and node5 off)
        majority = [f"maj-{i}".encode() for i in range(30)]
        minority = [f"min-{i}".encode() for i in range(12)]
        confirmed: list[bytes] = []
        failed: list[bytes] = []
        async with await client.connect_link(cl.url_of("node4")) as n4, \
                await client.connect_link(cl.url_of("node5")) as n5:
            for link in (n4, n5):
                await wait_until(lambda: _disabled(link), timeout=30, what="node4 and node5 Disabled")
            await n5.set_quorum_override(2)
            alone = await override_and_write(n4, "q", minority[0], key="min-0")
            await n4.set_quorum_override(2)  # (override_and_write set 1: two of them now)
            for i, b in enumerate(minority[1:], 1):
                await alone.send(b, key=f"min-{i}")
            confirmed += minority
            await produce(cl.url_of("node1"), "q", majority, confirmed, failed)
            assert not failed
            for link in (n4, n5):
                await link.set_quorum_override(None)
        for px in proxies:
            px.heal()

        async def copies() -> Counter[bytes]:
            async with await client.connect_link(cl.url_of("node1")) as link:
                try:
                    return Counter(m.body for m in await _read_all(link, QUARANTINE, 0))
                except TandemError:
                    return Counter()

        async def both_kept() -> bool:
            return await copies() == Counter(minority * 2)

        await wait_until(both_kept, timeout=60, what="the quarantine holding node4's and node5's copy of each")
        rc, out, err = await tandem("restore", "--json", "--url", cl.url_of("node1"))
        assert rc == 0, err
        report = json.loads(out)
        assert (report["restored"], report["already"]) == ({"q": len(minority)}, {"q": len(minority)}), report
        consumed = await drain_served(cl.url_of("node1"), "q")
        v = classify(majority + minority, confirmed, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
    finally:
        await cl.stop()
        for px in proxies:
            await px.stop()


HOOKS = textwrap.dedent('''
    from broker.partitions.compensation import DROP, Version

    def strict(c):
        """solo-I: I % 3 == 0 dropped, 1 merged with the queue's own message, 2 a failure"""
        i = int(c.discarded.body.split(b"-")[1])
        if i % 3 == 0:
            return DROP
        if i % 3 == 1:
            return Version(c.discarded.key, dict(c.discarded.headers), c.discarded.body + b"|" + c.kept.body)
        raise RuntimeError(f"strict: no rule for {c.discarded.body[:8]!r}")

    def lenient(c):
        return None
''')


def make_hooks(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "tandem_restore_hooks.py").write_text(HOOKS)
    info = root / "tandem_restore_hooks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-restore-hooks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tandem.compensation]\nstrict = tandem_restore_hooks:strict\n"
                                           "lenient = tandem_restore_hooks:lenient\n")
    return root


async def test_a_compensation_hook_decides_each_key_conflict_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook sees both versions of each key conflict: ``tandem restore --compensation strict``
    drops some, merges some with the queue's own message and fails on others, which stay in
    the quarantine with the rest of their partition's; the group's run (the nodes'
    ``--compensation lenient``) restores those.  In the end the queue holds the majority's
    messages, the solo ones not in conflict, the merged versions and the ones the first run
    left: each once, and nothing the hook dropped.
    A node told to use a hook that is not installed does not start."""
    monkeypatch.setenv("PYTHONPATH", str(make_hooks(tmp_path / "hooks")))  # (the nodes' and the CLI's)
    rc, _out, err = await tandem("broker", "start", "--data-dir", str(tmp_path / "nope"), "--port", "0",
                                 "--compensation", "nope")
    assert rc != 0 and "compensation: compensation hook 'nope' is not installed" in err, err
    assert "Traceback" not in err, err
    async with _split_group(tmp_path / "group", "--compensation", "lenient", console=True) as (cl, proxies):
        sb = await _healed_split_brain(cl, proxies)
        ends, msgs = await _q(cl)
        kept_at = {(m.partition, m.offset): m.body for m in msgs}
        # what the hook does, partition by partition in offset order: a failure holds back the
        # rest of its partition (they go back in order, or a later sequence number would make
        # an earlier one look like a duplicate)
        first: Counter[str] = Counter()
        merged: set[bytes] = set()
        kept: list[bytes] = []  # put back as they were (no conflict)
        dropped: list[bytes] = []
        remaining: list[StreamMessage] = []  # left in the quarantine for the second run
        by_part: dict[int, list[StreamMessage]] = {}
        for m in sb.held:
            by_part.setdefault(int(m.headers["x-quarantine-partition"]), []).append(m)
        for p, msgs in by_part.items():
            blocked = False
            for m in sorted(msgs, key=lambda m: int(m.headers["x-quarantine-offset"])):
                offset = int(m.headers["x-quarantine-offset"])
                rule = int(m.body.split(b"-")[1]) % 3
                if blocked:
                    first["held"] += 1
                    remaining.append(m)
                elif offset >= ends[p]:
                    first["restored"] += 1
                    kept.append(m.body)
                elif rule == 0:
                    first["dropped"] += 1
                    dropped.append(m.body)
                elif rule == 1:
                    first.update(["restored", "conflicts", "merged"])
                    merged.add(m.body + b"|" + kept_at[(p, offset)])
                else:
                    first["failed"] += 1
                    remaining.append(m)
                    blocked = True
        assert first["dropped"] and first["merged"] and first["failed"], first  # (each answer is exercised)

        rc, out, err = await tandem("restore", "--json", "--compensation", "strict", "--url", cl.url)
        assert rc == 0, err
        assert json.loads(out) == {**NONE, **{k: {"q": n} for k, n in first.items()}}, (out, first)
        assert err.count("the compensation hook failed (RuntimeError: strict: no rule for") == first["failed"], err

        # the group's own run: the nodes' hook keeps what the first one failed on
        serving = await _quarantine_active(cl)
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.post(cl.console_url(serving) + "api/v1/restore") as r:
                assert r.status == 200, await r.text()
                report = await r.json()
        conflicting = sum(int(m.headers["x-quarantine-offset"]) < ends[int(m.headers["x-quarantine-partition"])]
                          for m in remaining)
        assert {k: v for k, v in report.items() if k != "text"} == {
            **NONE, "restored": {"q": len(remaining)}, **({"conflicts": {"q": conflicting}} if conflicting else {})
        }, report

        assert all(b.split(b"|")[1].startswith(b"maj-") for b in merged), merged  # (the hook saw the source's)
        expected = sb.majority + kept + sorted(merged) + [m.body for m in remaining]
        consumed = await drain_served(cl.url_of("node1"), "q")
        v = classify(expected, expected, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert not {b for b, _ in consumed} & set(dropped)  # (dropped: never restored)
        async with await client.connect_link(cl.url) as link:  # the quarantine is empty: nothing left over
            assert await queue_held(link, QUARANTINE) == ""


async def test_a_weak_active_refuses_publishes_past_its_hold_and_what_it_confirmed_is_restored(
        tmp_path: Path) -> None:
    """node3, cut off and forced alone (``quorum_override 1``), may keep 1 MiB of such writes
    in its log (``--weak-hold-bytes 1M``): it confirms three messages of 256 KiB and refuses
    the fourth (retry, naming weak_hold_bytes) instead of taking it and compacting what it
    wrote alone.  node3 is restarted, still cut off, and under the override again it still
    refuses.  On the heal the quarantine holds exactly the three, and a restore leaves the
    queue with every message confirmed on either side, once.  (Without the restart, on the
    group harness: tests/harness/test_quarantine.py.)"""
    async with _split_group(tmp_path, "--weak-hold-bytes", "1M") as (cl, proxies):
        await q_then_node3_cut(cl, proxies)
        majority = [f"maj-{i}".encode() for i in range(40)]
        async with await client.connect(cl.url_of("node1")) as conn:
            p = conn.producer("q")
            for b in majority:
                await p.send(b, key="one")
        solo = [f"solo-{i}-".encode() + b"." * (256 << 10) for i in range(4)]

        async def refused(iso: client.Connection) -> str:
            with pytest.raises(UnavailableError) as e:
                await iso.producer("q").send(solo[3], key="one")
            return str(e.value)

        async with await client.connect_link(cl.url_of("node3")) as iso:
            await wait_until(lambda: _disabled(iso), timeout=30, what="node3 Disabled")
            alone = await override_and_write(iso, "q", solo[0], key="one")
            for b in solo[1:3]:
                await alone.send(b, key="one")
            assert "past weak_hold_bytes (1048576 bytes)" in await refused(iso)
        await cl.nodes["node3"].stop()
        await cl.nodes["node3"].start()
        async with await client.connect_link(cl.url_of("node3")) as iso:
            await wait_until(lambda: _disabled(iso), timeout=30, what="node3 Disabled after its restart")
            await iso.set_quorum_override(1)

            async def says_full() -> bool:  # (asked once node3 is active: a publish before that waits)
                try:
                    return (all(p.active == "node3" for p in (await iso.status()).partitions if p.queue == "q")
                            and "weak_hold_bytes" in await refused(iso))
                except (TandemError, pytest.fail.Exception):  # (another refusal, or none)
                    return False

            await wait_until(says_full, timeout=30, what="node3, active alone again, refusing past its hold")
            await iso.set_quorum_override(None)
        held = await _healed(cl, proxies, 3)
        assert sorted(m.body for m in held) == sorted(solo[:3]), [(m.offset, m.body[:10]) for m in held]
        rc, out, err = await tandem("restore", "--json", "--url", cl.url)
        assert rc == 0 and json.loads(out)["restored"] == {"q": 3}, (out, err)
        consumed = await drain_served(cl.url_of("node1"), "q")
        v = classify(majority + solo, majority + solo[:3], consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert sorted(b for b, _ in consumed) == sorted(majority + solo[:3])


async def test_a_weak_active_that_refused_past_its_hold_takes_publishes_again_once_a_peer_is_back(
        tmp_path: Path) -> None:
    """node1, alone of three (node2 and node3 stopped) under ``quorum_override 1`` with
    ``--weak-hold-bytes 1M``, confirms messages of 256 KiB until it refuses one (the fourth,
    or a little later: an active that heard from its peers within the election timeout still
    writes strong entries).  With node2 back, and nothing else written, node1 hears from a
    majority again: the refused one is taken (its entry is strong and frees the weak ones
    before it), and the queue holds each once."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password",
                      extra_args=[*FAST, "--weak-hold-bytes", "1M"])
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url_of("node1")) as conn:
            await conn.declare_queue("w", partitions=1)
        await actives(cl, "w", 1)
        for n in ("node2", "node3"):
            await cl.nodes[n].stop()
        bodies = [f"w-{i}-".encode() + b"." * (256 << 10) for i in range(12)]
        async with await client.connect_link(cl.url_of("node1")) as iso:
            await wait_until(lambda: _disabled(iso), timeout=30, what="node1 Disabled")
            await iso.set_quorum_override(1)

            async def publish(i: int) -> None:
                reply = await iso.request(lambda rid: Publish(rid=rid, queue="w", producer_id="P", messages=[
                    PublishMessage("k", {}, bodies[i], i)]))
                assert expect(reply, PublishOk).stored + expect(reply, PublishOk).duplicates == 1, reply

            async def took(i: int) -> bool:
                try:
                    await publish(i)
                    return True
                except TandemError:  # (not active yet; or past the hold)
                    return False

            await wait_until(lambda: took(0), timeout=30, what="node1 taking writes under the override")
            n = 1
            while n < len(bodies):
                try:
                    await publish(n)
                except UnavailableError as e:
                    assert "past weak_hold_bytes" in str(e), e
                    break
                n += 1
            assert 3 <= n < len(bodies), n  # (three of 256 KiB fit in 1 MiB, the fourth not)
            await cl.nodes["node2"].start()
            await wait_until(lambda: took(n), timeout=30, what="node1 taking the refused one with node2 back")
            await iso.set_quorum_override(None)
        consumed = await drain_served(cl.url_of("node1"), "w")
        v = classify(bodies, bodies[:n + 1], consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
    finally:
        await cl.stop()
