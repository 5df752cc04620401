"""``tandem upgrade status`` and ``finalize`` on a group of mixed builds: two nodes of this build
and one of the pinned older commit (a first-release build, which says nothing of its build on
its links).  The finalize is refused, naming the older member, and changes nothing; this
build's tool manages the older node at its protocol version and refuses what it cannot ask of
it in one line; with every member on this build the finalize goes through."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker import __version__
from broker.tools.builds import from_ref
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK
from client.protocol.codec import FrameBuffer, encode
from client.protocol.frames import Error, Frame, PeerChallenge, PeerHello, PeerProof, PeerTypes, PeerWelcome
from client.protocol.versions import MAX_VERSION, MIN_VERSION
from broker.peers.codec.recordtypes import record_types
from ha.peerauth import Side, new_nonce, parse_secret, proof
from ha.upgrade import LEVEL_MAX
from tests.conftest import PASSWORD
from tests.helpers import read_frame, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

#: the last commit before this build's first upgrade change (broker 0.1.0, a first-release build)
PINNED = "7443ca57cd344ad588fe7c86adb2ff042aa527b3"


def _tandem(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args, "--url", url], capture_output=True, text=True,
                          timeout=60)


async def test_finalize_is_refused_while_a_member_runs_the_older_build(tmp_path: Path) -> None:
    old = from_ref(PINNED)
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    cl.nodes["node3"].build = old
    try:
        await cl.start()
        await cl.wait_members()  # (a quorum is two: node1 may not be linked to node3 yet, nor know its build)
        new_url, old_url = cl.nodes["node1"].url, cl.nodes["node3"].url

        async def knows_every_build() -> bool:  # (each member of this build: either may judge a finalize)
            for name in ("node1", "node2"):
                members = (await cl.status(name)).remotes
                if not (len(members) == 2 and all(r.state == "Up" for r in members)):
                    return False
            return True

        await wait_until(knows_every_build, timeout=30, what="node1 and node2 each linked to both other members")
        st = _tandem("upgrade", "status", "--json", url=new_url)
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        seen = {m["name"]: m for m in doc["members"]}
        assert seen["node3"]["build"] == "0.1.x" and seen["node3"]["levels"] == [1, 1]
        assert seen["node2"]["build"] == __version__ and seen["node2"]["levels"] == [1, LEVEL_MAX]
        assert doc["feature_level"] == 1 and not doc["finalizable"]
        for name in ("node1", "node2"):  # (asked of each: refused there, wherever the catalogue's active is)
            fin = _tandem("upgrade", "finalize", url=cl.nodes[name].url)
            assert fin.returncode == 2 and fin.stdout == ""
            assert fin.stderr.count("\n") == 1, fin.stderr  # one line
            assert f"cannot finalize feature level {LEVEL_MAX}" in fin.stderr and "node3 (build 0.1.x supports levels 1..1)" \
                in fin.stderr and "node1 (" not in fin.stderr and "node2 (" not in fin.stderr
        # the older node, managed by this build's tool: its status at protocol 1; no finalize there
        st3 = _tandem("upgrade", "status", "--json", url=old_url)
        assert st3.returncode == 0, st3.stderr
        doc3 = json.loads(st3.stdout)
        assert doc3["build"] == "0.1.0" and doc3["protocol"] == [1, 1] and not doc3["finalizable"]
        fin3 = _tandem("upgrade", "finalize", url=old_url)
        assert fin3.returncode == 2 and fin3.stderr.count("\n") == 1 and "Traceback" not in fin3.stderr
        assert "runs a build without feature levels" in fin3.stderr
        # the older build's tool against a node of this build: it works at protocol 1
        older_tool = subprocess.run([*old.command(), "status", "--url", new_url], env=old.env(), capture_output=True,
                                    text=True, timeout=60)
        assert older_tool.returncode == 0, older_tool.stderr
        assert f"node node1 (version {__version__}," in older_tool.stdout
        # nothing changed: the older node still serves, the group is at level 1
        assert json.loads(_tandem("upgrade", "status", "--json", url=new_url).stdout)["feature_level"] == 1
        # node3 on this build: the finalize goes through, on every member
        p = cl.nodes["node3"]
        await p.stop()
        p.build = None
        await p.start()
        await cl.wait_ready()

        async def knows_node3s_build() -> bool:  # (node1's link to the restarted node3 said its build)
            doc = json.loads(_tandem("upgrade", "status", "--json", url=new_url).stdout)
            return {m["name"]: m["build"] for m in doc["members"]}.get("node3") == __version__

        await wait_until(knows_node3s_build, timeout=30, what="node1 to know node3's new build")
        ok = _tandem("upgrade", "finalize", url=new_url)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith(f"group finalized at feature level {LEVEL_MAX}")
        for name in cl.nodes:  # (applied on the node asked when it answers; on the others as they apply the entry)
            await wait_until(lambda name=name: _level(cl, name, LEVEL_MAX), timeout=15,
                             what=f"{name} at feature level {LEVEL_MAX}")
    finally:
        await cl.stop()


async def _level(cl: LocalCluster, name: str, level: int) -> bool:
    return (await cl.status(name)).feature_level == level


async def _claim(cl: LocalCluster, at: str, name: str, *, build: str, levels: list[int], level: int,
                 types: dict[str, str] | None = None, then: list[Frame] | None = None,
                 protocol: tuple[int, int] = (MIN_VERSION, MAX_VERSION)) -> list[Frame]:
    """Dial ``at``'s peer port as member ``name`` (its group secret proved) saying it runs
    ``build`` with feature ``levels`` in a group at ``level`` (and record ``types``, if given);
    what ``at`` answers until it closes.  ``then``: frames sent once ``at`` welcomed the link and
    sent its first frame after the welcome (the link is left open for a second, then closed)."""
    assert cl.secret_file is not None
    secret = parse_secret(cl.secret_file.read_bytes())
    reader, writer = await asyncio.open_connection("127.0.0.1", cl.peer_ports[at])
    buf = FrameBuffer(1 << 20)
    nonce, stamp = new_nonce(), "claimed-stamp"
    got: list[Frame] = []
    try:
        async with SYSTEM_CLOCK.timeout(10):
            writer.write(encode(PeerHello(min_version=protocol[0], max_version=protocol[1], node=name,
                                          store_stamp=stamp, priority=1, votes=1, nonce=nonce, build=build,
                                          levels=levels, level=level, types=types or {})))
            challenge = await read_frame(reader, buf)
            assert isinstance(challenge, PeerChallenge), challenge
            writer.write(encode(PeerProof(proof=proof(secret, Side.DIALER, dialer_nonce=nonce,
                                                      acceptor_nonce=challenge.nonce, prover=name,
                                                      prover_stamp=stamp, verifier=at))))
            while (f := await read_frame(reader, buf)) is not None:
                got.append(f)
                if then is not None and len(got) >= 2 and isinstance(got[-2], PeerWelcome):
                    for g in then:
                        writer.write(encode(g))
                    break
    finally:
        writer.close()
    return got


async def test_a_node_refuses_a_group_finalized_past_its_build_and_a_member_too_old_for_its_group(
        tmp_path: Path) -> None:
    """node3 is not started: a link that proves the group secret as node3 says what a newer (or
    an older) build would, and node1 refuses it in one line saying what to do."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    del cl.nodes["node3"]
    try:
        await cl.start()
        past = LEVEL_MAX + 1
        newer = await _claim(cl, "node1", "node3", build="9.0.0", levels=[1, past], level=past)
        why = [f.message for f in newer if isinstance(f, Error)]
        assert why == [f"node3 says this group is finalized at feature level {past}, but this node's build "
                       f"{__version__} supports levels 1..{LEVEL_MAX}: start node1 on a build that supports level "
                       f"{past} (see docs/upgrades.md)"], newer
        assert not any(isinstance(f, PeerWelcome) for f in newer)
        log = (tmp_path / "node1.log").read_text()
        assert log.count(f"peer node3: link refused: node3 says this group is finalized at feature level {past}") == 1
        assert {r.name: r.state for r in (await cl.status("node1")).remotes}["node3"] == "UnsupportedProtocol"
        # a build that speaks no protocol version of this one's
        lo, hi = MAX_VERSION + 1, MAX_VERSION + 2
        newest = await _claim(cl, "node1", "node3", build="9.0.0", levels=[past, 9], level=past, protocol=(lo, hi))
        assert [f.message for f in newest if isinstance(f, Error)] == [
            f"unsupported protocol version: peer node3 speaks {lo}..{hi}, this node (node1) 1..{MAX_VERSION}; this "
            f"node (node1) is too old: upgrade it to a build that speaks version {lo} or later (see "
            f"docs/upgrades.md)"], newest
        # a build that supports the group's level is a member again (and one too old for it is not)
        ok = await _claim(cl, "node1", "node3", build=__version__, levels=[1, LEVEL_MAX], level=1)
        assert any(isinstance(f, PeerWelcome) for f in ok) and not any(isinstance(f, Error) for f in ok), ok
    finally:
        await cl.stop()


async def test_a_member_on_a_build_older_than_the_finalized_level_is_refused_its_links(tmp_path: Path) -> None:
    """A group finalized at level 2; node3's data dir wiped and node3 started on the older build
    (which opens a fresh store): the members refuse its links, naming its build and the level.
    (The older build does not log the refusal of a link it accepted: the members' logs say it.)"""
    old = from_ref(PINNED)
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    try:
        await cl.start()
        await cl.wait_ready()
        assert _tandem("upgrade", "finalize", url=cl.nodes["node1"].url).returncode == 0
        for name in cl.nodes:
            await wait_until(lambda name=name: _level(cl, name, LEVEL_MAX), timeout=15,
                             what=f"{name} at feature level {LEVEL_MAX}")
        p = cl.nodes["node3"]
        await p.stop()
        shutil.rmtree(p.data_dir)
        p.build = old
        await p.start()
        why = (f"node3 runs build 0.1.x, which supports feature levels 1..1, but this group is finalized at level "
               f"{LEVEL_MAX}: start node3 on a build that supports level {LEVEL_MAX} (see docs/upgrades.md)")
        for name in ("node1", "node2"):  # (each dials node3, whose name sorts after theirs, and refuses it)
            await wait_until(lambda name=name: _said(tmp_path / f"{name}.log", f"peer node3: link refused: {why}"),
                             timeout=15, what=f"{name} refusing node3")
            assert {r.name: r.state for r in (await cl.status(name)).remotes}["node3"] == "UnsupportedProtocol"
            assert (await cl.status(name)).feature_level == LEVEL_MAX
    finally:
        await cl.stop()


async def _said(path: Path, text: str) -> bool:
    return text in path.read_text()


async def test_members_that_define_a_record_type_differently_exchange_its_definitions(tmp_path: Path) -> None:
    """A link as node3 whose hello says the stamps of this build but for record.UserRecord
    (version 2, another definition): node1 sends its definition of that type alone once the link
    is open, takes node3's, and its status names the mismatch, the newer side (node3) converting."""
    ours = {t.name: t for t in record_types()}
    meta = ours["record.UserRecord"]
    newer = f"record.UserRecord v2: {'; '.join(f'{n}:{t}' for n, t in meta.fields)}; locked:bool"
    stamps = {n: t.stamp for n, t in ours.items()} | {"record.UserRecord": "2:0badc0de"}
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    del cl.nodes["node3"]
    try:
        await cl.start()
        got = await _claim(cl, "node1", "node3", build="9.0.0", levels=[1, LEVEL_MAX], level=1, types=stamps,
                           then=[PeerTypes(definitions={"record.UserRecord": newer})])
        sent = [f for f in got if isinstance(f, PeerTypes)]
        assert [f.definitions for f in sent] == [{"record.UserRecord": meta.definition}], got
        await wait_until(lambda: _mismatched(cl), timeout=15, what="node1 naming the mismatch")
        st = await cl.status("node1")
        (m,) = st.type_mismatches
        assert (m.member, m.name, m.ours, m.theirs, m.converts) == ("node3", "record.UserRecord", 1, 2, "there")
        out = _tandem("upgrade", "status", url=cl.nodes["node1"].url)
        assert "node3        record.UserRecord            here v1, there v2: converts there" in out.stdout, out.stdout
        # two members of this build: nothing differs, nothing is sent
        plain = await _claim(cl, "node1", "node3", build=__version__, levels=[1, LEVEL_MAX], level=1,
                             types={n: t.stamp for n, t in ours.items()}, then=[])
        assert not any(isinstance(f, PeerTypes) for f in plain), plain
        await wait_until(lambda: _no_mismatch(cl), timeout=15, what="the mismatch forgotten on a link alike")
    finally:
        await cl.stop()


async def _mismatched(cl: LocalCluster) -> bool:
    return bool((await cl.status("node1")).type_mismatches)


async def _no_mismatch(cl: LocalCluster) -> bool:
    return not (await cl.status("node1")).type_mismatches
