"""The storage fault drill in short form (broker/tools/drill/storefaults.py): a node killed, one
bit flipped in a log record, one in a stored chunk and one in a producer's stored position, a
chunk row gone (a lost write to the store) where there is another chunk than the flipped one,
the node started again under load; it finds each, catches up, and every message is checked
byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.tools.drill import DrillConfig, drill
from broker.tools.drill.families import load_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.asyncio]


async def test_bit_flips_at_rest_are_found_and_nothing_damaged_is_delivered(tmp_path: Path) -> None:
    assert "bit-flip" in load_families()
    cfg = DrillConfig("bit-flip", producers=1, consumers=1, messages=300, partitions=4, seed=3, data_dir=tmp_path,
                      timeout=150, non_response_timeout=0.5, watch=0.0, consume_pause=0.02)  # (a backlog to flip)
    rep = await drill(cfg, repeat=1)
    print(f"bit-flip: schedule {rep['schedule']}, errors {rep['errors']}")
    assert rep["schedule"][0].startswith("run 1: bit-flip node") and "one bit at byte" in rep["schedule"][0], \
        rep["schedule"]
    assert "one bit in the stored chunk of partition" in rep["schedule"][0], rep["schedule"]
    assert "one bit in the stored position of producer" in rep["schedule"][0], rep["schedule"]
    found = next(line for line in rep["schedule"] if ": injected " in line)
    injected, detected = (int(n) for n in re.findall(r"injected (\d+), detected (\d+)", found)[0])
    assert injected == detected >= 3, rep["schedule"]
    assert found.endswith("(the log (log-damaged event), the chunk (its log line), the producer's row (its log line)"
                          + (", the lost chunk row (its log line))" if injected == 4 else ")")), rep["schedule"]
    # (the lost write takes a chunk row other than the flipped one: none when the store holds one)
    assert (injected == 4) == ("a lost write to the store: the chunk row of partition" in rep["schedule"][0])
    assert rep["sent"] == rep["confirmed"] + rep["failed_sends"]
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["errors"] == [] and rep["passed"], rep
