"""The witness's store (terms, votes, positions: what it reloads after a restart), its
command line (clear one-line errors), and the tasks it starts (all ended by its stop)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.arbiters.witness import Witness, WitnessConfig, WitnessStore
from broker.peers.codec import encode_message, encode_replicate
from ha.messages import Entry, RequestVote
from tests.helpers import group_secret_file, wait_until


def test_the_store_gives_back_terms_votes_commit_and_positions_after_a_reopen(tmp_path: Path) -> None:
    s = WitnessStore(tmp_path / "witness.db")
    stamp = s.stamp("witness-1")
    key = (3, 1)
    s.write([("hard", key, 4, "node1", 2),
             ("append", key, [Entry(4, i, None, "node1", False) for i in range(1, 6)])])
    s.write([("truncate", key, 5), ("append", key, [Entry(5, 5, None, "node2", True)]),
             ("snapshot", key, 2, 4, "node1"), ("hard", key, 5, None, 3)])
    s.close()
    s = WitnessStore(tmp_path / "witness.db")
    assert s.stamp("witness-2") == stamp
    saved = s.load()[key]
    assert (saved.term, saved.voted_for, saved.commit, saved.snapshot) == (5, None, 3, (2, 4, "node1"))
    assert [(e.index, e.term, e.origin, e.weak) for e in saved.entries] == [
        (3, 4, "node1", False), (4, 4, "node1", False), (5, 5, "node2", True)]
    s.close()


def test_config_wants_the_two_data_nodes_and_a_name_of_its_own() -> None:
    with pytest.raises(ConfigError, match="two-node group"):
        WitnessConfig(name="w1", peer_port=7781, peers=("node1=h:7771",))
    with pytest.raises(ConfigError, match="also the name of a data node"):
        WitnessConfig(name="node1", peer_port=7781, peers=("node1=h:7771", "node2=h:7772"))
    with pytest.raises(ConfigError, match="keepalive_interval"):
        WitnessConfig(name="w1", peer_port=7781, peers=("node1=h:7771", "node2=h:7772"), keepalive_interval=5)


@pytest.mark.parametrize("args, message", [
    (["--peers", "node1=h:1"], "two-node group"),
    (["--peers", "node1=h:1,node2"], "'node2' is not NAME=HOST:PORT"),
    (["--peers", "node1=h:1,node2=h:2", "--peer-port", "70000"], "--peer-port 70000"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    base = {"--name": "w1", "--peer-port": "7781"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    cmd = [sys.executable, "-m", "broker.cli", "witness", "start", *[x for kv in base.items() for x in kv]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_one_witness_per_data_dir(tmp_path: Path) -> None:
    s = WitnessStore(tmp_path / "witness.db")
    with pytest.raises(ConfigError, match="another witness is running on it"):
        WitnessStore(tmp_path / "witness.db")
    s.close()
    WitnessStore(tmp_path / "witness.db").close()


@pytest.mark.asyncio
async def test_stop_ends_every_task_the_witness_started(tmp_path: Path) -> None:
    """Its links (an accepted one that says nothing), its vote loop and a vote's write in
    flight: after stop none is alive."""
    before = asyncio.all_tasks()
    cfg = WitnessConfig(name="w1", peer_port=0, peers=("node1=127.0.0.1:1", "node2=127.0.0.1:2"),
                        data_dir=tmp_path / "w1", cluster_secret_file=group_secret_file(tmp_path))
    w = Witness(cfg)
    await w.start()
    assert w.peers is not None and w.peers.address is not None
    _reader, writer = await asyncio.open_connection(*w.peers.address)
    vote = encode_replicate([[3, 0, encode_message(RequestVote(1, "node1", 0, 0, 1))]])
    w.receive("node1", vote)  # its answer is written before it goes: a write on a thread
    await wait_until(lambda: w._writing is not None or bool(w.logs), what="the vote taken")
    await w.stop()
    assert [t for t in asyncio.all_tasks() if t not in before and not t.done()] == []
    writer.close()
