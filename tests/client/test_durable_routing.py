"""Which partition map a durable connection routes by (sans-IO): a node without quorum is
not trusted over one with it, and requests move to a node with quorum."""

from __future__ import annotations

import dataclasses

import msgpack

from client.durable.routing import MapAnswer, ask_others, merge, serving_node, settled
from client.protocol.frames import MetadataOk, PartitionMap, QueueInfo
from client.protocol.codec import decode_payload, encode

INFO = QueueInfo("q", 4, "consistent_hash", 1024, 0, None, 0, 0, 0, 0, 0, 0, 0)
ADDR = {"node1": "h:1", "node2": "h:2", "node3": "h:3"}


def _answer(node: str, actives: list[str], quorum: bool = True, addresses: dict[str, str] | None = None) -> MapAnswer:
    return MapAnswer(node, PartitionMap(INFO, actives, dict(ADDR if addresses is None else addresses)), quorum)


def test_only_a_primary_without_quorum_makes_the_connection_ask_the_others() -> None:
    assert ask_others(_answer("node1", ["", "", "", ""], quorum=False))
    assert ask_others(_answer("node1", ["node1", "node2", "node3", "node1"], quorum=False))
    assert not ask_others(_answer("node1", ["node1", "", "node3", "node1"]))


def test_the_map_of_a_node_without_quorum_gives_way_to_one_with_quorum() -> None:
    minority = _answer("node1", ["node1", "", "node1", ""], quorum=False)  # stale: it lost them
    majority = _answer("node2", ["node3", "node2", "", "node2"])
    m = merge([minority, majority])
    assert m.actives == ["node3", "node2", "", "node2"]  # partition 2 is being elected: forwarded
    assert m.queue == INFO


def test_partitions_are_filled_in_from_every_node_with_quorum_first_answer_first() -> None:
    minority = _answer("node1", ["", "", "", ""], quorum=False)
    a = _answer("node2", ["node2", "", "node3", ""])
    b = _answer("node3", ["node2", "node3", "node2", ""])
    assert merge([minority, a, b]).actives == ["node2", "node3", "node3", ""]


def test_without_any_node_with_quorum_every_answer_counts() -> None:
    a = _answer("node1", ["", "node1", "", ""], quorum=False)
    b = _answer("node2", ["node2", "node2", "", ""], quorum=False)
    assert merge([a, b]).actives == ["node2", "node1", "", ""]
    assert not settled([a, b])


def test_addresses_come_from_every_answer() -> None:
    a = _answer("node1", ["", "", "", ""], quorum=False, addresses={"node1": "h:1"})
    b = _answer("node2", ["node2"] * 4, addresses={"node2": "h:2", "node3": "h:3"})
    assert merge([a, b]).addresses == ADDR


def test_enough_answers_once_the_nodes_with_quorum_name_every_active() -> None:
    minority = _answer("node1", ["", "", "", ""], quorum=False)
    assert not settled([minority])
    part = _answer("node2", ["node2", "", "node2", "node2"])
    assert not settled([minority, part])
    assert settled([minority, part, _answer("node3", ["node2", "node3", "node2", "node2"])])


def test_requests_about_no_partition_move_to_a_node_with_quorum() -> None:
    minority = _answer("node1", ["", "", "", ""], quorum=False)
    assert serving_node([minority, _answer("node3", [""] * 4), _answer("node2", [""] * 4)], "node1") == "node3"
    assert serving_node([minority, _answer("node2", [""] * 4, quorum=False)], "node1") == "node1"
    assert serving_node([_answer("node1", [""] * 4), _answer("node2", [""] * 4)], "node1") == "node1"


def test_metadata_ok_says_quorum_and_an_older_node_s_answer_reads_as_quorum() -> None:
    m = PartitionMap(INFO, ["node1"] * 4, ADDR)
    no_quorum = MetadataOk(rid=3, map=m, quorum=False)
    assert decode_payload(encode(no_quorum)[4:]) == no_quorum
    info_row = [getattr(INFO, f.name) for f in dataclasses.fields(INFO)]
    older = msgpack.packb({"op": int(MetadataOk.OP), "rid": 3, "map": [info_row, m.actives, m.addresses]})
    assert decode_payload(older) == MetadataOk(rid=3, map=m, quorum=True)
