"""`tandem bench`'s partition count: by default one per node of the group under test."""

from __future__ import annotations

import argparse

import pytest

from broker.bench.cli import SINGLE_NODE_PARTITIONS, _partitions


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"partitions": None, "spawn": False, "nodes": 1, "url": None}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize(("kw", "expected"), [
    ({"spawn": True, "nodes": 3}, 3),
    ({"spawn": True, "nodes": 5}, 5),
    ({"spawn": True}, SINGLE_NODE_PARTITIONS),
    ({"url": "tandem://admin:pw@127.0.0.1:7780,127.0.0.1:7790,127.0.0.1:7800"}, 3),
    ({"url": "tandem://admin:pw@127.0.0.1:7780"}, SINGLE_NODE_PARTITIONS),
    ({"spawn": True, "nodes": 3, "partitions": 4}, 4),
    ({"url": "tandem://admin:pw@a:1,b:2", "partitions": 7}, 7),
])
def test_partitions_default_to_one_per_node(kw: dict[str, object], expected: int) -> None:
    assert _partitions(_args(**kw)) == expected
