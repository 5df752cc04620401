"""The storage fault drills in short form (broker/tools/drill/storefaults.py): a node (or two at
once) killed, one bit flipped in a log record, one in a stored chunk and one in a producer's
stored position, a chunk row gone (a lost write to the store) where there is another chunk than
the flipped one, the node started again under load; it finds each, catches up (repaired), and
every message is checked byte for byte. And a store with one partition's rows left some writes
behind the rest (stale-store)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.tools.drill import DrillConfig, drill
from broker.tools.drill.families import load_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.asyncio]


@pytest.mark.parametrize("family", ["bit-flip", "bit-flip-two"])
async def test_bit_flips_at_rest_are_found_and_nothing_damaged_is_delivered(tmp_path: Path, family: str) -> None:
    assert family in load_families()
    cfg = DrillConfig(family, producers=1, consumers=1, messages=300, partitions=4, seed=3, data_dir=tmp_path,
                      timeout=150, non_response_timeout=0.5, watch=0.0, consume_pause=0.02)  # (a backlog to flip)
    rep = await drill(cfg, repeat=1)
    print(f"{family}: schedule {rep['schedule']}, errors {rep['errors']}")
    fault = rep["schedule"][0]
    targets = re.findall(r"(node\d): kill -9, ", fault)
    assert fault.startswith(f"run 1: {family} node") and len(targets) == (2 if family == "bit-flip-two" else 1), \
        rep["schedule"]
    # (the first node's store damage first: a second's goes where the first's is not, if anywhere)
    first = fault.split("; ")[0]
    assert "one bit in the stored chunk of partition" in first, rep["schedule"]
    assert "one bit in the stored position of producer" in first, rep["schedule"]
    for n, node in enumerate(targets):
        said = next(part for part in fault.split("; ") if f"{node}: kill -9" in part)
        assert "one bit at byte" in said, rep["schedule"]
        found = next(line for line in rep["schedule"] if f"{family} {node}: injected " in line)
        injected, detected, repaired = (int(n) for n in re.findall(r"injected (\d+), detected (\d+), repaired (\d+)",
                                                                   found)[0])
        assert injected == detected == repaired >= (3 if n == 0 else 1), rep["schedule"]
        assert found.endswith("(the log (log-damaged event)" + (", the chunk (its log line)" if "stored chunk" in said
                                                                else "")
                              + (", the producer's row (its log line)" if "stored position" in said else "")
                              + (", the lost write to the store (its log line))" if "lost write" in said else ")")), \
            rep["schedule"]
        assert injected == sum(what in said for what in ("one bit at byte", "stored chunk", "stored position",
                                                         "a lost write to the store: the chunk row of partition"))
    if family == "bit-flip-two":  # (each partition's store damage on one of the two nodes only)
        parts = [set(re.findall(r"partition (\d+/\d+)", part)) for part in fault.split("; ")]
        assert not parts[0] & parts[1], fault
    assert rep["sent"] == rep["confirmed"] + rep["failed_sends"]
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["errors"] == [] and rep["passed"], rep


@pytest.mark.parametrize("family", ["stale-store", "stale-acks", "stale-store-two"])
async def test_a_store_left_behind_its_applied_position_is_found_and_repaired(tmp_path: Path, family: str) -> None:
    """A node's (or two nodes') store with one partition's rows put back as they were some writes
    earlier (its chunk and partitions rows, or its ha_state row, or its settled and counts rows:
    always those with stale-acks), as a lost write leaves it: the restarted node names the
    partition, catches up, and nothing is lost. (600 messages, consumed
    0.02 s apart: their acks keep every store applying for seconds after the rows are read, so
    each target's store moves on within the drill's wait however busy the machine.)"""
    cfg = DrillConfig(family, producers=1, consumers=1, messages=600, partitions=4, seed=3, data_dir=tmp_path,
                      timeout=150, non_response_timeout=0.5, watch=0.0, consume_pause=0.02)
    rep = await drill(cfg, repeat=1)
    print(f"{family}: schedule {rep['schedule']}, errors {rep['errors']}")
    fault = rep["schedule"][0]
    said = re.findall(r"(node\d): kill -9, a lost write to the store: the (?:ha_state row|chunk and partitions rows|"
                      r"settled and counts rows) "
                      r"of partition (\d+/\d+) put back as (?:it was|they were) at entry \d+", fault)
    assert len(said) == (2 if family == "stale-store-two" else 1), rep["schedule"]
    assert len({part for _node, part in said}) == len(said), fault  # (each node's in a partition of its own)
    if family == "stale-acks":
        assert "the settled and counts rows of partition" in fault, fault
    for node, _part in said:
        found = next(line for line in rep["schedule"] if f"{family} {node}: injected " in line)
        assert found.endswith("injected 1, detected 1, repaired 1 (the lost write to the store (its log line))"), \
            rep["schedule"]
    assert rep["sent"] == rep["confirmed"] + rep["failed_sends"]
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["errors"] == [] and rep["passed"], rep
