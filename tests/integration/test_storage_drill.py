"""The storage fault drills in short form (broker/tools/drill/storefaults.py): a node (or two at
once) killed, one bit flipped in a log record, one in a stored chunk and one in a producer's
stored position, a chunk row gone (a lost write to the store) where there is another chunk than
the flipped one, the node started again under load; it finds each, catches up (repaired), and
every message is checked byte for byte."""

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
    for part in fault.split("; "):
        assert "one bit at byte" in part and "one bit in the stored chunk of partition" in part, rep["schedule"]
        assert "one bit in the stored position of producer" in part, rep["schedule"]
    for node in targets:
        said = next(part for part in fault.split("; ") if f"{node}: kill -9" in part)
        found = next(line for line in rep["schedule"] if f"{family} {node}: injected " in line)
        injected, detected, repaired = (int(n) for n in re.findall(r"injected (\d+), detected (\d+), repaired (\d+)",
                                                                   found)[0])
        assert injected == detected == repaired >= 3, rep["schedule"]
        assert found.endswith("(the log (log-damaged event), the chunk (its log line), the producer's row (its log "
                              "line)" + (", the lost chunk row (its log line))" if injected == 4 else ")")), \
            rep["schedule"]
        # (the lost write takes a chunk row other than the flipped one: none when the store holds one)
        assert (injected == 4) == ("a lost write to the store: the chunk row of partition" in said)
    if family == "bit-flip-two":  # (each partition's store damage on one of the two nodes only)
        parts = [set(re.findall(r"partition (\d+/\d+)", part)) for part in fault.split("; ")]
        assert not parts[0] & parts[1], fault
    assert rep["sent"] == rep["confirmed"] + rep["failed_sends"]
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["errors"] == [] and rep["passed"], rep
