"""`tandem bench`'s partition count: by default a group's queue is the one a client declares
with the defaults (one partition), a single node's has 4."""

from __future__ import annotations

import argparse

import pytest

from broker.tools.bench.cli import GROUP_PARTITIONS, SINGLE_NODE_PARTITIONS, _partitions


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"partitions": None, "spawn": False, "nodes": 1, "url": None}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize(("kw", "expected"), [
    ({"spawn": True, "nodes": 3}, GROUP_PARTITIONS),
    ({"spawn": True, "nodes": 5}, GROUP_PARTITIONS),
    ({"spawn": True}, SINGLE_NODE_PARTITIONS),
    ({"url": "tandem://admin:pw@127.0.0.1:7780,127.0.0.1:7790,127.0.0.1:7800"}, GROUP_PARTITIONS),
    ({"url": "tandem://admin:pw@127.0.0.1:7780"}, SINGLE_NODE_PARTITIONS),
    ({"spawn": True, "nodes": 3, "partitions": 4}, 4),
    ({"url": "tandem://admin:pw@a:1,b:2", "partitions": 7}, 7),
])
def test_partitions_default_to_the_default_queue_in_a_group(kw: dict[str, object], expected: int) -> None:
    assert _partitions(_args(**kw)) == expected


def test_a_group_default_is_the_queue_a_client_declares_by_default() -> None:
    import inspect

    from client.connection import Connection

    declared = inspect.signature(Connection.declare_queue).parameters["partitions"].default
    assert GROUP_PARTITIONS == declared == 1
