"""What a drill measures once a fault family's fault is healed: how long until every node
reports every peer Up again (``heal_up_ms``), and whether the return of the nodes it cut off
deposed a healthy active (``deposed``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from client.clock import Clock
from client.errors import UnavailableError
from client.protocol.frames import StatusOk

#: after every peer is Up, how long (in election timeouts' worth of ``non_response_timeout``)
#: the drill keeps looking for a deposition: a returning node with a higher term disrupts the
#: active as soon as its links are back, within an election timeout (1-1.5 x the timeout)
WATCH_FACTOR = 3.0


def serving_terms(statuses: list[tuple[str, StatusOk]], queue: str) -> dict[int, tuple[str, int]]:
    """partition -> (node, term) of the node that says it is active for it in the highest
    term (a cut-off old active may still say so in its older term)."""
    out: dict[int, tuple[str, int]] = {}
    for name, st in statuses:
        for part in st.partitions:
            if part.queue == queue and part.role == "active" and part.active == name and \
                    (part.partition not in out or part.term > out[part.partition][1]):
                out[part.partition] = (name, part.term)
    return out


def failback_events(statuses: list[tuple[str, StatusOk]], queue: str) -> set[str]:
    """The ``failback`` events (an active handing its partition to its placed node) of ``queue``."""
    return {e for _n, st in statuses for e in st.events if e.startswith(f"failback {queue}/")}


def _partition_of(event: str) -> int:
    m = re.match(r"failback [^/]*/(\d+):", event)
    return int(m.group(1)) if m else -1


def peers_down(statuses: list[tuple[str, StatusOk]], nodes: list[str]) -> list[str]:
    """``"node: peer State"`` for every link not Up (a node that did not answer: ``"node: no status"``)."""
    seen = dict(statuses)
    out = []
    for n in nodes:
        st = seen.get(n)
        if st is None:
            out.append(f"{n}: no status")
            continue
        states = {r.name: r.state for r in st.remotes}
        out += [f"{n}: {p} {states.get(p, 'unknown')}" for p in nodes if p != n and states.get(p) != "Up"]
    return out


@dataclass(slots=True)
class HealWatch:
    """Taken just before the heal: the healthy actives (on nodes the fault never cut) and the
    failbacks so far; then the times of the heal and of every peer being Up again."""

    queue: str
    healthy: dict[int, tuple[str, int]]
    failbacks: set[str]
    healed_at: float = 0.0
    up_at: float | None = None
    seen: dict[int, set[tuple[str, int]]] = field(default_factory=dict)

    @classmethod
    async def before_heal(cls, cl: Any, queue: str, cut: frozenset[str]) -> HealWatch:
        statuses = await cl._statuses()
        healthy = {p: at for p, at in serving_terms(statuses, queue).items() if at[0] not in cut}
        return cls(queue, healthy, failback_events(statuses, queue))

    @property
    def heal_up_ms(self) -> float | None:
        return None if self.up_at is None else round((self.up_at - self.healed_at) * 1000, 1)

    async def wait_up(self, cl: Any, deadline: float, clock: Clock) -> None:
        """Until every node reports every peer Up (polling their statuses; the clients are
        never cut), noting where each healthy partition's active is along the way."""
        nodes = sorted(cl.nodes)
        while True:
            statuses = await cl._statuses()
            self._note(statuses)
            down = peers_down(statuses, nodes)
            if not down:
                self.up_at = clock.monotonic()
                return
            if clock.monotonic() > deadline:
                raise UnavailableError(f"after the heal, links still not Up at the run's deadline: {', '.join(down)}")
            await clock.sleep(0.05)  # polling real processes for a state, bounded by the deadline

    async def watch(self, cl: Any, until: float, clock: Clock) -> None:
        """Keep noting the actives until ``until`` (a deposition is something that must not
        happen: there is no state to wait for, only a window to look in)."""
        while clock.monotonic() < until:
            self._note(await cl._statuses())
            await clock.sleep(0.1)  # observing for a fixed window, see above

    def _note(self, statuses: list[tuple[str, StatusOk]]) -> None:
        for p, at in serving_terms(statuses, self.queue).items():
            self.seen.setdefault(p, set()).add(at)

    def deposed(self, statuses: list[tuple[str, StatusOk]]) -> dict[int, str]:
        """partition -> what happened to its healthy active after the heal (every (active,
        term) seen since differs from it), failbacks left out."""
        self._note(statuses)
        handed = {_partition_of(e) for e in failback_events(statuses, self.queue) - self.failbacks}
        out = {}
        for p, (node, term) in sorted(self.healthy.items()):
            if p in handed:
                continue
            other = sorted(at for at in self.seen.get(p, set()) if at != (node, term))
            if other:
                out[p] = f"{node} (term {term}) -> " + ", ".join(f"{n} (term {t})" for n, t in other)
        return out
