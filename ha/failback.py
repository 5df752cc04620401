"""Failback: the active hands its partition back to the placement's choice once that
node is back (Raft's leadership transfer); and the drain: an active on a drained node
(``tandem node drain``) hands its partition to a node that is not.

The active stops taking writes, brings the node up to its last entry, then tells it to
stand (:class:`~ha.messages.TimeoutNow`).  It does so once each time the node comes
back, and never under an override, a designated primary or as a weak active.  The node
takes over only if elections prefer it anyway (a higher rank than the active's, which the
message carries: an active knows only its own priority); if it declines, writes resume
after an election timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ha.progress import NEVER, PeerTracker
from ha.replica_config import ReplicaConfig

FAILBACK_MEMORY = 600.0  # seconds a hand-over to a node counts toward its next wait (Failback.start)
DRAIN_ASK_AGAIN = 4  # election timeouts before a drained active asks a node again (Failback._drain_to)


def _ready_for(cfg: ReplicaConfig, to: str, now: float, peers: PeerTracker, last_index: int) -> bool:
    """``to`` answers now (an append acknowledged within two heartbeats) and lacks at most
    one append's worth of entries: it can take over within a hold."""
    return (now - peers.acked.get(to, NEVER) <= 2 * cfg.heartbeat_interval
            and peers.match.get(to, 0) >= last_index - cfg.max_append)


@dataclass(slots=True)
class Failback:
    """The active's hand-over: to whom (no writes while set), until when it waits, whether
    the node was told to stand (and when), and the hand-overs made per node."""

    handing_to: str | None = None
    handing_until: float = 0.0
    handing_sent: bool = False
    timeout_now_at: float = NEVER  # when it last told a node to stand
    handed: dict[str, float] = field(default_factory=dict)  # when it last asked each node to take over
    handovers: dict[str, list[float]] = field(default_factory=dict)  # when it did, within FAILBACK_MEMORY
    declined: dict[str, int] = field(default_factory=dict)  # hand-overs each node did not take (a drain asks again)
    #: when the placement's choice last changed here (a drain or undrain): failback counts from
    #: then too, so the node has applied the change (and ranks as it says) when it is asked
    preferred_at: float = NEVER

    def start(self, cfg: ReplicaConfig, me: str, now: float, peers: PeerTracker, last_index: int,
              weak: bool) -> str | None:
        """The node to hand the partition to, if it is time: failback's (:meth:`_failback_to`)
        or, on a drained active, the drain's (:meth:`_drain_to`)."""
        if weak or cfg.quorum_override is not None or cfg.designated_primary is not None:
            return None  # (an operator's override or primary decides who may go on: not moved under it)
        to = self._drain_to(cfg, me, now, peers, last_index) if me in cfg.drained else \
            self._failback_to(cfg, me, now, peers, last_index)
        if to is None:
            return None
        self.handing_to = to
        self.handing_until = now + cfg.election_timeout  # to catch up, then again to take over
        self.handing_sent = False
        self.handed[to] = now
        self.handovers.setdefault(to, []).append(now)
        return to

    def _failback_to(self, cfg: ReplicaConfig, me: str, now: float, peers: PeerTracker,
                     last_index: int) -> str | None:
        """The placement's choice (the first node not drained), back and answering without a
        gap for ``failback_after`` (longer for a node that keeps leaving) and the choice here
        for as long (an undrain reaches each member a moment apart: asked at once, the node
        could still rank as drained and decline), not yet asked since then, answering now, and
        nearly caught up."""
        to = cfg.preferred
        if not cfg.failback_after or to is None or to == me or to not in cfg.voters or to in cfg.drained:
            return None
        since = peers.live_since.get(to)
        if since is None:
            return None
        since = max(since, self.preferred_at)
        if now - since < cfg.failback_after:
            return None
        # A node that keeps leaving waits twice as long each time it was handed over in the
        # last ten minutes (at most 64 times): a flaky node does not drag the partition along.
        recent = [t for t in self.handovers.get(to, ()) if now - t < FAILBACK_MEMORY]
        self.handovers[to] = recent
        wait = cfg.failback_after * 2 ** min(6, len(recent))
        if (now - since < wait
                or self.handed.get(to, NEVER) >= since  # once each time it comes back: it may decline
                or not _ready_for(cfg, to, now, peers, last_index)):
            return None
        return to

    def _drain_to(self, cfg: ReplicaConfig, me: str, now: float, peers: PeerTracker, last_index: int) -> str | None:
        """This active's node is drained: the first data voter that is not, answering now and
        nearly caught up; while the placement's choice (``cfg.preferred``) answers, only it
        (elections prefer it: it would refuse another's bid and stand).  A node that did not
        take over (a priority of 0, which only it knows) is asked again after DRAIN_ASK_AGAIN
        election timeouts, twice as long after each refusal (at most 64 times), so a drain
        holds the partition's writes rarely while no node will take it."""
        order = ([cfg.preferred] if cfg.preferred is not None else []) + list(cfg.voters)
        for to in dict.fromkeys(order):
            if to == me or to in cfg.drained or to in cfg.witnesses or to not in cfg.voters:
                continue
            if to != cfg.preferred and now - peers.acked.get(cfg.preferred or "", NEVER) <= cfg.election_timeout:
                return None  # the placement's choice answers: wait for it (it would refuse another's bid)
            wait = DRAIN_ASK_AGAIN * cfg.election_timeout * 2 ** min(6, self.declined.get(to, 0))
            if now - self.handed.get(to, NEVER) >= wait and _ready_for(cfg, to, now, peers, last_index):
                return to
        return None

    def gave_up(self) -> None:
        """The node handed to did not take over within the hold: counted (see :meth:`_drain_to`)."""
        if self.handing_to is not None:
            self.declined[self.handing_to] = self.declined.get(self.handing_to, 0) + 1
            self.handing_to = None

    def caught_up(self, peers: PeerTracker, last_index: int, now: float, election_timeout: float) -> str | None:
        """The node to tell to stand now: the one handed to, once it has every entry."""
        to = self.handing_to
        if to is None or self.handing_sent or peers.match.get(to, 0) != last_index:
            return None
        self.handing_sent = True
        self.timeout_now_at = now
        self.handing_until = now + election_timeout
        return to
