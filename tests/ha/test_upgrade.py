"""The rules of rolling upgrades (ha.upgrade): what a member's build says, who is too old for
the group or the group too new for this node, a store past this build, and when a finalize may go."""

from __future__ import annotations

from ha.upgrade import LEVEL_MAX, LEVEL_MIN, LEVELS, Build, finalize_refusal, store_refusal, too_new_a_group, too_old

NEW = Build("0.2.0", (1, 2), (1, 2), 1)
#: a build past this one
NEXT = LEVEL_MAX + 1
FIRST = Build.said("", (1, 1), [], 0)


def test_a_build_that_says_nothing_is_a_first_release_build() -> None:
    assert FIRST == Build("", (1, 1), (1, 1), 1) and FIRST.label == "0.1.x"
    assert Build.said("9.9", (1, 5), [3, 1], 2).levels == (1, 1)  # (a range that is no range: as if unsaid)
    assert Build.said("0.2.0", (1, 2), [1, 2], 2) == Build("0.2.0", (1, 2), (1, 2), 2)
    assert (LEVEL_MIN, LEVEL_MAX) == (min(LEVELS), max(LEVELS)) == (1, 12)


def test_a_member_is_too_old_only_for_a_level_its_build_lacks() -> None:
    assert too_old("node3", FIRST, 1) is None and too_old("node3", NEW, 2) is None
    assert too_old("node3", FIRST, 2) == (
        "node3 runs build 0.1.x, which supports feature levels 1..1, but this group is finalized at level 2: "
        "start node3 on a build that supports level 2 (see docs/upgrades.md)")


def test_a_group_past_this_build_is_named_with_what_to_do() -> None:
    assert too_new_a_group("node1", "0.3.0", "node2", NEW) is None
    said = Build("9.0.0", (1, 9), (1, NEXT), NEXT)
    assert too_new_a_group("node1", "0.3.0", "node2", said) == (
        f"node2 says this group is finalized at feature level {NEXT}, but this node's build 0.3.0 supports levels "
        f"1..{LEVEL_MAX}: start node1 on a build that supports level {NEXT} (see docs/upgrades.md)")


def test_a_store_past_this_build_is_refused_by_its_level() -> None:
    assert store_refusal("/d", LEVEL_MAX, "0.3.0") is None
    assert store_refusal("/d", NEXT, "0.3.0") == (
        f"the store at /d belongs to a group finalized at feature level {NEXT}, but this build (0.3.0) supports "
        f"levels 1..{LEVEL_MAX}: start this node on a build that supports level {NEXT} (see docs/upgrades.md)")


def test_a_finalize_needs_every_other_member_linked_and_able() -> None:
    builds = {"node2": NEW, "node3": NEW}
    assert finalize_refusal(2, 1, ["node2", "node3"], builds, ["node2", "node3"]) is None
    assert finalize_refusal(2, 1, [], {}, []) is None  # a single node
    assert finalize_refusal(2, 2, ["node2"], builds, ["node2"]) == "the group is at feature level 2 already"
    assert finalize_refusal(NEXT, 1, [], {}, []) == f"no feature level {NEXT}: this build knows levels 1..{LEVEL_MAX}"
    why = finalize_refusal(3, 1, ["node2"], {"node2": NEW}, ["node2"])  # (a 0.2.0 member: levels 1..2)
    assert why is not None and "node2 (build 0.2.0 supports levels 1..2)" in why
    why = finalize_refusal(2, 1, ["node2", "node3", "w1"], {"node2": FIRST, "node3": NEW}, ["node2", "w1"])
    assert why == ("cannot finalize feature level 2: not every member supports it: node2 (build 0.1.x supports "
                   "levels 1..1); node3 (not linked to this node: its build is not known); w1 (its build is not "
                   "known yet). Start every member on a build that supports level 2, then finalize again")
