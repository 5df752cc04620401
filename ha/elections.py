"""The rules of elections, pure: how long a replica waits for word from an active before
it stands, and how a voter answers a candidate's :class:`~ha.messages.RequestVote`
(Raft's vote rule with priorities; the replica acts on the :class:`Ballot`), real or a
pre-vote (:func:`pre_ballot`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from enum import Enum

from ha.messages import RequestVote
from ha.replica_config import ReplicaConfig


def election_wait(cfg: ReplicaConfig, deferring: bool, rng: random.Random) -> float:
    """How long to wait for an active before standing: random, so that rivals part.
    Higher priority -> shorter waits, so the preferred node usually stands first; a node
    that just failed to win (``deferring``) waits like everyone else, so it cannot starve
    the others."""
    spread = 0.5 if deferring else 0.5 * (8 - min(7, max(2, cfg.rank(cfg.node)))) / 6
    return cfg.election_timeout * (1.0 + rng.random() * spread)


def first_election_at(cfg: ReplicaConfig, now: float, wait: float, fresh: bool, rng: random.Random) -> float:
    """When a replica that starts at ``now`` stands if it hears of no active (``wait``: its
    ``election_wait``); ``fresh``: it has no term, no log and lost no state."""
    if cfg.voters == (cfg.node,):
        # the only voter (a group of one node, or a partition whose others are learners): no
        # other node can be or become active, so there is none to wait for
        return now
    if cfg.preferred is not None and cfg.preferred != cfg.node:
        # the first election of a new partition: let the placement's choice stand first
        return now + wait + cfg.election_timeout / 2
    if cfg.preferred == cfg.node and fresh and cfg.quorum() > 1:
        # A partition that never had an active (a new queue's): there is none to wait
        # for, so the placement's choice stands within a heartbeat or two.  Its head
        # start over the others (1.5-2 timeouts) then outlasts the time the members take
        # to learn of the queue (up to a heartbeat each): the head start alone does not,
        # and new queues' actives would spread unevenly (docs/replication.md).  Not where
        # one vote elects (an override, a designated primary): a node that lost its
        # store, or was down when the queue was made, looks new too, and must first hear
        # of the active it does not know.
        return now + cfg.heartbeat_interval * (1.0 + rng.random())
    return now + wait


class Ballot(Enum):
    GRANT = "grant"
    REFUSE = "refuse"
    #: as recent and preferred: refuse, and stand at the next tick
    REFUSE_AND_STAND = "refuse_and_stand"
    #: the candidate's log is behind ours: refuse, and stand soon rather than wait out our timer
    STAND_EARLY = "stand_early"


@dataclass(frozen=True, slots=True)
class Voter:
    """What the answer depends on, on the voter's side."""

    term: int
    voted_for: str | None
    may_vote: bool  # a voter, and not recovering
    recency: tuple[int, int]  # (term, index) of its last strong entry
    rank: int  # ReplicaConfig.rank of this node
    deferring: bool  # not pressing its priority for now (after a refusal or a lost election)
    follower: bool
    #: may stand early: it can stand at all, has not stood early within two election timeouts,
    #: and heard no active for a heartbeat short of an election timeout
    may_stand_early: bool


def ballot(v: Voter, m: RequestVote) -> Ballot:
    """The voter's answer; ``m.priority`` is the candidate's rank.

    A vote goes only to a candidate whose log is at least as recent.  Among logs as
    recent, a voter of higher rank refuses and stands itself, unless it is deferring: it
    then refuses only once per two election timeouts, so that if it cannot win (it may
    reach too few voters) the next candidate gets its vote, and a preference never blocks
    an election.

    A candidate whose log is behind cannot win with this vote, and its bid says the active
    is gone; this voter can win with the candidate's vote, so it stands early (with a
    little jitter, in case a peer as recent heard the same bid).  Not while an active was
    heard within a heartbeat of a timeout: then the bid says only that the candidate cannot
    hear (a one-way cut), the deposed active stands again by itself, and a second early
    candidate would split the vote with it.
    """
    if m.term != v.term or v.voted_for not in (None, m.candidate) or not v.may_vote:
        return Ballot.REFUSE
    theirs = (m.last_term, m.last_index)
    preferred = v.rank > m.priority and not v.deferring
    if theirs > v.recency or (theirs == v.recency and (not preferred or v.voted_for == m.candidate)):
        return Ballot.GRANT
    if theirs == v.recency and v.rank > m.priority and v.follower:
        return Ballot.REFUSE_AND_STAND
    if theirs < v.recency and v.may_stand_early:
        return Ballot.STAND_EARLY
    return Ballot.REFUSE


def pre_ballot(v: Voter, m: RequestVote, *, active_heard: bool) -> Ballot:
    """The voter's answer to a pre-vote (``m.pre``, Raft's thesis 9.6): would it vote for the
    candidate in ``m.term``?  As it would answer that vote (:func:`ballot`, priorities
    included; in a term after its own it has voted for no one yet), except that it refuses
    while it hears from an active (``active_heard``: a message from one within the election
    timeout, or it is active itself).  So a candidate that cannot hear the active (cut off,
    or back from a cut) raises no term and cannot depose an active the others still hear;
    where the active is gone, a quorum answers yes and the real election follows at once."""
    if active_heard or m.term < v.term:
        return Ballot.REFUSE
    if m.term > v.term:
        v = replace(v, term=m.term, voted_for=None)
    return ballot(v, m)
