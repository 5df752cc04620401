"""What an active knows of each other member of its partition, within its term: how far
its log goes, when it last answered, and the counts elections and commits are decided by."""

from __future__ import annotations

from dataclasses import dataclass, field

from ha.messages import AppendReply

NEVER = -1e18  # a time before any other


@dataclass(slots=True)
class PeerTracker:
    """Per member (learners included): the next index to send (``next``), the last index
    known to be on it (``match``), when it last answered (``heard``: any reply or
    :class:`~ha.messages.Alive`; ``acked``: a successful append reply), since when it has
    answered without a gap (``live_since``, what failback waits on), and when it was
    last sent a snapshot."""

    next: dict[str, int] = field(default_factory=dict)
    match: dict[str, int] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    live_since: dict[str, float] = field(default_factory=dict)
    snapshot_sent: dict[str, float] = field(default_factory=dict)

    @classmethod
    def elected(cls, peers: list[str], last_index: int, now: float) -> PeerTracker:
        """A new active's view: every member may have all but its no-op, and counts as
        heard at the election (a grace period for the check of quorum)."""
        return cls(next={p: last_index + 1 for p in peers}, match={p: 0 for p in peers},
                   heard={p: now for p in peers})

    def record_reply(self, m: AppendReply, now: float, election_timeout: float) -> int | None:
        """An append reply of this term: move the member's next and match indexes.  A refusal
        whose hint (the member's last index) is below its match takes the match back to the
        hint.  It is a replica that lost entries it had acknowledged when the replica had been
        silent for an election timeout before it (down, then back: no reply of its earlier run
        can arrive this late); then what it had acknowledged is returned (None otherwise)."""
        r = m.replica
        went_back = None
        silent = now - self.heard.get(r, NEVER) > election_timeout
        self.heard[r] = now
        if m.success:
            if now - self.acked.get(r, NEVER) > election_timeout:
                self.live_since[r] = now  # back (or new): failback counts from here
            self.acked[r] = now
            if m.match_index > self.match.get(r, 0):
                self.match[r] = m.match_index
            self.next[r] = max(self.next.get(r, 1), m.match_index + 1)
        else:
            if m.match_index < self.match.get(r, 0):
                if silent:
                    went_back = self.match[r]
                self.match[r] = m.match_index
            self.next[r] = max(1, min(self.next.get(r, 1) - 1, m.match_index + 1))
        return went_back

    def snapshot_due(self, peer: str, now: float, election_timeout: float) -> bool:
        """Whether to send ``peer`` a snapshot now (at most one per election timeout in
        flight); records the send."""
        if now - self.snapshot_sent.get(peer, NEVER) >= election_timeout:
            self.snapshot_sent[peer] = now
            return True
        return False

    def live_match(self, me: str, now: float, election_timeout: float) -> int | None:
        """The lowest match among the other members that acknowledged an append within
        the election timeout; None if there is none."""
        live = [self.match.get(n, 0) for n, t in self.acked.items() if n != me and now - t <= election_timeout]
        return min(live) if live else None

    def heard_voters(self, voters: tuple[str, ...], me: str, now: float, election_timeout: float) -> int:
        """Voters (``me`` included) heard from within the election timeout."""
        return 1 + sum(1 for v in voters if v != me and now - self.heard.get(v, NEVER) < election_timeout)

    def acked_voters(self, voters: tuple[str, ...], me: str, now: float, election_timeout: float) -> int:
        """Voters (``me`` included) whose last successful reply is within the election timeout."""
        return 1 + sum(1 for v in voters if v != me and now - self.acked.get(v, NEVER) < election_timeout)

    def holding(self, voters: tuple[str, ...], me: str, persisted: int, index: int) -> int:
        """Voters that have ``index`` on disk (``me``: as far as ``persisted``)."""
        return sum(1 for v in voters if (persisted if v == me else self.match.get(v, 0)) >= index)
