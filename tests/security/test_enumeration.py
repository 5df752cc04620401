"""Which user names exist cannot be learnt from the SCRAM challenge without a failed login:
a name nobody has gets the same salt (and iteration count) from every member of a group and
after a restart, as a real user's does (broker.security.secret.decoy_key)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from broker.tools.process import NodeProcess
from client import scram
from tests.conftest import PASSWORD, running_group
from tests.security.wire import challenge

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

GHOSTS = ("mallory", "svc-backup", "root")


async def _salts(proc: NodeProcess, names: tuple[str, ...] = GHOSTS) -> dict[str, tuple[bytes, int]]:
    """The salt and iteration count ``proc`` challenges each of ``names`` with."""
    assert proc.address is not None
    return {name: await challenge(*proc.address, name) for name in names}


async def test_every_member_challenges_an_unknown_name_alike_across_restarts(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        await cl.wait_members()
        seen = {name: await _salts(p) for name, p in cl.nodes.items()}
        first = seen["node1"]
        for name in cl.nodes:
            assert seen[name] == first, f"{name} challenges differently from node1"
        assert len({salt for salt, _i in first.values()}) == len(GHOSTS)  # a salt per name
        admin_salt, admin_iterations = (await _salts(cl.nodes["node1"], ("admin",)))["admin"]
        assert {(len(salt), i) for salt, i in first.values()} == {(len(admin_salt), admin_iterations)} \
            == {(16, scram.DEFAULT_ITERATIONS)}  # as a real user's
        await cl.nodes["node2"].stop()
        await cl.nodes["node2"].start()
        await cl.nodes["node3"].kill()
        await cl.nodes["node3"].start()
        await cl.wait_members()
        for name in ("node2", "node3"):
            assert await _salts(cl.nodes[name]) == first, f"{name} challenges differently after its restart"


async def test_a_single_node_challenges_an_unknown_name_alike_across_restarts(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "single", password=PASSWORD)
    try:
        before = await _salts(await node.start())
        await node.stop()
        assert await _salts(await node.start()) == before
        await node.kill()
        assert await _salts(await node.start()) == before
        key = tmp_path / "single" / "decoy-key"  # what the salts come from (broker.security.secret.DECOY_KEY_FILE)
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    finally:
        await node.stop()
