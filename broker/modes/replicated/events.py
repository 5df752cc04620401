"""What happened to this node's partitions: role changes (and this node starting or
stopping to serve), hand-overs and HA-1014, logged, kept as :class:`HaEvent` (the last
MAX_EVENTS, for ``tandem status`` and the console) and counted (metrics).

HA-1014: entries this node held and the group discarded (a weak override's writes, or
writes the nodes that acknowledged them lost) are counted, with how many of them this node
had confirmed; their messages go to the quarantine queue (broker.partitions.quarantine).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from broker.modes.replicated.apply import messages_in
from broker.modes.replicated.host import Quarantine
from broker.modes.replicated.partlog import PartLog
from broker.modes.replicated.serving import Serving
from broker.peers.codec import CATALOGUE, MalformedReplicationError, decode_ops
from client.clock import Clock
from ha.members import is_change
from ha.messages import EntriesDiscarded, HandingOver, ReplicaWentBack, RoleChanged
from storage.base import WriteOp

log = logging.getLogger("tandem.ha")

MAX_EVENTS = 200
#: election timeouts a recovering member goes without an active before it says why it cannot help
REPAIR_WAIT = 10


@dataclass(frozen=True, slots=True)
class HaEvent:
    at: float
    kind: str  # role, failback, drain, HA-1014
    partition: str
    text: str


def discarded_text(ev: EntriesDiscarded, messages: int, lost_messages: int) -> str:
    """What HA-1014 says of ``ev``: how many entries (and messages) went, how many of them
    had been confirmed (lost), and an override only where one wrote them."""
    text = f"{ev.count} entries ({messages} messages) from index {ev.first_index} discarded in term {ev.term}: "
    if not ev.committed:
        return text + "none of them was confirmed by this node (it never counted them as committed)"
    if ev.upto:
        text += (f"up to {ev.committed} of them ({lost_messages} messages) had been confirmed (confirmed and "
                 f"lost; {ev.certain} for certain: a snapshot replaced them and does not say which of the others "
                 f"it holds)")
    else:
        text += f"{ev.committed} of them ({lost_messages} messages) had been confirmed (confirmed and lost)"
    if ev.compacted:
        text += ("; the first of them was the last entry this node had compacted, and the group's log differs "
                 "there: more entries before it went too, uncounted and not kept (written under a weak override "
                 "past what a node keeps of such writes in its log, twice weak_hold_bytes, or confirmed by a "
                 "majority that lost them); the partition is rebuilt from the active")
    elif ev.weak:
        text += f"; {ev.weak} of those were written by an active under a weak override"
    else:
        text += (f"; {'where lost, ' if ev.upto else ''}the nodes that had acknowledged them lost them "
                 f"(unsynced writes lost to a crash?) and elected an active without them")
    if ev.count > ev.committed:
        text += (f"; the other {ev.count - ev.committed} were not known here as committed (its log records "
                 f"what it knew committed with each append: the last entries before a crash may have been "
                 f"confirmed all the same)")
    return text


class EventLog:
    """This node's HA events and counts; ``roles`` starts and stops this node serving a
    partition as its role changes; ``quarantine`` keeps what HA-1014 discards."""

    def __init__(self, me: str, clock: Clock, roles: Serving, quarantine: Quarantine) -> None:
        self.me = me
        self._clock = clock
        self._roles = roles
        self._quarantine = quarantine
        self.events: deque[HaEvent] = deque(maxlen=MAX_EVENTS)
        self.discarded_total = 0
        self.discarded_messages = 0  # messages in those entries
        #: of those, entries (and their messages) this node had counted as committed: confirmed
        #: writes lost (at most that many where a snapshot replaced them, see EntriesDiscarded)
        self.confirmed_lost = 0
        self.confirmed_lost_messages = 0
        self.elections = 0  # times this node became active for a partition (metrics)
        #: per recovering partition with no active: since when (None: said already)
        self._waiting: dict[tuple[int, int], float | None] = {}

    def record(self, kind: str, partition: str, text: str) -> None:
        self.events.append(HaEvent(self._clock.time(), kind, partition, text))

    def on(self, plog: PartLog, ev: RoleChanged | EntriesDiscarded | HandingOver | ReplicaWentBack) -> None:
        """An event of a Ready of ``plog``'s core: logged, recorded; a role change acted on."""
        if isinstance(ev, HandingOver):
            self.handing_over(plog, ev)
        elif isinstance(ev, ReplicaWentBack):
            self.went_back(plog, ev)
        elif isinstance(ev, RoleChanged):
            self.role_changed(plog, ev)
        else:
            self.discarded(plog, ev)

    def handing_over(self, plog: PartLog, ev: HandingOver) -> None:
        """The active hands the partition to another node: drained, or failback."""
        if ev.drained:
            log.warning("partition %s on %s: drain: this node is drained, handing the partition to %s (term %d; "
                        "writes wait until it has taken over, or given up after an election timeout)", plog.name,
                        self.me, ev.to, ev.term)
            self.record("drain", plog.name, f"{self.me}: drained, handing over to {ev.to} in term {ev.term}")
            return
        log.warning("partition %s on %s: failback: handing it to %s, its placement's choice, back and "
                    "answering (term %d; writes wait until it has taken over, or given up after an "
                    "election timeout)", plog.name, self.me, ev.to, ev.term)
        self.record("failback", plog.name, f"{self.me}: handing over to {ev.to} in term {ev.term}")

    def went_back(self, plog: PartLog, ev: ReplicaWentBack) -> None:
        """A replica lost entries it had acknowledged: said once per answer that shows it."""
        text = (f"{ev.replica}'s log ends at {ev.ends}, but it had acknowledged {ev.acknowledged} in term {ev.term}: "
                f"it lost entries it had written (a disk that answered an fsync without syncing, or a data "
                f"directory restored from an older copy); {self.me} no longer counts them as on it and sends "
                f"them again")
        log.error("partition %s on %s: %s", plog.name, self.me, text)
        self.record("replica-went-back", plog.name, f"{self.me}: {text}")

    def watch_repairs(self, logs: Iterable[PartLog], now: float) -> None:
        """A partition this node is recovering (its log found damaged at start, or its state
        rebuilt empty) neither votes nor stands here until an active has repaired it: this node
        may have acknowledged entries no other holds.  When no active has appeared for
        REPAIR_WAIT election timeouts, that is said once, at ERROR and in the events: the
        partition waits for a majority of its voters undamaged and up, which no timer can replace."""
        waiting: dict[tuple[int, int], float | None] = {}  # (a partition dropped meanwhile leaves it)
        for plog in logs:
            r = plog.replica
            if not r.recovering or r.leader is not None:
                continue
            since = waiting[plog.key] = self._waiting.get(plog.key, now)
            if since is None or now - since < REPAIR_WAIT * r.cfg.election_timeout:
                continue
            waiting[plog.key] = None
            text = (f"no active for {now - since:.0f} s, and {self.me} cannot help elect one: its copy was found "
                    f"damaged or lost at start, so it neither votes nor stands until an active has repaired it "
                    f"(it may have acknowledged entries no other node holds); the partition waits for a majority "
                    f"of its voters {', '.join(r.cfg.voters)} up with undamaged logs. Where no such majority "
                    f"exists, no good copy is known: restore the damaged nodes' data (docs/reliability.md)")
            log.error("partition %s on %s: %s", plog.name, self.me, text)
            self.record("waiting-for-repair", plog.name, f"{self.me}: {text}")
        self._waiting = waiting

    def role_changed(self, plog: PartLog, ev: RoleChanged) -> None:
        """This node's role in the partition changed: logged, and recorded where the active
        changes.  A new active serves from its no-op on (serving.py); one that is no longer
        active stops serving."""
        level = logging.WARNING if ev.old == "active" or ev.new == "active" else logging.DEBUG
        log.log(level, "partition %s on %s: %s -> %s in term %d (%s)", plog.name, self.me, ev.old, ev.new,
                ev.term, ev.reason)
        if ev.new == "active" or ev.old == "active":
            self.record("role", plog.name, f"{self.me}: {ev.old} -> {ev.new} in term {ev.term} ({ev.reason})")
        if ev.new == "active":
            self.elections += 1
            plog.serve_from = plog.replica.last_index  # its no-op
            plog.serve_term = ev.term
        elif ev.old == "active":
            self._roles.stop(plog, f"partition {plog.name} is no longer active on {self.me} ({ev.reason})")
        self._roles.notify()

    def discarded(self, plog: PartLog, ev: EntriesDiscarded) -> None:
        """HA-1014: counted, logged, recorded; the messages of a queue's entries kept in the
        quarantine queue."""
        self.discarded_total += ev.count
        lost_messages = messages_in(plog.key, ev.payloads[:ev.committed])
        messages = lost_messages + messages_in(plog.key, ev.payloads[ev.committed:])
        self.discarded_messages += messages
        self.confirmed_lost += ev.committed
        self.confirmed_lost_messages += lost_messages
        text = discarded_text(ev, messages, lost_messages)
        if plog.key != CATALOGUE and messages:
            entries: list[list[WriteOp]] = []
            for data in ev.payloads:
                try:
                    entries.append(decode_ops(plog.key, data) if data is not None and not is_change(data) else [])
                except MalformedReplicationError:
                    entries.append([])  # (counted as undecodable already, messages_in)
            kept = self._quarantine.keep(plog.key, ev.term, ev.first_index, entries, ev.committed, ev.written)
            text += f"; {kept} message(s) kept in the quarantine queue (tandem restore)"
        log.error("HA-1014 partition %s on %s: %s", plog.name, self.me, text)
        self.record("HA-1014", plog.name, f"{self.me}: {text}")
