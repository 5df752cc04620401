"""broker.peers.discovery's rules, on a FakeClock with a stand-in for the peer links: what a reply's
entries may be, that seeds are asked until one answers, that linked members are asked
before seeds, and the settings' checks of ``seeds``.  The real thing, with node processes,
runs in tests/integration/test_discovery.py."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from broker.config import ConfigError, NodeConfig, build_config
from broker.peers.discovery import ANNOUNCE, MAX_ENTRIES, ROUND, Discovery, parse_book
from broker.messaging.forward import MembersFwd, pack_reply
from client.errors import UnavailableError
from client.protocol import codec
from client.protocol.frames import PeerHello, PeerWelcome
from client.testing import FakeClock


def test_a_reply_gives_well_formed_entries_of_other_members_only(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "tandem.ha"):
        got = parse_book(["node1=10.0.0.1:7781", "me=10.0.0.9:7781", "bad", "x=h:0", 7, "node2=[::1]:7781",
                          "node3=host.example:99999", "a b=h:1"], "me")
    assert got == {"node1": ("10.0.0.1", 7781), "node2": ("[::1]", 7781)}
    assert "5 malformed entries ignored" in caplog.text


def test_a_reply_is_bounded() -> None:
    got = parse_book([f"n{i}=10.0.0.1:{1000 + i}" for i in range(MAX_ENTRIES + 50)], "me")
    assert len(got) == MAX_ENTRIES


class _Node:
    def __init__(self, seeds: tuple[str, ...], missing: list[str]) -> None:
        self.config = SimpleNamespace(name="a4", seeds=seeds)
        self.clock = FakeClock(autojump=True)
        self.missing = missing
        self.learned: list[dict[str, Any]] = []

    def missing_addresses(self) -> list[str]:
        return self.missing

    def learn_addresses(self, found: dict[str, Any]) -> None:
        self.learned.append(found)
        self.missing = [n for n in self.missing if n not in found]


class _Peers:
    def __init__(self, answers: dict[tuple[str, int], list[Any]], links: dict[str, Any] | None = None) -> None:
        self.answers = answers
        self.links = links or {}
        self.asked: list[tuple[str, int]] = []
        self.forwarded: list[str] = []
        self.unlinked: list[tuple[str, tuple[str, int]]] = []

    def unlinked_dialers(self) -> list[tuple[str, tuple[str, int]]]:
        return self.unlinked

    async def discover_at(self, host: str, port: int) -> Any:
        self.asked.append((host, port))
        queue = self.answers[(host, port)]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    async def forward(self, name: str, request: MembersFwd) -> bytes:
        self.forwarded.append(name)
        return self.links[name]()


@pytest.mark.asyncio
async def test_seeds_are_asked_in_turn_until_one_answers_and_its_own_address_is_the_one_dialled(
        caplog: pytest.LogCaptureFixture) -> None:
    node = _Node(("s1:7781", "s2:7781"), ["*"])
    peers = _Peers({("s1", 7781): ["no answer (Connection refused)"],
                    ("s2", 7781): ["refused this node: a4 is not a member of this group",
                                   "refused this node: a4 is not a member of this group",
                                   ("node2", ["node1=10.0.0.1:7781", "node3=10.0.0.3:7781", "a4=10.0.0.4:7781"])]})
    d = Discovery(node, peers)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "tandem.ha"):
        found = await d.find_group()
    assert found == {"node1": ("10.0.0.1", 7781), "node3": ("10.0.0.3", 7781), "node2": ("s2", 7781)}
    assert peers.asked == [("s1", 7781), ("s2", 7781)] * 3
    assert node.clock.monotonic() == 2 * ROUND
    # each seed's reason said once, not every round
    assert caplog.text.count("seed s1:7781 gave no member addresses: no answer") == 1
    assert caplog.text.count("seed s2:7781 gave no member addresses: refused this node") == 1


@pytest.mark.asyncio
async def test_a_missing_address_is_asked_of_linked_members_before_the_seeds() -> None:
    node = _Node(("s1:7781",), ["node1"])
    peers = _Peers({("s1", 7781): [("node2", ["node1=10.0.0.9:7781"])]},
                   links={"node3": lambda: pack_reply(["node1=10.0.0.1:7781", "node2=10.0.0.2:7781"])})
    d = Discovery(node, peers)  # type: ignore[arg-type]
    await d.round(node.missing)
    assert peers.forwarded == ["node3"] and peers.asked == []
    assert node.learned == [{"node1": ("10.0.0.1", 7781), "node2": ("10.0.0.2", 7781)}]


@pytest.mark.asyncio
async def test_a_linked_member_that_fails_to_answer_leaves_it_to_the_seeds() -> None:
    def fails() -> bytes:
        raise UnavailableError("link to node node3 lost during a forwarded request")

    node = _Node(("s1:7781",), ["node1"])
    peers = _Peers({("s1", 7781): [("node2", ["node1=10.0.0.1:7781"])]}, links={"node3": fails})
    d = Discovery(node, peers)  # type: ignore[arg-type]
    await d.round(node.missing)
    assert peers.asked == [("s1", 7781)]
    assert node.learned == [{"node1": ("10.0.0.1", 7781), "node2": ("s1", 7781)}] and node.missing == []


@pytest.mark.asyncio
async def test_nothing_is_asked_while_nothing_is_missing() -> None:
    node = _Node(("s1:7781",), [])
    peers = _Peers({("s1", 7781): ["no answer"]})
    d = Discovery(node, peers)  # type: ignore[arg-type]
    task = asyncio.ensure_future(d.run())
    await node.clock.sleep(10 * ROUND)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert peers.asked == []


@pytest.mark.asyncio
async def test_a_member_that_dials_this_node_and_has_no_link_is_told_where_it_is_every_announce() -> None:
    """A member that dials this node (its name sorts first) with no link to it for ANNOUNCE s
    gets a discovery link (its handshake says this node's peer port), again every ANNOUNCE s
    while it has none; linked again, the wait starts afresh."""
    node = _Node((), [])
    peers = _Peers({("10.0.0.1", 7781): ["no answer (Connection refused)"]})
    peers.unlinked = [("node1", ("10.0.0.1", 7781))]
    d = Discovery(node, peers)  # type: ignore[arg-type]
    clock = node.clock
    for _ in range(int(ANNOUNCE / ROUND)):
        await d.announce()
        await clock.sleep(ROUND)
    assert peers.asked == []  # (within ANNOUNCE s of the first look: it may be dialling already)
    await d.announce()
    assert peers.asked == [("10.0.0.1", 7781)]
    await clock.sleep(ROUND)
    await d.announce()
    assert len(peers.asked) == 1
    await clock.sleep(ANNOUNCE)
    await d.announce()
    assert len(peers.asked) == 2
    peers.unlinked = []
    await d.announce()
    peers.unlinked = [("node1", ("10.0.0.1", 7781))]
    await d.announce()
    await clock.sleep(ROUND)
    await d.announce()
    assert len(peers.asked) == 2  # (linked in between: a fresh wait)


def _config(**kw: Any) -> NodeConfig:
    return build_config({"name": "a4", "data_dir": "/tmp/x", "peer_port": 7781, **kw})


def test_the_settings_take_seeds_and_join_by_them() -> None:
    cfg = _config(seeds="10.0.0.1:7781,peers.internal:7781", join=True)
    assert cfg.seeds == ("10.0.0.1:7781", "peers.internal:7781")
    with pytest.raises(ConfigError, match="seeds: 'nope' is not host:port"):
        _config(seeds=["nope"])
    with pytest.raises(ConfigError, match="seeds: only for a member of a replicated group"):
        build_config({"name": "a4", "data_dir": "/tmp/x", "seeds": ["10.0.0.1:7781"]})
    with pytest.raises(ConfigError, match="join: only for a new member"):
        _config(join=True)


def test_the_new_frame_fields_are_optional_both_ways() -> None:
    """A peer that sends no ``discover``/``members`` (these fields' defaults) is understood."""
    w = PeerWelcome(version=1, node="n", store_stamp="s", priority=1, votes=1, members=["a=h:1"])
    back = codec.decode_payload(codec.encode(w)[4:])
    assert back == w
    h = PeerHello(min_version=1, max_version=1, node="n", store_stamp="s", priority=1, votes=1)
    assert codec.decode_payload(codec.encode(h)[4:]) == h and not h.discover
