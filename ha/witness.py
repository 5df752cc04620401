"""The rules of a witness: a voter of a partition's log that holds no data
(``ReplicaConfig.witnesses``; the process is ``tandem witness start``).  Pure.

A two-node group's witness is the third vote that makes a majority with either data
node.  It is shown entry *positions* (index, term, origin, weak), never data, so it can
judge a candidate's recency (Raft's vote rule) and nothing else; it never stands.

* **When its acknowledgement counts** (:func:`counts`): only while no other data voter
  is in sync.  So while the other data node answers, every commit is on both data nodes,
  and the witness is sent positions only up to the commit index (its log is never ahead
  of that node's): whichever data node dies, the other has every confirmed entry and the
  witness's vote elects it.  Once the other is silent (or behind, catching up), the
  witness makes the majority: the entries are on the active's disk alone, and the
  witness's positions, ahead of the other node's log, stop that node from winning an
  election without them.  The rule only ever asks for more than a majority, never less:
  Raft's safety holds as it is.
* **Whose term it takes up** (:func:`ignores_term`): a witness that hears from an active
  refuses a candidate whose log is behind its positions without taking up the
  candidate's term.  That candidate could not win; its term, carried to the active in
  the witness's replies, would depose the active for nothing, once every election
  timeout (a data node cut off from the active, and only from it, stands again and
  again).  Refusing a vote is always safe.
* **Whom it tells** (:func:`tells_deposed`): granting a vote in a higher term, a witness
  tells the active it was following at once (a reply in the new term, which makes it
  step down), not at that active's next heartbeat: the old active stops serving about
  when the new one is elected, before the new one has committed its first entry.
"""

from __future__ import annotations

from collections.abc import Mapping

from ha.members import is_change
from ha.messages import Entry, RequestVote
from ha.progress import NEVER, PeerTracker
from ha.replica_config import ReplicaConfig


def counts(cfg: ReplicaConfig, me: str, now: float, heard_from: Mapping[str, float], tracker: PeerTracker,
           commit: int) -> bool:
    """On the active ``me``: whether a witness's acknowledgement counts toward a commit now.
    A data voter is in sync while it has sent anything within the election timeout and
    either holds every committed entry or has not yet answered an append in this term."""
    for v in cfg.voters:
        if v == me or v in cfg.witnesses:
            continue
        if now - heard_from.get(v, NEVER) >= cfg.election_timeout:
            continue  # silent: down, or cut off from this node
        if v not in tracker.acked or tracker.match.get(v, 0) >= commit:
            return False
    return True


def positions(entries: list[Entry]) -> tuple[Entry, ...]:
    """What a witness is sent of ``entries``: their positions, without data (but a membership
    change's: it is a voter, and must know the voters)."""
    return tuple(Entry(e.term, e.index, e.data if is_change(e.data) else None, e.origin, e.weak) for e in entries)


def ignores_term(cfg: ReplicaConfig, me: str, m: RequestVote, *, term: int, active_heard: bool,
                 recency: tuple[int, int]) -> bool:
    """Whether witness ``me`` (of ``term``, whose log's recency is ``recency``, and which
    heard from an active within the election timeout: ``active_heard``) refuses ``m``
    without taking up its term."""
    return (me in cfg.witnesses and m.term > term and active_heard
            and (m.last_term, m.last_index) < recency)


def tells_deposed(cfg: ReplicaConfig, me: str, deposed: str, candidate: str) -> bool:
    """Whether witness ``me``, granting ``candidate`` its vote in a term after that of the
    active ``deposed`` it followed, tells ``deposed`` at once."""
    return me in cfg.witnesses and deposed not in (me, candidate)
