"""broker.peers.foreign: what members' keep-alives say about the partitions a node holds no copy of."""

from __future__ import annotations

from broker.peers.foreign import MAX_CLAIMS, ForeignActives, flatten


def nothing_here(_key: tuple[int, int]) -> bool:
    return False


def test_a_members_claims_replace_its_last_ones() -> None:
    f = ForeignActives()
    assert f.heard("n2", flatten([((1, 0), 3), ((1, 2), 3)]), nothing_here)
    assert f.active((1, 0)) == ("n2", 3) and f.active((1, 2)) == ("n2", 3)
    assert not f.heard("n2", flatten([((1, 0), 3), ((1, 2), 3)]), nothing_here)  # nothing new
    assert f.heard("n2", flatten([((1, 0), 3)]), nothing_here)  # it no longer serves 1/2
    assert f.active((1, 2)) is None


def test_an_older_term_does_not_displace_a_newer_one() -> None:
    f = ForeignActives()
    f.heard("n3", flatten([((1, 0), 5)]), nothing_here)
    assert not f.heard("n2", flatten([((1, 0), 4)]), nothing_here)  # a deposed active's late keep-alive
    assert f.active((1, 0)) == ("n3", 5)
    assert f.heard("n2", flatten([((1, 0), 6)]), nothing_here)  # elected again, later
    assert f.active((1, 0)) == ("n2", 6)
    assert not f.forget("n3")  # its claim was displaced: nothing of it stands
    assert f.forget("n2") and f.active((1, 0)) is None


def test_held_partitions_and_malformed_claims_are_ignored() -> None:
    f = ForeignActives()
    assert not f.heard("n2", flatten([((1, 0), 3)]), lambda k: k == (1, 0))
    for bad in ([1, 0], [1, 0, -3], [1, 0, True], [0, 0, 1] * (MAX_CLAIMS + 1)):
        assert not f.heard("n2", bad, nothing_here)
    assert f.active((1, 0)) is None and f.active((0, 0)) is None
