"""Failback: the active hands its partition back to the placement's choice once that
node is back (Raft's leadership transfer).

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

    def start(self, cfg: ReplicaConfig, me: str, now: float, peers: PeerTracker, last_index: int,
              weak: bool) -> str | None:
        """The node to hand the partition to, if it is time: the placement's choice, back
        and answering without a gap for ``failback_after`` (longer for a node that keeps
        leaving), not yet asked since it came back, answering now, and nearly caught up."""
        to = cfg.preferred
        if (to is None or to == me or to not in cfg.voters or weak
                or cfg.quorum_override is not None or cfg.designated_primary is not None):
            return None  # (an operator's override or primary decides who may go on: not moved under it)
        since = peers.live_since.get(to)
        if since is None or now - since < cfg.failback_after:
            return None
        # A node that keeps leaving waits twice as long each time it was handed over in the
        # last ten minutes (at most 64 times): a flaky node does not drag the partition along.
        recent = [t for t in self.handovers.get(to, ()) if now - t < FAILBACK_MEMORY]
        self.handovers[to] = recent
        wait = cfg.failback_after * 2 ** min(6, len(recent))
        if (now - since < wait
                or self.handed.get(to, NEVER) >= since  # once each time it comes back: it may decline
                or now - peers.acked.get(to, NEVER) > 2 * cfg.heartbeat_interval
                or peers.match.get(to, 0) < last_index - cfg.max_append):
            return None
        self.handing_to = to
        self.handing_until = now + cfg.election_timeout  # to catch up, then again to take over
        self.handing_sent = False
        self.handed[to] = now
        recent.append(now)
        return to

    def caught_up(self, peers: PeerTracker, last_index: int, now: float, election_timeout: float) -> str | None:
        """The node to tell to stand now: the one handed to, once it has every entry."""
        to = self.handing_to
        if to is None or self.handing_sent or peers.match.get(to, 0) != last_index:
            return None
        self.handing_sent = True
        self.timeout_now_at = now
        self.handing_until = now + election_timeout
        return to
