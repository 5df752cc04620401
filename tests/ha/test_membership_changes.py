"""Membership changes of a partition in its own log (ha.members, Replica.change_members):
one voter at a time, in effect where the entry is, undone with it, carried by snapshots;
and random schedules of adds and removes under loss, crashes, cuts and compaction that
keep every confirmed entry (tests/ha/sim.py's checks: one active a term, every confirmed
entry on every later active, applied states one history)."""

from __future__ import annotations

import pytest

from ha.confchange import MembershipRefused
from ha.members import Members, decode, encode
from ha.replica import Role
from tests.ha.sim import Cluster, SafetyViolation

ABC = ("a", "b", "c")


def settle(c: Cluster, seconds: float, writes: float = 0.0) -> None:
    for _ in range(int(seconds / 0.01)):
        c.step()
        if writes and c.rng.random() < writes:
            c.write()


def active(c: Cluster) -> str:
    for _ in range(1000):
        lead = c.leader()
        if lead is not None and c.nodes[lead].commit >= c.nodes[lead].last_index:  # type: ignore[union-attr]
            return lead
        c.step()
    raise AssertionError(f"seed {c.seed}: no active")


def change(c: Cluster, new: Members) -> None:
    """The active proposes ``new`` and it commits."""
    lead = active(c)
    r = c.nodes[lead]
    assert r is not None
    ready, entry = r.change_members(new)
    c.handle(lead, ready)
    for _ in range(1000):
        c.step()
        r = c.nodes[c.leader() or lead]
        if r is not None and r.commit >= entry.index and r.members == new:
            return
    raise AssertionError(f"seed {c.seed}: {new} did not commit")


def caught_up(c: Cluster, node: str) -> None:
    for _ in range(2000):
        c.step()
        lead = c.leader()
        r = c.nodes[lead] if lead is not None else None
        if r is not None and r.progress().get(node, 0) >= r.commit:
            return
    raise AssertionError(f"seed {c.seed}: {node} never caught up")


def test_the_entry_encodes_the_members_and_nothing_else_looks_like_one() -> None:
    m = Members(("a", "b", "d"), ("c",))
    assert decode(encode(m)) == m
    assert decode(b"\x93\x01\x02\x03") is None and decode(None) is None and decode(b"\xc1") is None
    for bad in (b"\xc1[", b"\xc1[1, 2]", b"\xc1[[1], []]", b"\xc1[[], []]", b"\xc1[[\"a\"], [\"a\"]]", b"\xc1{}"):
        assert decode(bad) is None, bad
    with pytest.raises(ValueError):
        Members(("a",), ("a",))
    with pytest.raises(ValueError):
        Members(())


@pytest.mark.parametrize("seed", range(5))
def test_add_a_learner_promote_it_and_remove_another_voter(seed: int) -> None:
    c = Cluster(seed, ABC, loss=0.02)
    settle(c, 3, writes=0.3)
    c.add_node("d", Members(ABC, ("d",)))
    change(c, Members(ABC, ("d",)))
    caught_up(c, "d")
    change(c, Members(("a", "b", "c", "d")))
    settle(c, 1, writes=0.3)
    leaving = next(n for n in ABC if n != c.leader())
    change(c, Members(tuple(n for n in ("a", "b", "c", "d") if n != leaving)))
    settle(c, 3, writes=0.3)
    staying = [n for n in ("a", "b", "c", "d") if n != leaving]
    for n in staying:
        r = c.nodes[n]
        assert r is not None and r.members == Members(tuple(staying)), (n, r.members if r else None)
    assert c.nodes["d"].role in (Role.FOLLOWER, Role.LEADER)  # type: ignore[union-attr]
    # the node taken out stands no more, and the others commit without it
    gone = c.nodes[leaving]
    assert gone is not None and gone.role is Role.LEARNER
    c.crash(leaving)
    before = c.nodes[active(c)].commit  # type: ignore[union-attr]
    settle(c, 2, writes=0.5)
    assert c.nodes[active(c)].commit > before  # type: ignore[union-attr]


def test_the_active_refuses_what_is_not_safe() -> None:
    c = Cluster(1, ABC, loss=0.0)
    while c.leader() is None:
        c.step()
    new = c.nodes[c.leader()]  # type: ignore[index]
    assert new is not None and new.commit < new.last_index  # its no-op is not committed yet
    with pytest.raises(MembershipRefused, match="not committed an entry of its own term"):
        new.change_members(Members(ABC, ("d",)))
    lead = active(c)
    r = c.nodes[lead]
    assert r is not None
    with pytest.raises(MembershipRefused, match="one node at a time"):
        r.change_members(Members(("a", "d", "e") if lead == "a" else (lead, "d", "e")))
    with pytest.raises(MembershipRefused, match="not caught up"):
        r.change_members(Members((*ABC, "d")))
    with pytest.raises(MembershipRefused, match="hand the partition to another voter"):
        r.change_members(Members(tuple(n for n in ABC if n != lead)))
    with pytest.raises(MembershipRefused, match="already those"):
        r.change_members(Members(ABC))
    c.add_node("d", Members(ABC, ("d",)))
    ready, _e = r.change_members(Members(ABC, ("d",)))
    c.handle(lead, ready)
    with pytest.raises(MembershipRefused, match="not committed yet"):
        r.change_members(Members(ABC))
    follower = c.nodes[next(n for n in ABC if n != lead)]
    assert follower is not None
    with pytest.raises(MembershipRefused, match="not the partition's active"):
        follower.change_members(Members(ABC))


@pytest.mark.parametrize("seed", range(3))
def test_two_voters_changed_at_once_lose_confirmed_entries_so_the_active_refuses(seed: int) -> None:
    """The rule the simulation's checks hold the core to: an active that swapped two voters
    at once ({a, b, c} -> {a, d, e}), cut off from the two old ones, commits with d alone
    while those two elect one of themselves without its entries.  The checks catch it;
    change_members refuses it."""
    c = Cluster(seed, ABC, loss=0.0)
    c.add_node("d", Members(ABC, ("d", "e")))
    c.add_node("e", Members(ABC, ("d", "e")))
    change(c, Members(ABC, ("d", "e")))
    caught_up(c, "d")
    caught_up(c, "e")
    lead = active(c)
    r = c.nodes[lead]
    assert r is not None
    old = [n for n in ABC if n != lead]
    swapped = Members((lead, "d", "e"), tuple(old))
    with pytest.raises(MembershipRefused, match="one node at a time"):
        r.change_members(swapped)
    for o in old:
        for x in (lead, "d", "e"):
            c.cut.add(frozenset((o, x)))
    c.handle(lead, r._append_change(swapped)[0])  # without change_members' checks
    with pytest.raises(SafetyViolation, match="lacks confirmed entry"):
        for i in range(1000):
            c.step()
            if i % 5 == 0:
                c.write()


def test_a_change_that_is_truncated_is_undone() -> None:
    """The active appends a change and is cut off before anyone has it; the others elect
    another active, which writes on; back, the old active's change is truncated and it uses
    the members before it again."""
    c = Cluster(3, ABC, loss=0.0)
    lead = active(c)
    others = [n for n in ABC if n != lead]
    for o in others:
        c.cut.add(frozenset((lead, o)))
    r = c.nodes[lead]
    assert r is not None
    c.add_node("d", Members(ABC, ("d",)))
    c.cut.add(frozenset((lead, "d")))
    ready, entry = r.change_members(Members(ABC, ("d",)))
    c.handle(lead, ready)
    assert r.members == Members(ABC, ("d",))
    settle(c, 3)
    new = c.leader()
    assert new in others
    c.write()
    settle(c, 0.5)
    c.cut.clear()
    settle(c, 3, writes=0.2)
    old = c.nodes[lead]
    assert old is not None
    assert old.members == Members(ABC), old.members
    assert old.last_index < entry.index or old.entry(entry.index).data != entry.data


@pytest.mark.parametrize("seed", range(3))
def test_a_replica_that_missed_a_change_gets_it_in_a_snapshot(seed: int) -> None:
    c = Cluster(seed, ABC, loss=0.0, compaction=0.05)
    lead = active(c)
    late = next(n for n in ABC if n != lead)
    c.crash(late)
    c.add_node("d", Members(ABC, ("d",)))
    change(c, Members(ABC, ("d",)))
    caught_up(c, "d")
    settle(c, 3, writes=0.5)  # compaction takes the change out of the others' logs
    r = c.nodes[c.leader() or lead]
    assert r is not None and r.snap_index > 0
    c.start(late)
    settle(c, 4, writes=0.2)
    back = c.nodes[late]
    assert back is not None
    assert back.members == Members(ABC, ("d",)), back.members
    assert c.snapshots > 0


def test_a_restart_takes_the_members_from_its_log_over_its_snapshots() -> None:
    c = Cluster(5, ABC, loss=0.0)
    c.add_node("d", Members(ABC, ("d",)))
    change(c, Members(ABC, ("d",)))
    settle(c, 1)  # every replica has the change
    for n in ABC:
        c.crash(n)
        c.start(n)
        r = c.nodes[n]
        assert r is not None and r.members == Members(ABC, ("d",)) and r.snapshot_members == Members(ABC)


@pytest.mark.parametrize("chunk", range(2))
def test_random_schedules_of_adds_and_removes_keep_every_confirmed_entry(chunk: int) -> None:
    """Voters a, b, c; d and e come in as learners, are promoted one at a time, and a, then b
    leave (whichever active is there proposes the next step when it can, refused steps are
    tried again), with loss, reordering, crashes and restarts, cuts and compaction."""
    plan = [Members(ABC, ("d",)), Members(("a", "b", "c", "d")), Members(("a", "b", "c", "d"), ("e",)),
            Members(("a", "b", "c", "d", "e")), Members(("b", "c", "d", "e")), Members(("c", "d", "e"))]
    for seed in range(chunk * 6, chunk * 6 + 6):
        c = Cluster(seed, ABC, loss=0.05, compaction=0.01)
        rng = c.rng
        step_no = 0
        for step in range(3000):
            c.step()
            if rng.random() < 0.3:
                c.write()
            if step % 50 == 0 and step_no < len(plan):
                target = plan[step_no]
                for n in target.voters + target.learners:
                    if n not in c.stable:
                        c.add_node(n, target)
                lead = c.leader()
                r = c.nodes[lead] if lead is not None else None
                if r is not None and r.members == target:
                    if r.members_at(r.commit) == target:
                        step_no += 1  # (committed: the next step)
                elif r is not None and step_no and r.members != plan[step_no - 1]:
                    pass  # the active has not got the previous step yet (it is new): wait
                elif r is not None:
                    try:
                        c.handle(lead, r.change_members(target)[0])  # type: ignore[arg-type]
                    except MembershipRefused:
                        pass  # not now (a new voter not caught up, the last step not committed): later
            if step % 200 == 100:
                down = rng.choice(sorted(c.stable))
                if c.nodes.get(down) is not None and rng.random() < 0.5:
                    c.crash(down)
                else:
                    c.cut = {frozenset((down, rng.choice(sorted(c.stable))))} if rng.random() < 0.5 else set()
            if step % 200 == 150:
                for n, r in list(c.nodes.items()):
                    if r is None:
                        c.start(n)
        c.cut.clear()
        for n, r in list(c.nodes.items()):
            if r is None:
                c.start(n)
        settle(c, 5, writes=0.1)
        final = plan[step_no - 1] if step_no else Members(ABC)
        assert step_no >= 3, f"seed {seed}: only {step_no} of {len(plan)} steps done"
        for n in final.voters:
            r = c.nodes[n]
            assert r is not None and r.members == final, (seed, n, r.members if r else None, final)
