"""A replica that comes back without entries it had acknowledged (its disk answered fsyncs
without syncing, or its data directory was restored from an older copy): its active names it
(``ReplicaWentBack``), stops counting those entries as on it, and sends them again."""

from __future__ import annotations

from tests.ha.sim import Cluster

NODES = ("a", "b", "c")


def _run(c: Cluster, until: object, steps: int = 3000) -> None:
    for _ in range(steps):
        if until():  # type: ignore[operator]
            return
        c.step()
    raise AssertionError("not reached in time")


def _caught_up(c: Cluster, n: str) -> bool:
    leader = c.leader()
    return leader is not None and c.stable[n].last() == c.stable[leader].last() and c.stable[n].last() > 1


def _restart(c: Cluster, n: str, lose: int, down: float = 0.0) -> None:
    """Crash ``n`` and start it again ``down`` seconds later with the last ``lose`` entries of
    its log gone."""
    c.crash(n)
    for _ in range(int(down / 0.01)):
        c.step()
    st = c.stable[n]
    st.log = st.log[:len(st.log) - lose]
    st.commit = min(st.commit, st.last())
    st.state = [s for s in st.state if s[0] <= st.last()]
    c.start(n)


def test_a_replica_that_lost_acknowledged_entries_is_named_and_caught_up() -> None:
    c = Cluster(3, NODES, loss=0.0)
    _run(c, lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    quiet, victim = [n for n in NODES if n != leader]
    for _ in range(30):
        c.write()
        c.step()
    _run(c, lambda: _caught_up(c, victim) and _caught_up(c, quiet))
    had = c.stable[victim].last()
    _restart(c, quiet, lose=0, down=2.0)  # an ordinary restart: nothing lost, nothing to say
    _restart(c, victim, lose=10, down=2.0)
    _run(c, lambda: _caught_up(c, victim) and _caught_up(c, quiet) and bool(c.went_back))
    assert c.leader() == leader, "the active changed: its count of what the replica held went with it"
    [ev] = c.went_back
    assert (ev.node, ev.replica, ev.ends) == (leader, victim, had - 10) and ev.acknowledged > ev.ends, ev
    assert c.stable[victim].last() >= had  # sent again


def test_no_word_of_it_when_every_replica_keeps_what_it_acknowledged() -> None:
    c = Cluster(4, NODES, loss=0.05)
    down: dict[str, int] = {}  # crashed node -> steps until its start
    for _ in range(6000):
        if c.rng.random() < 0.3:
            c.write()
        if c.rng.random() < 0.002 and not down:
            n = c.rng.choice(NODES)
            c.crash(n)
            down[n] = c.rng.choice((0, 50, 150, 300))  # (0 to 3 s down: an election timeout is 1 s)
        for n in list(down):
            down[n] -= 1
            if down[n] < 0:
                del down[n]
                c.start(n)
        c.step()
    assert c.writes > 100 and c.went_back == [], c.went_back
