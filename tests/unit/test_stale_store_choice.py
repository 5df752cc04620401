"""How ``stale-store-two`` gives each of its targets a partition of its own
(broker/tools/drill/storefaults.py): a partition each target's store moved on in, none taken
twice, whichever order the stores moved in."""

from __future__ import annotations

from broker.tools.drill.storefaults import _distinct, _moved


def test_moved_names_the_partitions_whose_applied_position_changed() -> None:
    earlier = {(1, 0): (5, 1), (1, 1): (7, 1)}
    now = {(1, 0): (5, 1), (1, 1): (9, 1), (1, 2): (3, 2)}
    assert _moved(earlier, now) == [(1, 1), (1, 2)]


def test_each_target_needs_a_partition_of_its_own() -> None:
    assert _distinct([])
    assert not _distinct([[]])
    assert _distinct([[(1, 0)]])
    # both stores moved on in one partition only, the same one: no two distinct partitions
    assert not _distinct([[(1, 0)], [(1, 0)]])
    assert not _distinct([[(1, 0), (1, 1)], []])
    # the first could take the second's only partition: another is left for it
    assert _distinct([[(1, 0), (1, 1)], [(1, 0)]])
    assert _distinct([[(1, 0)], [(1, 0), (1, 1)]])
    assert not _distinct([[(1, 0)], [(1, 1)]], taken={(1, 1)})
